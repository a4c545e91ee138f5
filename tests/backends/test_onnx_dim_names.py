"""A model's own `dim_param`s are names, whatever characters they hold (issue 29 item 4).

Symbolic dims are terms: a model's name for a size is a leaf, the engine's
sums, products, mins and broadcasts are trees, and two dims are one only
when they are the same tree. So a `dim_param` spelled like one of the
engine's terms ("(a+b)") is not that term, and every name comes back out of
the backend as it went in.
"""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

import rewrite
from rewrite.backends.onnx import OnnxAdapter
from rewrite.backends.onnx import files as onnx_files
from rewrite.language.logic import Local, Sum, Symbol
from rewrite.onnx import optimize

FLOAT = TensorProto.FLOAT
NAMES = ["(a+b)", "a*b", "-1", "批", "n₁", "broadcast(a,b)", "min(4,s)", "s@x:0"]
RULES = rewrite.load_rules(dialects=["onnx"])


def _dim_params(graph: onnx.GraphProto) -> dict[str, list[str]]:
    infos = [*graph.input, *graph.output, *graph.value_info]
    return {info.name: [d.dim_param or str(d.dim_value) for d in info.type.tensor_type.shape.dim] for info in infos}


@pytest.mark.parametrize("name", NAMES)
def test_a_dim_param_is_a_leaf_and_comes_back_unchanged(name, tmp_path):
    # x * 1 is rewritten to x, so the model is edited and written back.
    nodes = [
        helper.make_node("Relu", ["x"], ["h"]),
        helper.make_node("Mul", ["h", "one"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", FLOAT, [name, 4])],
        [helper.make_tensor_value_info("y", FLOAT, [name, 4])],
        [helper.make_tensor("one", FLOAT, [], [1.0])],
        value_info=[helper.make_tensor_value_info("h", FLOAT, [name, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    before = _dim_params(model.graph)
    adapter = OnnxAdapter(model)
    x, h = adapter.main.values["x"], adapter.main.values["h"]
    assert x.shape == (Symbol(name), 4) and str(x.shape[0]) == name
    assert h.shape == (Symbol(name), 4)  # inferred from x: the declaration only fills in what is unknown

    result = optimize(model, rules=RULES, validate=False)
    assert result.statistics.fires >= 1 and len(model.graph.node) == 1
    path = tmp_path / "out.onnx"
    onnx_files.write_onnx(model, path)
    written, _ = onnx_files.read_onnx(path)
    after = _dim_params(written.graph)
    assert after["x"] == after["y"] == [name, "4"]
    assert {key: value for key, value in before.items() if key in after} == after


def test_an_exporters_dim_param_on_one_value_is_local_to_it():
    # Declared on a value that is not a model input: the name holds for that value's axis alone.
    graph = helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["i"])], "g", [helper.make_tensor_value_info("x", FLOAT, [4])],
        [helper.make_tensor_value_info("i", TensorProto.INT64, [1, "(a+b)"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    dim = OnnxAdapter(model).main.values["i"].shape[1]
    assert dim == Local("(a+b)", "i:1") and str(dim) == "(a+b)@i:1"
    assert dim != Symbol("(a+b)@i:1")


def _expand_model(x_dims):
    """Expand(x, Shape(concat(p, q))): a no-op only where x's first dim is a + b at run time."""
    nodes = [
        helper.make_node("Concat", ["p", "q"], ["pq"], axis=0),
        helper.make_node("Shape", ["pq"], ["s"]),
        helper.make_node("Expand", ["x", "s"], ["e"]),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", FLOAT, x_dims), helper.make_tensor_value_info("p", FLOAT, ["a", 4]),
         helper.make_tensor_value_info("q", FLOAT, ["b", 4])],
        [helper.make_tensor_value_info("e", FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_a_dim_param_spelled_like_a_sum_is_not_the_sum():
    # x's first dim is whatever the user feeds for "(a+b)", 1 say: the Expand then widens x to a + b.
    model = _expand_model(["(a+b)", 4])
    values = OnnxAdapter(model).main.values
    named, computed = values["x"].shape[0], values["pq"].shape[0]
    a, b = Symbol("a"), Symbol("b")
    assert named == Symbol("(a+b)") and computed == Sum(a, b)
    assert str(named) == str(computed) == "(a+b)"
    assert named != computed
    assert values["e"].shape != values["x"].shape
    result = optimize(model, rules=RULES.only("onnx_remove_noop_expand"), validate=False)
    assert result.statistics.fired("onnx_remove_noop_expand") == 0
    assert [node.op_type for node in model.graph.node] == ["Concat", "Shape", "Expand"]


def test_the_computed_sum_is_still_proved_equal_to_itself():
    # The same Expand of a value whose first dim is computed as a + b too: proved a no-op, removed.
    model = _expand_model([4])
    model.graph.node.insert(0, helper.make_node("Concat", ["p", "q"], ["pq2"], axis=0))
    model.graph.node[-1].input[0] = "pq2"
    result = optimize(model, rules=RULES.only("onnx_remove_noop_expand"), validate=False)
    assert result.statistics.fired("onnx_remove_noop_expand") == 1
    assert "Expand" not in [node.op_type for node in model.graph.node]
