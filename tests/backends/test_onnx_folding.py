"""Constant folding, pruning and `rewrite.onnx.optimize`: fewer nodes, the same outputs.

Every model is checked with onnx's full checker and run by onnxruntime
before and after, at two input sizes where it has a symbolic dim.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from rewrite.backends.onnx import OnnxAdapter
from rewrite.backends.onnx import files as onnx_files
from rewrite.backends.onnx.folding import fold_constants, prune_model
from rewrite.onnx import optimize

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "rules"))
from test_onnx_exported_models import MANIFEST, MODELS, _feeds  # noqa: E402


def run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def model_of(nodes, inputs, outputs, initializers=(), opset=18) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def op_types(model: onnx.ModelProto) -> list[str]:
    return [node.op_type for node in model.graph.node]


def same_outputs(before: onnx.ModelProto, after: onnx.ModelProto, feeds_list) -> None:
    onnx.checker.check_model(after, full_check=True)
    for feeds in feeds_list:
        for old, new in zip(run(before, feeds), run(after, feeds)):
            assert old.shape == new.shape and old.dtype == new.dtype
            np.testing.assert_allclose(new, old, rtol=1e-6, atol=1e-6)


def x_info(dims=("batch", 16)):
    return helper.make_tensor_value_info("x", TensorProto.FLOAT, list(dims))


def feeds_at(*batches):
    rng = np.random.default_rng(0)
    return [{"x": rng.standard_normal((b, 16)).astype(np.float32)} for b in batches]


def test_constant_arithmetic_and_known_shape_values_fold():
    # Shape(x)[1] is 16 though the batch is symbolic; (2 + 3) is 5; both become data.
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "one"], ["width"], axis=0),
        helper.make_node("Unsqueeze", ["width", "zero_axis"], ["width_1d"]),
        helper.make_node("Concat", ["minus_one", "width_1d"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"]),
        helper.make_node("Add", ["two", "three"], ["five"]),
        helper.make_node("Mul", ["r", "five"], ["out"]),
    ]
    initializers = [
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array([0], np.int64), "zero_axis"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(3.0, np.float32), "three"),
    ]
    output = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 16])
    model = model_of(nodes, [x_info()], [output], initializers)
    before = onnx.ModelProto()
    before.CopyFrom(model)
    result = optimize(model)
    # The reshape's target folded to [-1, 16], which the cleanup rules then prove a no-op.
    assert op_types(model) == ["Mul"]
    assert result.folded >= 2 and result.nodes_before == 7 and result.nodes_after == 1
    # The inputs of what folded are read by nothing now, and are gone.
    assert sorted(t.name for t in model.graph.initializer if t.name in ("one", "two", "three")) == []
    same_outputs(before, model, feeds_at(2, 5))


def test_unknown_dims_and_random_ops_do_not_fold():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["batch"], axis=0),  # the symbolic batch
        helper.make_node("Unsqueeze", ["batch", "zero_axis"], ["batch_1d"]),
        helper.make_node("RandomUniform", [], ["noise"], shape=[1], dtype=TensorProto.FLOAT, seed=1.0),
        helper.make_node("Mul", ["noise", "zero_f"], ["nothing"]),
        helper.make_node("Cast", ["batch_1d"], ["batch_f"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["batch_f", "nothing"], ["out"]),
    ]
    initializers = [
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array([0], np.int64), "zero_axis"),
        numpy_helper.from_array(np.array([0.0], np.float32), "zero_f"),
    ]
    model = model_of(nodes, [x_info()], [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1])], initializers)
    before = onnx.ModelProto()
    before.CopyFrom(model)
    result = optimize(model)
    assert result.folded == 0
    assert op_types(model) == op_types(before)
    same_outputs(before, model, feeds_at(3, 4))


def test_a_folded_value_larger_than_the_limit_is_not_stored_again():
    weight = np.arange(512 * 512, dtype=np.float32).reshape(512, 512)  # 1 MiB
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "wt"], ["out"])]
    model = model_of(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 512])],
                     [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 512])],
                     [numpy_helper.from_array(weight, "w")])
    small = onnx.ModelProto()
    small.CopyFrom(model)
    optimize(model, fold_limit_bytes=1 << 19)
    assert op_types(model) == ["Transpose", "MatMul"]
    optimize(small, fold_limit_bytes=1 << 21)
    assert op_types(small) == ["MatMul"]
    assert [t.name for t in small.graph.initializer] != ["w"]  # the transposed weight replaced it
    feeds = [{"x": np.ones((2, 512), np.float32)}]
    same_outputs(model, small, feeds)


def test_a_weight_left_on_disk_is_never_read_to_fold(tmp_path, monkeypatch):
    weight = np.ones((64, 64), np.float32)
    nodes = [helper.make_node("Neg", ["w"], ["nw"]), helper.make_node("MatMul", ["x", "nw"], ["out"])]
    model = model_of(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                     [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
                     [numpy_helper.from_array(weight, "w")])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="m.data", size_threshold=0)
    monkeypatch.setattr(onnx_files, "EXTERNAL_READ_LIMIT", 1024)  # below the weight's 16 KiB
    lazy, _ = onnx_files.read_onnx(path)
    result = optimize(lazy)
    assert result.folded == 0 and op_types(lazy) == ["Neg", "MatMul"]


def test_prune_model_keeps_what_a_subgraph_reads_and_drops_the_rest():
    then_graph = helper.make_graph([helper.make_node("Add", ["x", "outer"], ["t"])], "then", [],
                                   [helper.make_tensor_value_info("t", TensorProto.FLOAT, ["batch", 16])])
    else_graph = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                                   [helper.make_tensor_value_info("e", TensorProto.FLOAT, ["batch", 16])])
    nodes = [helper.make_node("If", ["flag"], ["out"], then_branch=then_graph, else_branch=else_graph)]
    initializers = [numpy_helper.from_array(np.array(1.0, np.float32), "outer"),
                    numpy_helper.from_array(np.array(7.0, np.float32), "unused")]
    model = model_of(nodes, [x_info(), helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                     [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 16])], initializers)
    model.graph.value_info.append(helper.make_tensor_value_info("gone", TensorProto.FLOAT, None))
    assert prune_model(model) == 1
    assert [t.name for t in model.graph.initializer] == ["outer"]
    assert [v.name for v in model.graph.value_info] == []
    onnx.checker.check_model(model, full_check=True)


def test_folding_counts_only_what_it_replaces():
    # A node of all-constant inputs whose output nothing reads is left to pruning.
    nodes = [helper.make_node("Add", ["two", "two"], ["dead"]), helper.make_node("Relu", ["x"], ["out"])]
    model = model_of(nodes, [x_info()], [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
                     [numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    adapter = OnnxAdapter(model, None)
    assert fold_constants(adapter) == 0


@pytest.mark.parametrize("entry", MANIFEST["files"], ids=[e["file"] for e in MANIFEST["files"]])
def test_optimize_on_exported_models(entry):
    model = onnx.load(str(MODELS / entry["file"]))
    before = onnx.ModelProto()
    before.CopyFrom(model)
    feeds = [_feeds(entry, shape, seed) for seed, shape in enumerate(entry["test_shapes"])]
    result = optimize(model)
    assert result.nodes_after <= result.nodes_before
    if entry["file"] in ("attention_torchscript.onnx", "llama_torchscript.onnx", "gpt2_torchscript.onnx"):
        assert result.folded > 0  # TorchScript exports compute their shapes at run time
    same_outputs(before, model, feeds)
