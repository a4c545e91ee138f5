"""`.onnx` files: reading a model with its external data, and writing one back.

The CLI (through `rewrite.output`) decides where a model goes; this module
only reads from the input's folder and writes into the folder it is given.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx

from rewrite.engine.interfaces import ModelError


class OnnxFileError(ModelError):
    """A file that is not a readable ONNX model; the message names it."""


@dataclass(frozen=True)
class OnnxSource:
    """Where a loaded model came from: its file and the external data files it read."""

    path: Path
    data_files: tuple[Path, ...] = ()

    @property
    def files(self) -> tuple[Path, ...]:
        """Every file the model consists of."""
        return (self.path, *self.data_files)

    @property
    def external_data(self) -> bool:
        return bool(self.data_files)


def read_onnx(path: str | os.PathLike) -> tuple[onnx.ModelProto, OnnxSource]:
    """Read an `.onnx` file, external data included, as `onnx.load` does.

    External data is read relative to the model's folder, never the working
    directory. A missing, truncated or non-ONNX file raises `OnnxFileError`.
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
    data_files: tuple[Path, ...] = ()
    # A tensor stored outside names its file under the key "location": a
    # model whose bytes never say that has none, and needs no walk.
    if b"location" in data:
        locations = sorted({_location(t) for t in _tensors(model.graph) if _is_external(t)})
        data_files = tuple(path.parent / location for location in locations if location)
        if data_files:
            try:
                onnx.load_external_data_for_model(model, str(path.parent))
            except Exception as error:
                raise OnnxFileError(f"{path}: cannot read its external data ({_first_line(error)})") from None
    return model, OnnxSource(path, data_files)


def write_onnx(model: onnx.ModelProto, path: str | os.PathLike, data_name: str | None = None) -> None:
    """Write `model` to `path`; with `data_name`, tensors over 1 KiB go to that file beside it.

    The model's tensors are changed to refer to the data file when
    `data_name` is given (as `onnx.save_model` does).
    """
    path = Path(path)
    if data_name is not None:
        onnx.save_model(
            model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
            location=data_name, size_threshold=1024,
        )
    else:
        # What onnx.save_model writes for a model without external tensors,
        # without its walk over every tensor looking for some (0.14 s at 100k nodes).
        path.write_bytes(model.SerializeToString())


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
