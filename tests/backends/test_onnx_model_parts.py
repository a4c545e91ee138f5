"""The parts of a model beyond its inference graph survive `optimize`, and each keeps its meaning.

Model-local functions and `training_info` through `--opset`; what training
reads and writes through pruning and folding; ops that may do more than
compute (custom domains, unknown schemas, no outputs); sparse initializers;
and IR versions below 4, where every initializer is listed as a graph input
and is a constant. Every model is checked with onnx's full checker, and its
values with onnxruntime (or onnx's reference evaluator where onnxruntime
has no kernel), before and after.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from rewrite.backends.onnx import count_nodes
from rewrite.backends.onnx.validation import problem
from rewrite.cli import main
from rewrite.engine.interfaces import ModelError
from rewrite.onnx import convert_opset, optimize

FLOAT = TensorProto.FLOAT


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _same(before: onnx.ModelProto, after: onnx.ModelProto, feeds: dict) -> None:
    """`after` is as valid as `before` (onnx's checker finds nothing new) and computes the same."""
    assert problem(after) in (None, problem(before))
    for old, new in zip(_run(before, feeds), _run(after, feeds)):
        assert old.shape == new.shape and old.dtype == new.dtype
        np.testing.assert_allclose(new, old, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------ functions and training_info through --opset


def _with_function_and_training(opset: int = 11) -> onnx.ModelProto:
    """A local function (ReduceSum with an `axes` attribute, which opset 13 made an input) and a training
    algorithm that updates the weight `w` (ReduceSum again)."""
    two = numpy_helper.from_array(np.array(2.0, np.float32))
    function = helper.make_function(
        "local", "SumScaled", ["x"], ["y"],
        [helper.make_node("Constant", [], ["two"], value=two), helper.make_node("Mul", ["x", "two"], ["m"]),
         helper.make_node("ReduceSum", ["m"], ["y"], axes=[0], keepdims=1)],
        [helper.make_opsetid("", opset)],
    )
    weight = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("SumScaled", ["x"], ["y"], domain="local"), helper.make_node("Mul", ["y", "w"], ["z"])],
        "g", [helper.make_tensor_value_info("x", FLOAT, [2])], [helper.make_tensor_value_info("z", FLOAT, [2])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("local", 1)],
                              functions=[function])
    algorithm = helper.make_graph(
        [helper.make_node("ReduceSum", ["w"], ["total"], axes=[0], keepdims=1),
         helper.make_node("Sub", ["w", "total"], ["w_next"])],
        "algorithm", [], [helper.make_tensor_value_info("w_next", FLOAT, [2])],
    )
    training = model.training_info.add()
    training.algorithm.CopyFrom(algorithm)
    binding = training.update_binding.add()
    binding.key, binding.value = "w", "w_next"
    return model


def test_opset_conversion_keeps_and_converts_functions_and_training_info():
    model = _with_function_and_training()
    assert problem(model) is None
    before = _copy(model)
    convert_opset(model, 18)
    assert [entry.version for entry in model.opset_import if entry.domain == ""] == [18]
    (function,) = model.functions
    assert [entry.version for entry in function.opset_import if entry.domain == ""] == [18]
    reduce = next(node for node in function.node if node.op_type == "ReduceSum")
    assert len(reduce.input) == 2 and not any(a.name == "axes" for a in reduce.attribute)  # axes became an input
    (training,) = model.training_info
    assert [(b.key, b.value) for b in training.update_binding] == [("w", "w_next")]
    reduce = next(node for node in training.algorithm.node if node.op_type == "ReduceSum")
    assert len(reduce.input) == 2
    assert {name for node in training.algorithm.node for name in node.input} >= {"w"}  # still reads the weight
    _same(before, model, {"x": np.array([1.0, 3.0], np.float32)})


def test_optimize_with_an_opset_keeps_them_and_the_training_weight_stays():
    model = _with_function_and_training()
    before = _copy(model)
    optimize(model, 18)
    assert len(model.functions) == 1 and len(model.training_info) == 1
    assert [t.name for t in model.graph.initializer] == ["w"]
    _same(before, model, {"x": np.array([1.0, 3.0], np.float32)})


def test_a_function_the_converter_cannot_convert_is_refused_by_name_and_the_model_kept():
    model = _with_function_and_training()
    # Upsample has no adapter to opset 18 in onnx's converter once it is gone (opset 10 deprecated it).
    model.functions[0].node.append(helper.make_node("Upsample", ["y", "scales"], ["u"], mode="nearest"))
    original = model.SerializeToString()
    with pytest.raises(ModelError, match="the function 'local:SumScaled'"):
        convert_opset(model, 18)
    assert model.SerializeToString() == original


def test_the_cli_converts_with_functions(tmp_path):
    source, target = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(_with_function_and_training(), source)
    assert main(["apply", str(source), "-o", str(target), "--opset", "18"]) == 0
    out = onnx.load(target)
    assert len(out.functions) == 1 and len(out.training_info) == 1
    _same(onnx.load(source), out, {"x": np.array([1.0, 3.0], np.float32)})


# ------------------------------------------------------------------ what training reads and writes


def test_an_initializer_only_training_reads_is_kept():
    model = _with_function_and_training()
    model.graph.initializer.append(numpy_helper.from_array(np.array([0.5, 0.5], np.float32), "rate"))
    model.training_info[0].algorithm.node[1].input[1] = "scaled"
    model.training_info[0].algorithm.node.insert(1, helper.make_node("Mul", ["total", "rate"], ["scaled"]))
    assert problem(model) is None
    optimize(model)
    assert {t.name for t in model.graph.initializer} == {"w", "rate"}
    assert problem(model) is None


def test_a_weight_training_updates_is_not_folded_as_a_constant():
    # z = x * w with w all ones: Mul by one, were w a constant; training rewrites it, so it is not.
    model = _with_function_and_training()
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.ones(2, np.float32), "w"))
    model.graph.node[1].input[0] = "x"
    del model.graph.node[0]
    del model.functions[:]
    assert problem(model) is None
    nodes = count_nodes(model)
    result = optimize(model)
    assert result.statistics.fired("onnx_remove_mul_by_one") == 0
    assert count_nodes(model) == nodes
    # Without the training graph the same model loses its Mul.
    del model.training_info[:]
    result = optimize(model)
    assert result.statistics.fired("onnx_remove_mul_by_one") == 1


def test_a_node_output_training_reads_keeps_its_name():
    # The algorithm reads `y`, a node output that the rules would otherwise bypass (Identity).
    model = _with_function_and_training()
    model.graph.node.insert(1, helper.make_node("Identity", ["y"], ["y_id"]))
    model.graph.node[2].input[0] = "y_id"
    model.training_info[0].algorithm.node[0].input[0] = "y_id"
    model.training_info[0].algorithm.output[0].type.tensor_type.shape.dim[0].dim_value = 2
    before = _copy(model)
    optimize(model)
    defined = {name for node in model.graph.node for name in node.output}
    assert "y_id" in defined
    _same(before, model, {"x": np.array([1.0, 3.0], np.float32)})


# ------------------------------------------------------------------ side effects


def _with_custom(node: onnx.NodeProto, opset_imports=()) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), node, helper.make_node("Neg", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", FLOAT, [2])], [helper.make_tensor_value_info("y", FLOAT, [2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), *opset_imports])


def test_a_custom_op_without_outputs_is_kept_and_a_dead_standard_op_is_not():
    model = _with_custom(helper.make_node("Print", ["r"], [], domain="com.acme"),
                         [helper.make_opsetid("com.acme", 1)])
    optimize(model)
    assert [node.op_type for node in model.graph.node] == ["Relu", "Print", "Neg"]


def test_a_dead_op_of_unknown_schema_is_kept():
    model = _with_custom(helper.make_node("Log", ["r"], ["unused"], domain="com.acme"),
                         [helper.make_opsetid("com.acme", 1)])
    optimize(model)
    assert [node.op_type for node in model.graph.node] == ["Relu", "Log", "Neg"]


def test_a_dead_standard_op_goes():
    model = _with_custom(helper.make_node("Sigmoid", ["r"], ["unused"]))
    before = _copy(model)
    optimize(model)
    assert [node.op_type for node in model.graph.node] == ["Neg"]
    _same(before, model, {"x": np.array([1.0, -3.0], np.float32)})


def test_a_dead_call_of_a_pure_local_function_goes_and_of_an_impure_one_stays():
    pure = helper.make_function("local", "Twice", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
                                [helper.make_opsetid("", 17)])
    impure = helper.make_function("local", "Logged", ["a"], ["b"],
                                  [helper.make_node("Print", ["a"], [], domain="com.acme"),
                                   helper.make_node("Identity", ["a"], ["b"])],
                                  [helper.make_opsetid("", 17), helper.make_opsetid("com.acme", 1)])
    for function, kept in ((pure, False), (impure, True)):
        model = _with_custom(helper.make_node(function.name, ["r"], ["unused"], domain="local"),
                             [helper.make_opsetid("local", 1), helper.make_opsetid("com.acme", 1)])
        model.functions.append(function)
        optimize(model)
        assert ("local", function.name) in {(n.domain, n.op_type) for n in model.graph.node} or not kept
        assert (function.name in [n.op_type for n in model.graph.node]) == kept


# ------------------------------------------------------------------ sparse initializers


def _sparse(values, indices, dims, name) -> onnx.SparseTensorProto:
    return helper.make_sparse_tensor(
        numpy_helper.from_array(np.asarray(values, np.float32), name),
        numpy_helper.from_array(np.asarray(indices, np.int64), name + "_indices"), dims)


def _with_sparse(values, indices) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "sw"], ["m"]), helper.make_node("Relu", ["m"], ["y"])], "g",
        [helper.make_tensor_value_info("x", FLOAT, ["batch", 4])], [helper.make_tensor_value_info("y", FLOAT,
                                                                                                 ["batch", 4])],
    )
    graph.sparse_initializer.append(_sparse(values, indices, [4], "sw"))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_sparse_initializer_is_read_as_its_dense_value_and_kept_sparse():
    # onnx's checker types a sparse initializer as a sparse tensor, which no standard op takes; onnxruntime
    # reads it as the dense tensor it stands for. The model must come out as onnxruntime read it.
    feeds = {"x": np.arange(8, dtype=np.float32).reshape(2, 4) - 3}
    model = _with_sparse([2.0, -1.0], [1, 3])
    before = _copy(model)
    optimize(model)
    assert [node.op_type for node in model.graph.node] == ["Mul", "Relu"]
    assert len(model.graph.sparse_initializer) == 1 and not len(model.graph.initializer)
    _same(before, model, feeds)
    # All ones, at every index: x * 1, and the sparse tensor read as one says so.
    ones = _with_sparse([1.0, 1.0, 1.0, 1.0], [0, 1, 2, 3])
    before = _copy(ones)
    result = optimize(ones)
    assert result.statistics.fired("onnx_remove_mul_by_one") == 1
    assert [node.op_type for node in ones.graph.node] == ["Relu"]
    assert not len(ones.graph.sparse_initializer)  # unread now: pruned
    _same(before, ones, feeds)


def test_a_sparse_initializer_with_coordinate_indices():
    model = _with_sparse([1.0, 1.0, 1.0, 1.0], [[0], [1], [2], [3]])
    result = optimize(model)
    assert result.statistics.fired("onnx_remove_mul_by_one") == 1


def test_a_sparse_initializer_whose_indices_do_not_fit_is_a_clear_error():
    model = _with_sparse([1.0, 1.0], [0, 9])
    with pytest.raises(ModelError, match="initializer 'sw' cannot be read.*outside its shape"):
        optimize(model)


# ------------------------------------------------------------------ IR versions below 4


def _ir3(listed: bool = True) -> onnx.ModelProto:
    """IR 3, opset 8: y = (x * ones) + (2 + 3), the constants initializers listed as graph inputs."""
    initializers = [numpy_helper.from_array(np.ones(4, np.float32), "ones"),
                    numpy_helper.from_array(np.array([2.0], np.float32), "two"),
                    numpy_helper.from_array(np.array([3.0], np.float32), "three"),
                    numpy_helper.from_array(np.array([7.0], np.float32), "unused")]
    inputs = [helper.make_tensor_value_info("x", FLOAT, [2, 4])]
    if listed:
        inputs += [helper.make_tensor_value_info(t.name, FLOAT, list(t.dims)) for t in initializers]
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "ones"], ["m"]), helper.make_node("Add", ["two", "three"], ["five"]),
         helper.make_node("Add", ["m", "five"], ["y"])],
        "g", inputs, [helper.make_tensor_value_info("y", FLOAT, [2, 4])], initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)])
    model.ir_version = 3
    return model


def test_below_ir_4_initializers_are_constants_and_the_output_lists_every_initializer():
    model = _ir3()
    assert problem(model) is None
    before = _copy(model)
    result = optimize(model)
    assert not result.overridable_initializers and result.listed_initializers == 4
    assert [node.op_type for node in model.graph.node] == ["Add"]
    assert model.ir_version == 3
    listed = {info.name for info in model.graph.input}
    assert {t.name for t in model.graph.initializer} <= listed
    assert "unused" not in listed and "ones" not in listed  # gone with their initializers
    assert problem(model) is None
    feeds = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}
    _same(before, model, feeds)


def test_below_ir_4_initializers_may_be_kept_overridable():
    model = _ir3()
    result = optimize(model, overridable_initializers=True)
    assert result.overridable_initializers
    assert [node.op_type for node in model.graph.node] == ["Mul", "Add", "Add"]
    assert {info.name for info in model.graph.input} == {"x", "ones", "two", "three", "unused"}


def test_from_ir_4_on_a_listed_initializer_stays_an_input():
    model = _ir3()
    model.ir_version = 4
    optimize(model)
    assert [node.op_type for node in model.graph.node] == ["Mul", "Add", "Add"]
    # Unlisted, the same initializers fold.
    model = _ir3(listed=False)
    model.ir_version = 4
    optimize(model)
    assert [node.op_type for node in model.graph.node] == ["Add"]


def test_the_cli_says_which_semantics_it_used(tmp_path, capsys):
    source = tmp_path / "ir3.onnx"
    onnx.save(_ir3(), source)
    assert main(["apply", str(source), "-o", str(tmp_path / "a.onnx")]) == 0
    assert "IR version below 4: 4 initializers the graph lists as inputs taken as constants" in capsys.readouterr().err
    assert main(["apply", str(source), "-o", str(tmp_path / "b.onnx"), "--overridable-initializers"]) == 0
    assert "kept as inputs a user may override" in capsys.readouterr().err
    assert count_nodes(onnx.load(tmp_path / "b.onnx")) == 3


# ------------------------------------------------------------------ quantized models


def test_a_qdq_model_keeps_its_weights_quantized():
    rng = np.random.default_rng(0)
    initializers = [numpy_helper.from_array(rng.integers(-100, 100, (16, 16)).astype(np.int8), "wq"),
                    numpy_helper.from_array(np.array(0.02, np.float32), "scale"),
                    numpy_helper.from_array(np.array(0, np.int8), "zero")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "scale", "zero"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "scale", "zero"], ["wd"]),
             helper.make_node("MatMul", ["xd", "wd"], ["y"])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", FLOAT, [2, 16])],
                              [helper.make_tensor_value_info("y", FLOAT, [2, 16])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    before = _copy(model)
    optimize(model)
    assert [node.op_type for node in model.graph.node] == [node.op_type for node in nodes]
    assert {t.name: t.data_type for t in model.graph.initializer}["wq"] == TensorProto.INT8
    _same(before, model, {"x": rng.standard_normal((2, 16)).astype(np.float32)})


def test_the_json_report_says_which_semantics_it_used(tmp_path, capsys):
    import json

    source = tmp_path / "ir3.onnx"
    onnx.save(_ir3(), source)
    assert main(["apply", str(source), "-o", str(tmp_path / "a.onnx"), "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["listed_initializers"] == 4 and report["initializers_overridable"] is False
    assert "note" not in captured.err
