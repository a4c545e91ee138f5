"""`.mlpackage` files: loading, saving without losing anything of the package, and input specs."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from rewrite.backends.mil.pymil import (
    MilError,
    Program,
    ct,
    is_symbolic,
    mb,
    types,
)

# ---------------------------------------------------------------- files

_MANIFEST = "Manifest.json"
_WEIGHTS = "weights"  # beside the root model file, where "@model_path/weights/..." points


@dataclass(frozen=True, eq=False)
class MilSource:
    """Where a loaded program came from: what `save_mlpackage` keeps of it.

    `path` is the `.mlpackage` folder or `.mlmodel` file (absolute, as given:
    symlinks not resolved). `spec` is its model specification (`Model_pb2.Model`).
    `files` lists every file inside it (absolute, under `path`; folders not
    listed, a symlink listed as itself), so that a caller can make sure an
    output never overwrites one of them. `manifest` holds Manifest.json's bytes
    as read and `root_model` the root model file's path relative to `Data/`
    (both None for an `.mlmodel`).
    """

    path: Path
    spec: Any
    files: tuple[Path, ...]
    manifest: bytes | None = None
    root_model: str | None = None

    @property
    def package(self) -> bool:
        """Whether the source is an `.mlpackage` (rather than an `.mlmodel` file)."""
        return self.manifest is not None


@dataclass(frozen=True)
class _Package:
    """An `.mlpackage` read without changing a byte of it."""

    root: Path
    manifest: bytes
    entries: dict
    root_model: PurePosixPath  # relative to Data/
    files: tuple[Path, ...]
    folders: tuple[Path, ...]

    @property
    def model_file(self) -> Path:
        return self.root / "Data" / self.root_model

    @property
    def weights_dir(self) -> Path:
        return self.model_file.parent / _WEIGHTS


def load_mlpackage(path: str | os.PathLike) -> tuple[Program, MilSource]:
    """Read an `.mlpackage` (or an `.mlmodel` file) into a pymil Program, strictly read-only.

    Returns the program and a `MilSource` to pass to `save_mlpackage`, which
    keeps the deployment target, input shapes, model description and the
    package's other contents. Nothing of the input is written, not even
    Manifest.json (coremltools' ModelPackage rewrites it on opening, so it is
    not used). A missing or malformed model, a Manifest path or a symlink
    leading out of the package, raise `MilError` with a one-line message
    naming the file.
    """
    path = Path(path).absolute()
    if not path.exists():
        raise MilError(f"{path}: no such file or directory")
    if path.is_dir():
        package = _read_package(path)
        model_file, weights_dir, files = package.model_file, str(package.weights_dir), package.files
        manifest, root_model = package.manifest, str(package.root_model)
    else:
        model_file, weights_dir, files, manifest, root_model = path, "", (path,), None, None
    spec = _read_spec(model_file)
    from coremltools.converters.mil.frontend.milproto.load import load as milproto_load

    try:
        program = milproto_load(spec, spec.specificationVersion, file_weights_dir=weights_dir)
    except Exception as error:
        raise MilError(f"{model_file}: could not read its MIL program ({_first_line(error)})") from None
    _share_weights_across_functions(program, spec)
    return program, MilSource(path, spec, files, manifest, root_model)


def _share_weights_across_functions(program: Program, spec) -> None:
    """Mark consts that read one stored weight in several functions, as
    coremltools' save_multifunction does, so that saving writes it once.

    The milproto frontend gives each function its own const; a
    multifunction model (say, adapters over one base model) would otherwise
    come out with its shared weights once per function.
    """
    if len(spec.mlProgram.functions) < 2:
        return
    readers: dict[tuple, list[tuple[str, str]]] = {}
    for function_name, function in spec.mlProgram.functions.items():
        pending = list(function.block_specializations.values())
        while pending:
            for op in pending.pop().operations:
                pending.extend(op.blocks)
                value = op.attributes["val"] if op.type == "const" and "val" in op.attributes else None
                if value is not None and value.WhichOneof("value") == "blobFileValue" and op.outputs:
                    blob = (value.blobFileValue.fileName, value.blobFileValue.offset)
                    readers.setdefault(blob, []).append((function_name, op.outputs[0].name))
    shared = {
        reader: f"{name}:{offset}"
        for (name, offset), found in readers.items() if len({f for f, _ in found}) > 1
        for reader in found
    }
    if not shared:
        return
    for function_name, function in program.functions.items():
        pending = [function]
        while pending:
            for op in pending.pop().operations:
                pending.extend(op.blocks)
                weight = shared.get((function_name, op.outputs[0].name)) if op.op_type == "const" else None
                if weight is not None and op.weight_id is None:
                    op.weight_id = weight


def _read_package(root: Path) -> _Package:
    files, folders = _package_tree(root)
    manifest_file = root / _MANIFEST
    try:
        data = manifest_file.read_bytes()
    except FileNotFoundError:
        raise MilError(f"{manifest_file}: no such file (not a Core ML model package)") from None
    except OSError as error:
        raise MilError(f"{manifest_file}: not a Core ML model package ({error.strerror})") from None
    try:
        manifest = json.loads(data)
    except ValueError as error:  # also UnicodeDecodeError
        raise MilError(f"{manifest_file}: not a Core ML model package (invalid JSON: {error})") from None
    entries = manifest.get("itemInfoEntries") if isinstance(manifest, dict) else None
    identifier = manifest.get("rootModelIdentifier") if isinstance(manifest, dict) else None
    entry = entries.get(identifier) if isinstance(entries, dict) and isinstance(identifier, str) else None
    relative = entry.get("path") if isinstance(entry, dict) else None
    if not isinstance(relative, str) or not PurePosixPath(relative).parts:
        raise MilError(f"{manifest_file}: not a Core ML model package (no root model entry)")
    root_model = PurePosixPath(relative)
    if root_model.is_absolute() or ".." in root_model.parts or "\\" in relative or "\0" in relative:
        raise MilError(f"{manifest_file}: the root model path '{relative}' leads out of the package")
    return _Package(root, data, entries, root_model, files, folders)


def _package_tree(root: Path) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """Every file and folder under `root`, refusing what could read outside it."""
    inside = root.resolve()
    files, folders = [], []

    def fail(error: OSError):
        raise MilError(f"{error.filename}: cannot read it ({error.strerror})")

    for folder, subfolders, names in os.walk(root, onerror=fail):
        for name in sorted(subfolders + names):
            entry = Path(folder) / name
            try:
                mode = entry.lstat().st_mode
            except OSError as error:
                fail(error)
            if stat.S_ISLNK(mode):
                try:
                    target = entry.resolve(strict=True)
                except (OSError, RuntimeError):
                    raise MilError(f"{entry}: a symbolic link that leads nowhere") from None
                if not target.is_relative_to(inside):
                    raise MilError(f"{entry}: a symbolic link out of the package (to {target})")
                files.append(entry)
            elif stat.S_ISDIR(mode):
                folders.append(entry)
            elif stat.S_ISREG(mode):
                files.append(entry)
            else:
                raise MilError(f"{entry}: not a regular file")
    return tuple(files), tuple(folders)


def _read_spec(model_file: Path):
    try:
        data = model_file.read_bytes()
    except FileNotFoundError:
        raise MilError(f"{model_file}: no such file (the package's root model)") from None
    except OSError as error:
        raise MilError(f"{model_file}: cannot read it ({error.strerror})") from None
    spec = ct.proto.Model_pb2.Model()
    try:
        spec.ParseFromString(data)
    except Exception:
        raise MilError(f"{model_file}: not a Core ML model (corrupt model specification)") from None
    kind = spec.WhichOneof("Type")
    if kind != "mlProgram":
        what = f"it is a {kind} model" if kind else "no model type in it"
        raise MilError(f"{model_file}: not an ML program ({what})")
    return spec


def save_mlpackage(program: Program, path: str | os.PathLike, source: MilSource | None = None) -> None:
    """Write `program` as a complete `.mlpackage` at `path`, which must not exist yet.

    Runs none of coremltools' graph passes. With `source` (from
    `load_mlpackage`) the output is the source package with its model
    replaced: the deployment target, the input shapes (ranges with their
    defaults, enumerated shapes), all of the model description the program
    does not determine (metadata, feature descriptions, input and output
    types such as images) and every other item of the package (other
    Manifest entries and their files, custom Manifest keys) are kept, and
    Manifest.json stays byte-identical unless a weights entry has to be
    added. The source is only read.

    `program` may be modified: coremltools' backend passes (which e.g. fuse
    x * sigmoid(x) into silu and sanitise names) run on it in place. To keep
    it, save a `copy_program` of it (not a `copy.deepcopy`, which recurses
    along the use-def chain and fails past ~70-300 ops in a row).

    A `path` ending in `.mlmodel` gets a bare model file, which only a
    program without weight files fits in. Folders are created with mode
    0o777 and files with 0o666, less the umask. Anything that goes wrong
    raises `MilError` and leaves nothing at `path`.
    """
    path = Path(path).absolute()
    if os.path.lexists(path):
        raise MilError(f"{path}: already exists")
    spec = source.spec if source is not None else None
    _silence_pass_progress()
    if spec is not None:
        try:
            target = ct.target(spec.specificationVersion)
        except ValueError:
            raise MilError(f"{source.path}: specification version {spec.specificationVersion} "
                           f"is unknown to coremltools {ct.__version__}") from None
        inputs = input_types_of(spec, program)
        _keep_reads_back(program, spec)
        if spec.description.functions:
            # coremltools writes a multifunction model only when told to, and
            # takes input types for "main" alone; the function descriptions
            # are carried over after conversion.
            program.default_function_name = spec.description.defaultFunctionName
            program.export_as_multifunction = True
            inputs = None
    else:
        target = max((f.opset_version for f in program.functions.values()), default=None)
        inputs = _defaultinput_types_of(program)
    # Beside `path`, so that the weights move into place by a rename.
    try:
        scratch = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    except OSError as error:
        raise MilError(f"{path}: cannot write there ({error.strerror})") from None
    try:
        converted = scratch / "converted.mlpackage"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = ct.convert(
                    program,
                    convert_to="mlprogram",
                    pass_pipeline=ct.PassPipeline.EMPTY,
                    minimum_deployment_target=target,
                    inputs=inputs,
                    skip_model_load=True,
                    package_dir=str(converted),
                )
        except Exception as error:
            raise MilError(f"{path}: could not convert the program ({_first_line(error)})") from None
        built = _read_package(converted)
        # Not the package's model file: coremltools adds its build metadata
        # to the spec in memory only, after writing the package.
        new_spec = model.get_spec()
        if spec is not None:
            _keep_description(new_spec, spec)
        if path.suffix == ".mlmodel":
            _write_model_file(path, new_spec, built.weights_dir)
        else:
            template = _read_package(source.path) if source is not None and source.package else built
            _write_package(path, template, new_spec, built.weights_dir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _keep_reads_back(program: Program, spec) -> None:
    """Give back its own read_state to each read of a state that `spec` has
    right after a write, where the program no longer uses what it read.

    Loading merges a write_state and the read_state right after it into one
    coreml_update_state (coremltools' frontend does), and saving writes the
    read again only while that op's output is used. A rewrite that took the
    last use would so drop a read of the state from the package; whether
    Core ML accepts a state that no op reads cannot be checked off macOS, so
    the read stays, where it was.
    """
    from rewrite.backends.mil.editing import inherit_scopes

    for name, function in program.functions.items():
        reads = _read_state_outputs(spec, name)
        if not reads:
            continue
        pending = [function]
        while pending:
            block = pending.pop()
            operations = list(block.operations)
            for index, op in enumerate(operations):
                pending.extend(op.blocks)
                written = op.outputs[0] if op.op_type == "coreml_update_state" else None
                if written is None or written.name not in reads or written.child_ops or written.consuming_blocks:
                    continue
                read_name = written.name
                written.name = f"{read_name}__written"  # never saved: the write has no output in the package
                following = operations[index + 1] if index + 1 < len(operations) else None
                with block:
                    read = mb.read_state(input=op.state, before_op=following, name=read_name)
                inherit_scopes([read.op], op, None)


def _read_state_outputs(spec, function_name: str) -> set[str]:
    """The names of the values the read_state ops of a function of `spec` give, nested blocks included."""
    function = spec.mlProgram.functions.get(function_name)
    if function is None:
        return set()
    names: set[str] = set()
    pending = list(function.block_specializations.values())
    while pending:
        block = pending.pop()
        for operation in block.operations:
            if operation.type == "read_state":
                names.update(output.name for output in operation.outputs)
            pending.extend(operation.blocks)
    return names


def _write_model_file(path: Path, spec, weights_dir: Path) -> None:
    if weights_dir.is_dir() and any(weights_dir.iterdir()):
        raise MilError(f"{path}: a program with weight files can only be saved as an .mlpackage")
    try:
        file = open(path, "xb")
    except OSError as error:
        raise MilError(f"{path}: could not write it ({error})") from None
    try:
        with file:
            file.write(spec.SerializeToString())
    except BaseException as error:
        path.unlink()
        if isinstance(error, OSError):
            raise MilError(f"{path}: could not write it ({error})") from None
        raise


def _write_package(path: Path, template: _Package, spec, weights_dir: Path) -> None:
    """`template`'s tree with its root model file and weights folder replaced."""
    data = Path("Data")
    model_file = data / template.root_model
    weights = model_file.parent / _WEIGHTS
    has_weights = weights_dir.is_dir() and any(p.is_file() for p in weights_dir.rglob("*"))
    listed = any(
        isinstance(entry, dict) and isinstance(entry.get("path"), str)
        and PurePosixPath(entry["path"]) == PurePosixPath(weights.relative_to(data))
        for entry in template.entries.values()
    )
    try:
        os.mkdir(path)
    except OSError as error:
        raise MilError(f"{path}: could not write the package ({error})") from None
    try:
        # What mkdir made of 0o777 is 0o777 less the umask (asking the umask
        # itself means setting it, which races with other threads).
        folder_mode = stat.S_IMODE(path.stat().st_mode)
        for folder in template.folders:
            relative = folder.relative_to(template.root)
            if not relative.is_relative_to(weights):
                (path / relative).mkdir(parents=True, exist_ok=True)
        for file in template.files:
            relative = file.relative_to(template.root)
            if relative in (Path(_MANIFEST), model_file) or relative.is_relative_to(weights):
                continue
            (path / relative).parent.mkdir(parents=True, exist_ok=True)
            if file.is_dir():  # a symlink to a folder inside the package: copy what it holds
                shutil.copytree(file, path / relative)
            else:
                shutil.copyfile(file, path / relative)
        manifest = template.manifest
        if has_weights and not listed:
            manifest = _manifest_with_weights(manifest, weights.relative_to(data))
        (path / _MANIFEST).write_bytes(manifest)
        (path / model_file).parent.mkdir(parents=True, exist_ok=True)
        (path / model_file).write_bytes(spec.SerializeToString())
        if has_weights or listed:
            if weights_dir.is_dir():
                os.replace(weights_dir, path / weights)
            else:
                (path / weights).mkdir()
        # coremltools makes its folders with mkdtemp (0o700) and copies modes
        # along; the output should look like any other folder the user makes.
        for folder, _, names in os.walk(path):
            os.chmod(folder, folder_mode)
            for name in names:
                if not os.path.islink(os.path.join(folder, name)):
                    os.chmod(os.path.join(folder, name), folder_mode & 0o666)
    except BaseException as error:
        shutil.rmtree(path, ignore_errors=True)
        if isinstance(error, OSError):
            raise MilError(f"{path}: could not write the package ({error})") from None
        raise


def _manifest_with_weights(manifest: bytes, weights: PurePosixPath) -> bytes:
    document = json.loads(manifest)
    document["itemInfoEntries"][str(uuid.uuid4())] = {
        "author": "com.apple.CoreML",
        "description": "CoreML Model Weights",
        "name": _WEIGHTS,
        "path": weights.as_posix(),
    }
    return (json.dumps(document, indent=4) + "\n").encode()


def _keep_description(new, old) -> None:
    """Carry over into `new` what of `old`'s description the program does not determine."""
    description, original = new.description, old.description
    # coremltools' own keys (version, source "milinternal", date) describe
    # this save, not the model: the original's say where the model came from.
    if original.HasField("metadata"):
        description.metadata.CopyFrom(original.metadata)
    else:
        description.ClearField("metadata")
    _keep_interface(description, original)
    functions = {function.name: function for function in original.functions}
    for function in description.functions:
        if function.name in functions:
            _keep_interface(function, functions[function.name])
    # The program's functions come in the order of a protobuf map, which is none.
    order = {name: index for index, name in enumerate(functions)}
    ordered = sorted(description.functions, key=lambda f: order.get(f.name, len(order)))
    if [f.name for f in ordered] != [f.name for f in description.functions]:
        ordered = [type(f).FromString(f.SerializeToString()) for f in ordered]  # copies: clearing frees them
        del description.functions[:]
        description.functions.extend(ordered)
    if original.defaultFunctionName in {f.name for f in description.functions}:
        description.defaultFunctionName = original.defaultFunctionName
    if not description.trainingInput:
        description.trainingInput.extend(original.trainingInput)


def _keep_interface(new, old) -> None:
    """Feature descriptions (a ModelDescription's or FunctionDescription's) matched by name."""
    for field in ("input", "output", "state"):
        originals = {feature.name: feature for feature in getattr(old, field)}
        for feature in getattr(new, field):
            original = originals.get(feature.name)
            if original is None:
                continue
            feature.shortDescription = original.shortDescription
            # The program sees tensors only: what the description says beyond
            # that (an image, shape ranges and their defaults, optional inputs'
            # default values) is not in it to be derived again.
            if _fits(feature.type, original.type):
                feature.type.CopyFrom(original.type)
    outputs = {feature.name for feature in new.output}
    for field in ("predictedFeatureName", "predictedProbabilitiesName"):
        if getattr(old, field) in outputs and not getattr(new, field):
            setattr(new, field, getattr(old, field))


def _fits(new, old) -> bool:
    """Whether feature type `old` describes the same program value as `new` does."""
    kind, original_kind = new.WhichOneof("Type"), old.WhichOneof("Type")
    if original_kind == "imageType" and kind == "multiArrayType":
        array = new.multiArrayType
        return array.dataType in (array.FLOAT32, array.FLOAT16) and len(_array_ranges(array)) in (0, 4)
    if kind != original_kind:
        return False
    if kind == "stateType":
        new, old, kind = new.stateType, old.stateType, "arrayType"
    if kind not in ("multiArrayType", "arrayType"):
        return True
    new_array, old_array = getattr(new, kind), getattr(old, kind)
    if new_array.dataType != old_array.dataType:
        return False
    new_ranges, old_ranges = _array_ranges(new_array), _array_ranges(old_array)
    if not new_ranges or not old_ranges:
        return True
    return len(new_ranges) == len(old_ranges) and all(
        low != high or (old_low <= low and (old_high < 0 or low <= old_high))
        for (low, high), (old_low, old_high) in zip(new_ranges, old_ranges)
    )


def _array_ranges(array) -> list[tuple[int, int]]:
    """(lower, upper) per axis of an ArrayFeatureType; upper -1 is unbounded."""
    if array.shapeRange.sizeRanges:
        return [(int(r.lowerBound), int(r.upperBound)) for r in array.shapeRange.sizeRanges]
    if array.enumeratedShapes.shapes:
        shapes = [tuple(s.shape) for s in array.enumeratedShapes.shapes]
        return [(int(min(axis)), int(max(axis))) for axis in zip(*shapes)]
    return [(int(d), int(d)) for d in array.shape]


# Core ML needs a finite upper bound for a flexible dim; without a model spec
# to copy bounds from, a symbolic dim may take any size up to this.
DEFAULT_UPPER_BOUND = 65536


def _defaultinput_types_of(program: Program):
    function = program.functions.get("main")
    if function is None or len(program.functions) != 1:
        return None
    inputs = []
    for name, var in function.inputs.items():
        if not types.is_tensor(var.sym_type):
            return None
        inputs.append(_tensor_type(name, var))
    return inputs


def _tensor_type(name: str, var):
    dims = tuple(ct.RangeDim(1, DEFAULT_UPPER_BOUND) if is_symbolic(d) else int(d) for d in var.shape)
    return ct.TensorType(name=name, shape=ct.Shape(dims))


def _silence_pass_progress() -> None:
    # ct.convert draws a tqdm bar per pass pipeline, even for the empty one;
    # a save is not a step the user asked to watch.
    from coremltools.converters.mil.mil.passes import pass_pipeline

    pass_pipeline.tqdm = lambda iterable, *args, **kwargs: iterable


def input_types_of(spec, program: Program):
    """ct.TensorType inputs that reproduce the spec's (possibly flexible) input shapes."""
    function = program.functions.get("main")
    inputs = []
    for feature in spec.description.input:
        if feature.type.WhichOneof("Type") == "multiArrayType":
            inputs.append(ct.TensorType(name=feature.name, shape=_array_shape(feature.type.multiArrayType)))
            continue
        # An image is a tensor to the program; the description says "image"
        # again once the original feature type is copied over.
        var = function.inputs.get(feature.name) if function is not None else None
        if var is None or not types.is_tensor(var.sym_type):
            return None  # let coremltools derive them all from the program
        inputs.append(_tensor_type(feature.name, var))
    return inputs


def _array_shape(array):
    default = [int(d) for d in array.shape]
    ranges = array.shapeRange.sizeRanges
    if ranges:
        if len(default) != len(ranges):
            default = [int(size.lowerBound) for size in ranges]
        dims = []
        for size, value in zip(ranges, default):
            if size.lowerBound == size.upperBound:
                dims.append(int(size.lowerBound))
            else:
                upper = int(size.upperBound) if size.upperBound > 0 else -1
                dims.append(ct.RangeDim(int(size.lowerBound), upper, default=value))
        return ct.Shape(tuple(dims))
    if array.enumeratedShapes.shapes:
        return ct.EnumeratedShapes([tuple(s.shape) for s in array.enumeratedShapes.shapes], default=tuple(default))
    return tuple(default)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


