""".mlpackage files: loading is read-only, saving keeps what the program does not say."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

from rewrite.backends.mil import (
    MilError,
    count_ops,
    ct,
    load_mlpackage,
    mb,
    save_mlpackage,
    types,
)
from rewrite.backends.mil.files import input_types_of
from rewrite.backends.mil.reference import evaluate
from tests.model_files import package_spec as _spec

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "rmsnorm_symbolic.mlpackage"
MODEL = Path("Data/com.apple.CoreML/model.mlmodel")
WEIGHTS = Path("Data/com.apple.CoreML/weights")


@pytest.fixture
def example(tmp_path):
    copy = tmp_path / "in" / "model.mlpackage"
    shutil.copytree(EXAMPLE, copy)
    return copy


def _tree(root: Path) -> dict:
    """Every entry under `root` (itself included): kind, bytes, mtime and mode."""
    state = {}
    for folder, folders, files in os.walk(root):
        for path in [Path(folder)] + [Path(folder) / name for name in folders + files]:
            info = path.lstat()
            content = path.read_bytes() if stat.S_ISREG(info.st_mode) else None
            state[str(path.relative_to(root))] = (stat.S_IFMT(info.st_mode), content, info.st_mtime_ns,
                                                  stat.S_IMODE(info.st_mode))
    return state


def _convert(program, path: Path, **options):
    """A package as coremltools writes it (with its build metadata)."""
    options.setdefault("minimum_deployment_target", ct.target.iOS18)
    model = ct.convert(program, convert_to="mlprogram", pass_pipeline=ct.PassPipeline.EMPTY,
                       skip_model_load=True, **options)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save(str(path))
    return model


def _chain(length: int):
    """`length` ops, each using the one before: relu, add, relu, add, ..."""

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 4))], opset_version=ct.target.iOS18)
    def program(x):
        for i in range(length):
            x = mb.relu(x=x) if i % 2 else mb.add(x=x, y=np.float32(1))
        return x

    return program


def _relu(shape=(8, 8), dtype=types.fp32):
    @mb.program(input_specs=[mb.TensorSpec(shape=shape, dtype=dtype)], opset_version=ct.target.iOS18)
    def program(x):
        return mb.relu(x=x, name="y")

    return program


def _plus_weights():
    weight = np.arange(64, dtype=np.float32).reshape(8, 8)

    @mb.program(input_specs=[mb.TensorSpec(shape=(8, 8))], opset_version=ct.target.iOS18)
    def program(x):
        return mb.add(x=x, y=weight, name="y")

    return program


# ------------------------------------------------------------ read-only loads


def test_loading_and_saving_leave_the_input_untouched(example, tmp_path):
    before = _tree(example)
    program, source = load_mlpackage(example)
    assert _tree(example) == before
    save_mlpackage(program, tmp_path / "out.mlpackage", source)
    assert _tree(example) == before
    with pytest.raises(MilError):  # a failed save (the output exists) does not touch it either
        save_mlpackage(load_mlpackage(example)[0], tmp_path / "out.mlpackage", source)
    assert _tree(example) == before
    again, _ = load_mlpackage(tmp_path / "out.mlpackage")
    assert count_ops(again) == count_ops(program)


def test_a_read_only_package_loads(example, tmp_path):
    for folder, _, files in os.walk(example):
        for name in files:
            os.chmod(Path(folder) / name, 0o444)
    folders = [Path(folder) for folder, _, _ in os.walk(example)]
    for folder in reversed(folders):
        os.chmod(folder, 0o555)
    try:
        before = _tree(example)
        program, source = load_mlpackage(example)
        save_mlpackage(program, tmp_path / "out.mlpackage", source)
        assert _tree(example) == before
        assert count_ops(load_mlpackage(tmp_path / "out.mlpackage")[0]) == count_ops(program)
    finally:
        for folder in folders:
            os.chmod(folder, 0o755)


def test_the_source_lists_every_file_of_the_input(example):
    _, source = load_mlpackage(example)
    expected = {Path(folder) / name for folder, _, names in os.walk(example) for name in names}
    assert set(source.files) == expected
    assert all(p.is_absolute() for p in source.files)
    assert source.path == example and source.package
    assert source.spec.WhichOneof("Type") == "mlProgram"


def _outside_model(package: Path) -> Path:
    outside = package.parent / "outside"
    shutil.copytree(package / MODEL.parent, outside)
    return outside


def _set_root_path(package: Path, path: str) -> None:
    manifest = json.loads((package / "Manifest.json").read_text())
    manifest["itemInfoEntries"][manifest["rootModelIdentifier"]]["path"] = path
    (package / "Manifest.json").write_text(json.dumps(manifest))


def _neural_network(package: Path) -> None:
    spec = ct.proto.Model_pb2.Model(specificationVersion=4)
    spec.neuralNetwork.SetInParent()
    (package / MODEL).write_bytes(spec.SerializeToString())


def _symlink(link: Path, target: Path) -> None:
    shutil.rmtree(link) if link.is_dir() else link.unlink()
    link.symlink_to(target)


MALFORMED = {
    "no manifest": (lambda p: (p / "Manifest.json").unlink(), "Manifest.json", "no such file"),
    "manifest not JSON": (lambda p: (p / "Manifest.json").write_text("{ not json"), "Manifest.json",
                          "not a Core ML model package (invalid JSON"),
    "manifest not an object": (lambda p: (p / "Manifest.json").write_text("[1, 2]"), "Manifest.json",
                               "no root model entry"),
    "no root entry": (lambda p: (p / "Manifest.json").write_text('{"rootModelIdentifier": "x"}'),
                      "Manifest.json", "no root model entry"),
    "no model file": (lambda p: (p / MODEL).unlink(), str(MODEL), "no such file"),
    "not an ML program": (_neural_network, str(MODEL), "not an ML program (it is a neuralNetwork model)"),
    "corrupt model file": (lambda p: (p / MODEL).write_bytes(b"\xff\xff\xff\xff"), str(MODEL),
                           "not a Core ML model"),
    "path with ..": (lambda p: (_outside_model(p), _set_root_path(p, "../../outside/model.mlmodel")),
                     "Manifest.json", "leads out of the package"),
    "absolute path": (lambda p: _set_root_path(p, str(_outside_model(p) / "model.mlmodel")),
                      "Manifest.json", "leads out of the package"),
    "symlinked model file": (lambda p: _symlink(p / MODEL, _outside_model(p) / "model.mlmodel"),
                             str(MODEL), "symbolic link out of the package"),
    "symlinked weights": (lambda p: _symlink(p / WEIGHTS / "weight.bin", _outside_model(p) / "weights/weight.bin"),
                          str(WEIGHTS / "weight.bin"), "symbolic link out of the package"),
    "symlinked folder": (lambda p: _symlink(p / WEIGHTS, _outside_model(p) / "weights"),
                         str(WEIGHTS), "symbolic link out of the package"),
    "missing weights": (lambda p: (p / WEIGHTS / "weight.bin").unlink(), str(MODEL), "could not read"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_packages_are_one_line_errors_naming_the_file(example, case):
    damage, file, message = MALFORMED[case]
    damage(example)
    with pytest.raises(MilError) as raised:
        load_mlpackage(example)
    text = str(raised.value)
    assert "\n" not in text
    assert text.startswith(f"{example / file}: ") and message in text, text


def test_a_symlink_inside_the_package_is_read_and_copied(example, tmp_path):
    notes = example / "Data" / "notes.txt"
    notes.write_text("kept")
    (example / "Data" / "link.txt").symlink_to("notes.txt")
    program, source = load_mlpackage(example)
    save_mlpackage(program, tmp_path / "out.mlpackage", source)
    copied = tmp_path / "out.mlpackage" / "Data" / "link.txt"
    assert not copied.is_symlink() and copied.read_text() == "kept"


# ------------------------------------------------------------ long programs


def test_a_long_chain_saves_at_the_default_recursion_limit(tmp_path):
    limit = sys.getrecursionlimit()
    program = _chain(2000)
    ops = count_ops(program)
    save_mlpackage(program, tmp_path / "a.mlpackage")
    loaded, source = load_mlpackage(tmp_path / "a.mlpackage")
    assert count_ops(loaded) == ops
    save_mlpackage(loaded, tmp_path / "b.mlpackage", source)
    assert count_ops(load_mlpackage(tmp_path / "b.mlpackage")[0]) == ops
    assert sys.getrecursionlimit() == limit


# ------------------------------------------------------------ the model description


def test_metadata_and_feature_descriptions_are_kept(tmp_path):
    model = _convert(_relu(), tmp_path / "a.mlpackage")
    model.author = "Ada"
    model.license = "MIT"
    model.version = "1.2.3"
    model.short_description = "a relu"
    model.user_defined_metadata["origin"] = "test"
    model.input_description["x"] = "the input"
    model.output_description["y"] = "the output"
    model.save(str(tmp_path / "a.mlpackage"))
    program, source = load_mlpackage(tmp_path / "a.mlpackage")
    save_mlpackage(program, tmp_path / "b.mlpackage", source)
    before, after = _spec(tmp_path / "a.mlpackage"), _spec(tmp_path / "b.mlpackage")
    assert after.description.metadata.author == "Ada"
    assert after.description.metadata.userDefined["origin"] == "test"
    assert after.description.metadata == before.description.metadata  # coremltools' keys: the original's
    assert after.description.input[0].shortDescription == "the input"
    assert after.description.output[0].shortDescription == "the output"
    assert after.description == before.description


def _flexible(tmp_path):
    from coremltools.converters.mil.mil import get_new_symbol

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, get_new_symbol()))], opset_version=ct.target.iOS18)
    def program(x):
        return mb.relu(x=x, name="y")

    return program, {"inputs": [ct.TensorType(name="x", shape=ct.Shape((1, ct.RangeDim(1, 64, default=8))))]}


def _enumerated(tmp_path):
    from coremltools.converters.mil.mil import get_new_symbol

    @mb.program(input_specs=[mb.TensorSpec(shape=(get_new_symbol(), 8))], opset_version=ct.target.iOS18)
    def program(x):
        return mb.relu(x=x, name="y")

    shapes = ct.EnumeratedShapes([(1, 8), (4, 8), (2, 8)], default=(4, 8))
    return program, {"inputs": [ct.TensorType(name="x", shape=shapes)]}


def _dtypes(tmp_path):
    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 8), dtype=types.fp16),
                             mb.TensorSpec(shape=(2, 8), dtype=types.int32)], opset_version=ct.target.iOS18)
    def program(x, i):
        return mb.relu(x=x, name="y"), mb.add(x=i, y=np.int32(1), name="j")

    return program, {
        "inputs": [ct.TensorType(name="x", dtype=np.float16), ct.TensorType(name="i", dtype=np.int32)],
        "outputs": [ct.TensorType(name="y", dtype=np.float16), ct.TensorType(name="j", dtype=np.int32)],
    }


def _image(tmp_path):
    return _relu((1, 3, 8, 8)), {
        "inputs": [ct.ImageType(name="x", shape=(1, 3, 8, 8), color_layout=ct.colorlayout.BGR, scale=1 / 255)],
    }


def _flexible_image(tmp_path):
    from coremltools.converters.mil.mil import get_new_symbol

    program = _relu((1, 3, get_new_symbol(), get_new_symbol()))
    shape = (1, 3, ct.RangeDim(8, 64, default=16), ct.RangeDim(8, 64, default=32))
    return program, {"inputs": [ct.ImageType(name="x", shape=shape, color_layout=ct.colorlayout.RGB)]}


def _optional(tmp_path):
    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 8)), mb.TensorSpec(shape=(2, 8))],
                opset_version=ct.target.iOS18)
    def program(x, z):
        return mb.add(x=x, y=z, name="y")

    default = np.full((2, 8), 0.5, np.float32)
    return program, {"inputs": [ct.TensorType(name="x", shape=(2, 8)),
                                ct.TensorType(name="z", shape=(2, 8), default_value=default)]}


def _stateful(tmp_path):
    @mb.program(input_specs=[mb.StateTensorSpec(shape=(1, 4), dtype=types.fp16),
                             mb.TensorSpec(shape=(1, 4), dtype=types.fp16)], opset_version=ct.target.iOS18)
    def program(counter, x):
        total = mb.add(x=mb.read_state(input=counter), y=x)
        mb.coreml_update_state(state=counter, value=total)
        return mb.relu(x=total, name="y")

    return program, {}


INTERFACES = {
    "range with a default": _flexible,
    "enumerated shapes": _enumerated,
    "fp16 and int32": _dtypes,
    "image": _image,
    "flexible image": _flexible_image,
    "optional input": _optional,
    "state": _stateful,
}


@pytest.mark.parametrize("case", list(INTERFACES))
def test_inputs_and_outputs_are_described_as_before(tmp_path, case):
    program, options = INTERFACES[case](tmp_path)
    _convert(program, tmp_path / "a.mlpackage", **options)
    loaded, source = load_mlpackage(tmp_path / "a.mlpackage")
    save_mlpackage(loaded, tmp_path / "b.mlpackage", source)
    # Twice: what the first save wrote is what the second reads.
    reloaded, resource = load_mlpackage(tmp_path / "b.mlpackage")
    save_mlpackage(reloaded, tmp_path / "c.mlpackage", resource)
    before = _spec(tmp_path / "a.mlpackage")
    for after in (_spec(tmp_path / "b.mlpackage"), _spec(tmp_path / "c.mlpackage")):
        assert list(after.description.input) == list(before.description.input)
        assert list(after.description.output) == list(before.description.output)
        assert list(after.description.state) == list(before.description.state)
        assert after.mlProgram.functions["main"].inputs == before.mlProgram.functions["main"].inputs


def test_a_range_default_reaches_theinput_types_of(tmp_path):
    program, options = _flexible(tmp_path)
    _convert(program, tmp_path / "a.mlpackage", **options)
    loaded, source = load_mlpackage(tmp_path / "a.mlpackage")
    (tensor,) = input_types_of(source.spec, loaded)
    fixed, flexible = tensor.shape.shape
    assert fixed == 1
    assert (flexible.lower_bound, flexible.upper_bound, flexible.default) == (1, 64, 8)
    assert tensor.shape.default == (1, 8)


def test_multifunction_models_keep_their_functions_and_shared_weights(tmp_path):
    from coremltools.models.utils import MultiFunctionDescriptor, save_multifunction

    weight = np.arange(16, dtype=np.float32).reshape(2, 8)

    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 8))], opset_version=ct.target.iOS18)
    def one(x):
        return mb.relu(x=mb.add(x=x, y=weight), name="y")

    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 8))], opset_version=ct.target.iOS18)
    def two(x):
        return mb.sigmoid(x=mb.add(x=x, y=weight), name="y")

    descriptor = MultiFunctionDescriptor()
    for name, program in (("one", one), ("two", two)):
        _convert(program, tmp_path / f"{name}.mlpackage")
        descriptor.add_function(str(tmp_path / f"{name}.mlpackage"), "main", name)
    descriptor.default_function_name = "two"
    save_multifunction(descriptor, str(tmp_path / "a.mlpackage"))

    loaded, source = load_mlpackage(tmp_path / "a.mlpackage")
    save_mlpackage(loaded, tmp_path / "b.mlpackage", source)
    before, after = _spec(tmp_path / "a.mlpackage"), _spec(tmp_path / "b.mlpackage")
    assert after.description == before.description
    assert set(after.mlProgram.functions) == {"one", "two"}
    size = (tmp_path / "a.mlpackage" / WEIGHTS / "weight.bin").stat().st_size
    assert (tmp_path / "b.mlpackage" / WEIGHTS / "weight.bin").stat().st_size == size  # stored once
    reloaded, _ = load_mlpackage(tmp_path / "b.mlpackage")
    inputs = {"x": np.ones((2, 8), np.float32)}
    for name, program in (("one", one), ("two", two)):
        np.testing.assert_allclose(evaluate(reloaded, inputs, name)["y"], evaluate(program, inputs)["y"], rtol=1e-6)


# ------------------------------------------------------------ the rest of the package


def _write_manifest(package: Path, manifest: dict) -> bytes:
    # Not coremltools' layout (two-space indent, a custom key first), so
    # that a rewritten Manifest shows.
    data = json.dumps(manifest, indent=2).encode()
    (package / "Manifest.json").write_bytes(data)
    return data


def test_other_items_files_and_manifest_keys_are_kept(example, tmp_path):
    manifest = json.loads((example / "Manifest.json").read_text())
    manifest = {"com.example.custom": {"kept": True}, **manifest}
    manifest["itemInfoEntries"]["A1B2C3D4-0000-4000-8000-000000000001"] = {
        "author": "com.example.tool", "description": "Notes", "name": "notes", "path": "com.example.tool/notes",
    }
    manifest_bytes = _write_manifest(example, manifest)
    (example / "Data" / "com.example.tool" / "notes").mkdir(parents=True)
    (example / "Data" / "com.example.tool" / "notes" / "a.json").write_text('{"a": 1}')
    (example / "Data" / "com.example.tool" / "empty").mkdir()
    (example / "README.txt").write_text("hello")

    program, source = load_mlpackage(example)
    output = tmp_path / "out.mlpackage"
    save_mlpackage(program, output, source)
    assert (output / "Manifest.json").read_bytes() == manifest_bytes
    assert (output / "Data" / "com.example.tool" / "notes" / "a.json").read_text() == '{"a": 1}'
    assert (output / "Data" / "com.example.tool" / "empty").is_dir()
    assert (output / "README.txt").read_text() == "hello"
    again, _ = load_mlpackage(output)
    assert count_ops(again) == count_ops(program)
    inputs = {"x": np.random.default_rng(0).normal(size=(3, 16))}
    np.testing.assert_allclose(evaluate(again, inputs)["y"], evaluate(load_mlpackage(example)[0], inputs)["y"],
                               rtol=1e-6)


def test_a_weights_entry_is_added_only_when_the_new_model_has_weights(tmp_path):
    _convert(_relu(), tmp_path / "plain.mlpackage")
    package = tmp_path / "plain.mlpackage"
    assert not any((package / WEIGHTS).iterdir())
    # Without weights: the empty weights folder and its entry stay, the Manifest byte for byte.
    manifest_bytes = (package / "Manifest.json").read_bytes()
    program, source = load_mlpackage(package)
    save_mlpackage(program, tmp_path / "same.mlpackage", source)
    assert (tmp_path / "same.mlpackage" / "Manifest.json").read_bytes() == manifest_bytes
    assert (tmp_path / "same.mlpackage" / WEIGHTS).is_dir()

    # A package that never had weights, given a program that has some.
    manifest = json.loads(manifest_bytes)
    manifest["itemInfoEntries"] = {
        key: entry for key, entry in manifest["itemInfoEntries"].items() if entry["name"] != "weights"
    }
    manifest_bytes = _write_manifest(package, manifest)
    (package / WEIGHTS).rmdir()
    _, source = load_mlpackage(package)
    save_mlpackage(_relu(), tmp_path / "bare.mlpackage", source)
    assert (tmp_path / "bare.mlpackage" / "Manifest.json").read_bytes() == manifest_bytes
    assert not (tmp_path / "bare.mlpackage" / WEIGHTS).exists()
    save_mlpackage(_plus_weights(), tmp_path / "weighted.mlpackage", source)
    written = json.loads((tmp_path / "weighted.mlpackage" / "Manifest.json").read_text())
    paths = sorted(entry["path"] for entry in written["itemInfoEntries"].values())
    assert paths == ["com.apple.CoreML/model.mlmodel", "com.apple.CoreML/weights"]
    assert written["rootModelIdentifier"] == manifest["rootModelIdentifier"]
    loaded, _ = load_mlpackage(tmp_path / "weighted.mlpackage")
    inputs = {"x": np.zeros((8, 8), np.float32)}
    np.testing.assert_array_equal(evaluate(loaded, inputs)["y"], np.arange(64, dtype=np.float32).reshape(8, 8))


# ------------------------------------------------------------ writing


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_the_output_has_the_modes_the_umask_gives(example, tmp_path, umask):
    program, source = load_mlpackage(example)
    previous = os.umask(umask)
    try:
        save_mlpackage(program, tmp_path / "out.mlpackage", source)
        save_mlpackage(_plus_weights(), tmp_path / "fresh.mlpackage")
    finally:
        os.umask(previous)
    for output in (tmp_path / "out.mlpackage", tmp_path / "fresh.mlpackage"):
        modes = {path: stat.S_IMODE(mode) for path, (kind, _, _, mode) in _tree(output).items()}
        kinds = {path: kind for path, (kind, _, _, _) in _tree(output).items()}
        assert {modes[p] for p in modes if kinds[p] == stat.S_IFDIR} == {0o777 & ~umask}
        assert {modes[p] for p in modes if kinds[p] == stat.S_IFREG} == {0o666 & ~umask}
        assert (output / WEIGHTS / "weight.bin").is_file()


def test_a_save_refuses_an_existing_path_and_leaves_nothing_when_it_fails(example, tmp_path):
    program, source = load_mlpackage(example)
    existing = tmp_path / "existing.mlpackage"
    existing.mkdir()
    with pytest.raises(MilError, match="already exists"):
        save_mlpackage(program, existing, source)
    assert list(existing.iterdir()) == []
    # coremltools refuses an unbounded input only once it has written a package.
    unbounded = type(source.spec)()
    unbounded.CopyFrom(source.spec)
    unbounded.description.input[0].type.multiArrayType.shapeRange.sizeRanges[0].upperBound = -1
    before = sorted(tmp_path.iterdir())
    with pytest.raises(MilError) as raised:
        save_mlpackage(program, tmp_path / "out.mlpackage", dataclasses.replace(source, spec=unbounded))
    assert str(raised.value).startswith(f"{tmp_path / 'out.mlpackage'}: could not convert the program (")
    assert "\n" not in str(raised.value)
    assert sorted(tmp_path.iterdir()) == before


def test_mlmodel_files_still_load_and_save(tmp_path):
    model = _convert(_relu(), tmp_path / "a.mlpackage")
    model_file = tmp_path / "a.mlmodel"
    model_file.write_bytes(model.get_spec().SerializeToString())
    program, source = load_mlpackage(model_file)
    assert source.files == (model_file,) and not source.package
    assert count_ops(program, "relu") == 1
    save_mlpackage(program, tmp_path / "b.mlmodel", source)
    assert count_ops(load_mlpackage(tmp_path / "b.mlmodel")[0], "relu") == 1
    save_mlpackage(load_mlpackage(model_file)[0], tmp_path / "c.mlpackage", source)
    assert count_ops(load_mlpackage(tmp_path / "c.mlpackage")[0], "relu") == 1
    with pytest.raises(MilError, match="only be saved as an .mlpackage"):
        save_mlpackage(_plus_weights(), tmp_path / "d.mlmodel", source)
    assert not (tmp_path / "d.mlmodel").exists()
