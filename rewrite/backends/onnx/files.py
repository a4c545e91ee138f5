"""`.onnx` files: reading a model with its external data, and writing one back.

The CLI (through `rewrite.output`) decides where a model goes; this module
only reads from the input's folder and writes into the folder it is given.

External data stays on disk. `read_onnx` loads the graph and leaves every
external tensor where it is, checked (its file opens, its bytes are there)
but not read; the adapter reads one only when a rule asks for its value,
and only if it is small (`EXTERNAL_READ_LIMIT`). `write_onnx` writes the
output's data file by cloning the input's (a reflink where the file system
has them, else an in-kernel copy) and appending what the model holds inline,
so the weights never pass through this process's memory, and the input's
data file is only ever read.

A model read so does not know its folder (a protobuf message takes no
attribute of ours), so `read_onnx` returns the `OnnxSource` with it, and
whatever reads or writes its external tensors is given that source:
`rewrite.onnx.optimize(model, source=...)`, `RuleSet.apply(model, source=...)`,
`write_onnx(model, path, data, source=...)`. No table of models is kept.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from rewrite.backends.onnx.graph import OnnxError
from rewrite.engine.interfaces import ModelError

# The most bytes of an external tensor the adapter reads for a rule: a
# shape, repeats, axes or a scalar take a few; a weight is never needed.
EXTERNAL_READ_LIMIT = 64 * 1024

# Inline tensors of at least this many bytes go to the data file when a
# model with external data is written (onnx.save_model's threshold as used).
INLINE_LIMIT = 1024

# Where each tensor starts in a data file this module writes: whole pages,
# so that a runtime may map it.
ALIGNMENT = 4096


class OnnxFileError(ModelError):
    """A file that is not a readable ONNX model; the message names it."""


@dataclass(frozen=True)
class OnnxSource:
    """Where a loaded model came from: its file and the external data files it refers to.

    `lazy`: the external tensors were left on disk (read on demand from the
    model's folder, and copied file to file when the model is written).
    """

    path: Path
    data_files: tuple[Path, ...] = ()
    lazy: bool = False

    @property
    def files(self) -> tuple[Path, ...]:
        """Every file the model consists of."""
        return (self.path, *self.data_files)

    @property
    def external_data(self) -> bool:
        return bool(self.data_files)

    @property
    def base_dir(self) -> str | None:
        """The folder the model's external tensors are still to be read from; None when it has none on disk."""
        return str(self.path.parent) if self.lazy and self.data_files else None


def read_onnx(path: str | os.PathLike, *, lazy: bool = True) -> tuple[onnx.ModelProto, OnnxSource]:
    """Read an `.onnx` file; its external data stays on disk unless `lazy` is false.

    External data is found relative to the model's folder, never the working
    directory, and checked as `onnx.load` checks it (a location inside the
    folder, a file that opens, the bytes each tensor claims), without being
    read. With `lazy=False` it is read into the model, as `onnx.load` does.
    With `lazy`, the returned source is what reading and writing the
    external tensors needs (`OnnxSource.base_dir`). A missing, truncated or
    non-ONNX file raises `OnnxFileError`.
    """
    path = Path(path)
    if not path.is_file():
        raise OnnxFileError(f"{path}: no such file" if not path.exists() else f"{path}: not a regular file")
    try:
        data = path.read_bytes()
        model = onnx.ModelProto()
        model.ParseFromString(data)
    except Exception as error:
        raise OnnxFileError(f"{path}: not a readable ONNX model ({_first_line(error)})") from None
    if not model.HasField("graph") or not model.opset_import:
        raise OnnxFileError(f"{path}: not an ONNX model (no graph or no opset)")
    # A tensor stored outside names its file under the key "location": a
    # model whose bytes never say that has none, and needs no walk.
    mentions_location = b"location" in data
    del data
    data_files: tuple[Path, ...] = ()
    external = [t for t in _tensors(model.graph) if _is_external(t)] if mentions_location else []
    if external:
        locations = sorted({_location(t) for t in external})
        data_files = tuple(path.parent / location for location in locations if location)
    if not data_files:
        return model, OnnxSource(path)
    try:
        if lazy:
            _check_external(external, path.parent)
        else:
            onnx.load_external_data_for_model(model, str(path.parent))
    except Exception as error:
        raise OnnxFileError(f"{path}: cannot read its external data ({_first_line(error)})") from None
    return model, OnnxSource(path, data_files, lazy)


def load_external_data(model: onnx.ModelProto, source: OnnxSource) -> None:
    """Read every external tensor of a lazily read model into it; it no longer needs its folder."""
    if source.base_dir is not None:
        onnx.load_external_data_for_model(model, source.base_dir)


def write_onnx(model: onnx.ModelProto, path: str | os.PathLike, data_name: str | None = None,
               source: OnnxSource | None = None) -> None:
    """Write `model` to `path`; with `data_name`, its large tensors go to that file beside it.

    A model `read_onnx` left external data on disk for (`source`, which it
    returned) is written without reading it: the data file is cloned or
    copied from the input's and the model's own tensors of `INLINE_LIMIT`
    bytes or more are appended, and the model in memory is left as it was.
    Otherwise the model's tensors are changed to refer to the data file when
    `data_name` is given (as `onnx.save_model` does).
    """
    path = Path(path)
    if source is not None and source.base_dir is None:
        source = None  # nothing of it on disk
    if source is not None and data_name is None:
        load_external_data(model, source)  # asked for one file: the weights must come in
        source = None
    if source is not None:
        _write_streaming(model, path, data_name, source)
    elif data_name is not None:
        onnx.save_model(
            model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
            location=data_name, size_threshold=INLINE_LIMIT,
        )
    else:
        # What onnx.save_model writes for a model without external tensors,
        # without its walk over every tensor looking for some (0.14 s at 100k nodes).
        path.write_bytes(model.SerializeToString())


def _write_streaming(model: onnx.ModelProto, path: Path, data_name: str, source: OnnxSource) -> None:
    folder = source.path.parent
    target = path.parent / data_name
    external = [t for t in _tensors(model.graph) if _is_external(t)]
    # Each input data file the model still refers to goes into the output's,
    # whole (its offsets stay valid), the first by cloning.
    starts: dict[str, int] = {}
    restore: list = []
    with open(target, "xb") as out:
        for location in sorted({_location(t) for t in external}):
            start = _align(out.tell())
            out.truncate(start)
            out.seek(start)
            with open(folder / location, "rb") as data:
                _copy_file(data, out, start)
            starts[location] = start
        for tensor in external:
            entries = [(entry.key, entry.value) for entry in tensor.external_data]
            restore.append((tensor, entries, None, _location_field(tensor)))
            info = dict(entries)
            offset = starts[info["location"]] + int(info.get("offset") or 0)
            length = info.get("length")
            if length is None:
                length = str((folder / info["location"]).stat().st_size - int(info.get("offset") or 0))
            _set_external(tensor, data_name, offset, int(length))
        for tensor in _tensors(model.graph):
            if _is_external(tensor) or not tensor.HasField("raw_data") or len(tensor.raw_data) < INLINE_LIMIT:
                continue
            raw = tensor.raw_data
            start = _align(out.seek(0, os.SEEK_END))
            out.truncate(start)
            out.seek(start)
            out.write(raw)
            restore.append((tensor, None, raw, _location_field(tensor)))
            tensor.ClearField("raw_data")
            _set_external(tensor, data_name, start, len(raw))
    try:
        path.write_bytes(model.SerializeToString())
    finally:
        # The model in memory keeps referring to the input's data, as it was read.
        for tensor, entries, raw, location_field in reversed(restore):
            del tensor.external_data[:]
            if raw is not None:
                tensor.raw_data = raw
            for key, value in entries or ():
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            if location_field is None:
                tensor.ClearField("data_location")
            else:
                tensor.data_location = location_field


def _location_field(tensor: onnx.TensorProto) -> int | None:
    """`data_location` as set, None if unset: restored so, the message serializes as it did."""
    return tensor.data_location if tensor.HasField("data_location") else None


def _set_external(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    tensor.data_location = onnx.TensorProto.EXTERNAL


def _align(position: int) -> int:
    return -(-position // ALIGNMENT) * ALIGNMENT


# Linux's FICLONE: share the source's blocks, copy on write (btrfs, XFS, ...).
_FICLONE = 0x40049409


def _copy_file(source, target, start: int) -> None:
    """Copy all of `source` into `target` at `start`, without the bytes passing through this process.

    A clone where the file system can (only for a whole, empty target), else
    `copy_file_range` (in the kernel; some file systems share blocks), else
    `sendfile`, else a buffered copy.
    """
    size = os.fstat(source.fileno()).st_size
    if start == 0:
        with contextlib.suppress(OSError, ImportError):
            import fcntl

            fcntl.ioctl(target.fileno(), _FICLONE, source.fileno())
            target.seek(size)
            return
    copy_range = getattr(os, "copy_file_range", None)
    copied = 0
    if copy_range is not None:
        try:
            while copied < size:
                done = copy_range(source.fileno(), target.fileno(), size - copied, copied, start + copied)
                if done == 0:
                    break
                copied += done
        except OSError as error:
            if error.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM):
                raise
    if copied < size:
        source.seek(copied)
        target.seek(start + copied)
        shutil.copyfileobj(source, target, 8 * 1024 * 1024)
    target.seek(start + size)


def _check_external(tensors: list[onnx.TensorProto], folder: Path) -> None:
    """What `onnx.load_external_data_for_model` checks before it reads: nothing is read.

    Each file is opened once through onnx's own opener (which refuses a
    location outside the folder, or a link out of it), and each tensor's
    offset and length must lie inside its file.
    """
    sizes: dict[str, int] = {}
    for tensor in tensors:
        info = onnx.external_data_helper.ExternalDataInfo(tensor)
        if info.location not in sizes:
            sizes[info.location] = _opened_size(folder, info.location, tensor.name)
        size = sizes[info.location]
        offset = info.offset or 0
        if offset > size:
            raise ValueError(f"offset {offset} of tensor '{tensor.name}' is past the end of '{info.location}'")
        if info.length is not None and info.length > size - offset:
            raise ValueError(f"tensor '{tensor.name}' needs {info.length} bytes of '{info.location}' "
                             f"from offset {offset}; the file has {size - offset}")


def _opened_size(folder: Path, location: str, tensor_name: str) -> int:
    opener = getattr(onnx.external_data_helper, "_open_external_data_fd", None)
    if opener is None:  # an onnx without it: the same rule, checked here
        target = (folder / location).resolve()
        if Path(location).is_absolute() or folder.resolve() not in target.parents:
            raise ValueError(f"external data location '{location}' is outside the model's folder")
        descriptor = os.open(target, os.O_RDONLY)
    else:
        descriptor = opener(str(folder), location, tensor_name, True)
    try:
        return os.fstat(descriptor).st_size
    finally:
        os.close(descriptor)


def external_size(tensor: onnx.TensorProto) -> int | None:
    """The bytes an external tensor takes in its file, from its header; None if it does not say."""
    for entry in tensor.external_data:
        if entry.key == "length":
            with contextlib.suppress(ValueError):
                return int(entry.value)
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    return int(np.prod([int(d) for d in tensor.dims], dtype=np.int64)) * itemsize


def data_files_of(path: str | os.PathLike) -> tuple[Path, ...]:
    """The external data files an `.onnx` file refers to, without reading them.

    Empty for a file that is not a readable model.
    """
    path = Path(path)
    try:
        model = onnx.ModelProto()
        model.ParseFromString(path.read_bytes())
    except Exception:
        return ()
    locations = sorted({_location(t) for t in _tensors(model.graph) if _is_external(t)})
    return tuple(path.parent / location for location in locations if location)


def _is_external(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def _location(tensor: onnx.TensorProto) -> str:
    for entry in tensor.external_data:
        if entry.key == "location":
            return entry.value
    return ""


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor of a graph and its subgraphs: initializers and attributes."""
    pending = [graph]
    while pending:
        current = pending.pop()
        yield from current.initializer
        for sparse in current.sparse_initializer:
            yield sparse.values
            yield sparse.indices
        for node in current.node:
            for attribute in node.attribute:
                if attribute.HasField("t"):
                    yield attribute.t
                yield from attribute.tensors
                if attribute.HasField("sparse_tensor"):
                    yield attribute.sparse_tensor.values
                    yield attribute.sparse_tensor.indices
                if attribute.HasField("g"):
                    pending.append(attribute.g)
                pending.extend(attribute.graphs)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


# ---------------------------------------------------------------- in one piece


def load_onnx(path: str | os.PathLike) -> tuple[onnx.ModelProto, bool]:
    """Read an `.onnx` file, external data included (see `read_onnx`).

    Returns the model and whether its tensors were stored as external data
    (so that `save_onnx` can store them that way again). A missing, truncated
    or non-ONNX file is an `OnnxError`.
    """
    try:
        # Read in: a caller of this function may hand the model to anything.
        model, source = read_onnx(path, lazy=False)
    except OnnxFileError as error:
        raise OnnxError(str(error)) from None
    return model, source.external_data


def save_onnx(model: onnx.ModelProto, path: str | os.PathLike, external_data: bool = False) -> None:
    """Write `model` to `path`; with `external_data`, large tensors go to `<path>.data` beside it.

    This writes in place; `rewrite apply` writes through `rewrite.output`,
    which also picks a data file name that replaces nothing.
    """
    write_onnx(model, path, Path(path).name + ".data" if external_data else None)
