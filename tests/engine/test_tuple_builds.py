"""A rewrite builds a variadic operand: a tuple of values and constants, listed or one per element."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper

import rewrite

FLATTEN_MAX = """dialect onnx

# Max(Max(a, b), c) is Max(a, b, c): max is associative. Items listed.
rule flatten_max
  "A Max of a Max is one Max of all their inputs."
  match %outer = Max(%inner = Max(data_0=%parts), %other)
  where one_use(%inner)
  rewrite %outer -> Max(data_0=(%parts[0], %parts[1], %other))
"""

# Builds a Sum's inputs one item per element, in reverse, and a constant
# zero after them: x + y + 0 is x + y (assert_array_equal takes -0 as 0).
REVERSED_SUM = """dialect onnx

rule reversed_sum
  "Sum(a, b, c) is Sum(c, b, a, 0) (a test of tuple building)."
  match %s = Sum(data_0=%parts)
  where len(%parts) == 3 and forall p in %parts: dtype(p) == fp32
  rewrite
    %s -> Sum(data_0=(%parts[len(%parts) - 1 - i] if i < len(%parts) else 0.0 for i in range(len(%parts) + 1)))
"""


def _session(model):
    return onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _model(nodes, inputs, output, output_shape, opset=18):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(output, TensorProto.FLOAT, output_shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_a_listed_tuple_of_values(tmp_path):
    path = tmp_path / "max.rules"
    path.write_text(FLATTEN_MAX)
    nodes = [helper.make_node("Max", ["a", "b"], ["m"], name="inner"),
             helper.make_node("Max", ["m", "c"], ["out"], name="outer")]
    model = _model(nodes, [("a", ["n", 3]), ("b", ["n", 3]), ("c", [1, 3])], "out", ["n", 3])
    rng = np.random.default_rng(0)
    feeds = {k: rng.standard_normal(s).astype(np.float32) for k, s in (("a", (2, 3)), ("b", (2, 3)), ("c", (1, 3)))}
    before = _session(model).run(None, feeds)[0]
    assert rewrite.load_rules(path).apply(model).fired("flatten_max") == 1
    onnx.checker.check_model(model, full_check=True)
    assert [(n.op_type, list(n.input)) for n in model.graph.node] == [("Max", ["a", "b", "c"])]
    np.testing.assert_array_equal(_session(model).run(None, feeds)[0], before)


def test_a_tuple_made_one_item_per_element_with_a_constant(tmp_path):
    path = tmp_path / "sum.rules"
    path.write_text(REVERSED_SUM)
    nodes = [helper.make_node("Sum", ["a", "b", "c"], ["out"], name="sum")]
    model = _model(nodes, [("a", ["n", 3]), ("b", [1, 3]), ("c", ["n", 1])], "out", ["n", 3])
    rng = np.random.default_rng(1)
    feeds = {k: rng.standard_normal(s).astype(np.float32) for k, s in (("a", (2, 3)), ("b", (1, 3)), ("c", (2, 1)))}
    before = _session(model).run(None, feeds)[0]
    assert rewrite.load_rules(path).apply(model).fired("reversed_sum") == 1
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == ["Constant", "Sum"]
    (constant, total) = model.graph.node
    assert list(total.input) == ["c", "b", "a", constant.output[0]]
    np.testing.assert_allclose(_session(model).run(None, feeds)[0], before, rtol=1e-6)


def test_a_tuple_item_without_a_value_means_no_fire(tmp_path):
    """An item that evaluates to nothing (an element past the rest's end) leaves the graph as it was."""
    path = tmp_path / "max.rules"
    path.write_text(FLATTEN_MAX.replace("%parts[1], %other", "%parts[5], %other"))
    nodes = [helper.make_node("Max", ["a", "b"], ["m"], name="inner"),
             helper.make_node("Max", ["m", "c"], ["out"], name="outer")]
    model = _model(nodes, [("a", [2, 3]), ("b", [2, 3]), ("c", [2, 3])], "out", [2, 3])
    statistics = rewrite.load_rules(path).apply(model)
    assert statistics.fired("flatten_max") == 0
    assert [n.op_type for n in model.graph.node] == ["Max", "Max"]


SINGLE_SUM = """dialect onnx

rule single_sum
  "A Sum of one input is that input."
  match %s = Sum(data_0=%parts)
  where len(%parts) == 1 and not block_output(%s)
  rewrite %s -> %parts[POSITION]
"""


def _single_sum_model():
    nodes = [helper.make_node("Sum", ["a"], ["s"], name="sum"), helper.make_node("Relu", ["s"], ["out"], name="relu")]
    return _model(nodes, [("a", ["n", 3])], "out", ["n", 3])


def test_a_replacement_by_one_of_the_bound_values(tmp_path):
    path = tmp_path / "sum.rules"
    path.write_text(SINGLE_SUM.replace("POSITION", "0"))
    model = _single_sum_model()
    feeds = {"a": np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)}
    before = _session(model).run(None, feeds)[0]
    assert rewrite.load_rules(path).apply(model).fired("single_sum") == 1
    assert [(n.op_type, list(n.input)) for n in model.graph.node] == [("Relu", ["a"])]
    np.testing.assert_array_equal(_session(model).run(None, feeds)[0], before)


def test_a_replacement_by_an_element_out_of_range_does_not_fire(tmp_path):
    path = tmp_path / "sum.rules"
    path.write_text(SINGLE_SUM.replace("POSITION", "1"))
    model = _single_sum_model()
    statistics = rewrite.load_rules(path).apply(model)
    assert statistics.fired("single_sum") == 0 and statistics.rules["single_sum"].unevaluable == 1
    assert [n.op_type for n in model.graph.node] == ["Sum", "Relu"]
