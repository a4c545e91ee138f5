"""Model files on disk for the tests of `rewrite apply`'s file handling.

Each model has one op the shipped rules remove, so a test can tell the old
model from the new one, and values to check the new one against.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent
MIL_EXAMPLE = REPO / "examples" / "rmsnorm_symbolic.mlpackage"


def onnx_model(width: int = 32) -> onnx.ModelProto:
    """y = (x @ W) * expand(mean(x @ W, -1)): the Expand goes, the (width, width) weight stays."""
    weight = np.random.default_rng(7).normal(size=(width, width)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="project"),
        helper.make_node("ReduceMean", ["h", "axes"], ["m"], name="mean", keepdims=1),
        helper.make_node("Shape", ["h"], ["s"], name="shape"),
        helper.make_node("Expand", ["m", "s"], ["e"], name="widen"),
        helper.make_node("Mul", ["h", "e"], ["y"], name="scale"),
    ]
    graph = helper.make_graph(
        nodes, "scaled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", width])],
        initializer=[numpy_helper.from_array(weight, "w"), numpy_helper.from_array(np.array([-1]), "axes")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model, full_check=True)
    return model


def write_onnx(model: onnx.ModelProto, path: Path, data_name: str | None = None) -> Path:
    """Save `model` at `path`, its weights in `data_name` beside it if given."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    if data_name is None:
        onnx.save_model(model, str(path))
    else:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_name, size_threshold=1024)
    return path


def onnx_outputs(path: Path, rows: int = 3) -> np.ndarray:
    """The model's output on a fixed input, computed by onnxruntime from the file."""
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    width = session.get_inputs()[0].shape[1]
    x = np.random.default_rng(rows).normal(size=(rows, width)).astype(np.float32)
    return session.run(None, {"x": x})[0]


def onnx_op_count(path: Path, op_type: str) -> int:
    model = onnx.load(str(path), load_external_data=False)
    return sum(node.op_type == op_type for node in model.graph.node)


def mil_package(directory: Path, name: str = "model.mlpackage") -> Path:
    """A copy of the bundled example: a symbolic-batch RMSNorm whose tile the rules remove."""
    path = directory / name
    shutil.copytree(MIL_EXAMPLE, path)
    return path


def package_spec(package: Path):
    """The model spec of an `.mlpackage`, read without coremltools' ModelPackage."""
    from rewrite.backends.mil import ct

    manifest = json.loads((package / "Manifest.json").read_text())
    entry = manifest["itemInfoEntries"][manifest["rootModelIdentifier"]]
    spec = ct.proto.Model_pb2.Model()
    spec.ParseFromString((package / "Data" / entry["path"]).read_bytes())
    return spec


def tree_state(path: Path) -> dict[str, tuple]:
    """Every entry under `path` (or `path` itself), with its kind, bytes' hash, mode and mtime."""
    path = Path(path)
    state = {}
    entries = [path]
    if path.is_dir() and not path.is_symlink():
        entries += sorted(path.rglob("*"))
    for entry in entries:
        info = os.lstat(entry)
        key = str(entry.relative_to(path)) if entry != path else "."
        if entry.is_symlink():
            state[key] = ("link", os.readlink(entry))
        elif entry.is_dir():
            state[key] = ("dir", info.st_mode)
        else:
            state[key] = ("file", hashlib.sha256(entry.read_bytes()).hexdigest(), info.st_mode, info.st_mtime_ns)
    return state


def folder_state(directory: Path) -> dict[str, tuple]:
    """`tree_state` of every entry of a folder, keyed by name."""
    return {entry.name: tree_state(entry) for entry in sorted(Path(directory).iterdir())}
