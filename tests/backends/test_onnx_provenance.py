"""Which node's shape inference lost a dim (`Adapter.unknown_dim_origin`): ONNX
through the axes `onnx_shapes` maps, MIL's walk, and `explain` naming it."""

from __future__ import annotations

from onnx import TensorProto, helper

import rewrite
from rewrite.backends.onnx import OnnxAdapter
from rewrite.engine.explain import explain, format_text
from rewrite.language.logic import UNKNOWN, Symbol
from rewrite.predicates import registered_predicates
from tests.backends.test_onnx import _ints, _model, _tensor

FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


def _node(adapter, output):
    return adapter.main.values[output].producer


def _value(adapter, name):
    return adapter.main.values[name]


def test_a_reshape_to_a_runtime_shape_is_where_the_dims_were_lost():
    model = _model(
        [helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("Neg", ["r"], ["n"]),
         helper.make_node("Relu", ["n"], ["out"])],
        [_tensor("x", FLOAT, [2, 8]), _tensor("s", INT64, [2])], [_tensor("out", FLOAT, ["a", "b"])],
    )
    adapter = OnnxAdapter(model)
    assert adapter.shape(_value(adapter, "n")) == (UNKNOWN, UNKNOWN)
    reshape = _node(adapter, "r")
    assert adapter.unknown_dim_origin(_value(adapter, "n"), 0) is reshape
    assert adapter.unknown_dim_origin(_value(adapter, "n"), 1) is reshape
    assert adapter.unknown_dim_origin(_value(adapter, "r"), -1) is reshape


def test_a_transpose_maps_the_axis_through_its_perm():
    # Reshape(x: [n, 8], [-1, 3]) is (?, 3): n * 8 / 3 is not a product of known dims. Transposed, (3, ?).
    model = _model(
        [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0])],
        [_tensor("x", FLOAT, ["n", 8])], [_tensor("t", FLOAT, [3, None])], [_ints("shape", [-1, 3])],
    )
    adapter = OnnxAdapter(model)
    transposed = _value(adapter, "t")
    assert adapter.shape(transposed) == (3, UNKNOWN)
    assert adapter.unknown_dim_origin(transposed, 1) is _node(adapter, "r")
    assert adapter.unknown_dim_origin(transposed, 0) is None  # 3 is known: nothing lost it


def test_an_input_declared_unknown_is_lost_by_no_node():
    model = _model(
        [helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Add", ["n", "y"], ["out"])],
        [_tensor("x", FLOAT, [None, 8]), _tensor("y", FLOAT, [8])], [_tensor("out", FLOAT, [None, 8])],
    )
    adapter = OnnxAdapter(model)
    assert adapter.shape(_value(adapter, "out"))[0] is UNKNOWN
    assert adapter.unknown_dim_origin(_value(adapter, "out"), 0) is None


def test_a_node_with_no_inference_rule_lost_what_its_inputs_had():
    # An op of another domain has no inference: only the exporter's declaration, with no dims, types its output.
    graph = helper.make_graph(
        [helper.make_node("Thing", ["x"], ["f"], domain="com.example"), helper.make_node("Neg", ["f"], ["out"])],
        "g", [_tensor("x", FLOAT, [2, 3, 4])], [_tensor("out", FLOAT, [None, None])],
        value_info=[_tensor("f", FLOAT, [None, None])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.example", 1)])
    adapter = OnnxAdapter(model)
    assert adapter.unknown_dim_origin(_value(adapter, "out"), 0) is _node(adapter, "f")


def test_a_data_dependent_dim_is_lost_by_its_op():
    # NonZero's count of elements is known only at run time; onnx's own inference says so too.
    model = _model(
        [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Neg", ["nz"], ["out"])],
        [_tensor("x", FLOAT, [2, 3, 4])], [_tensor("out", INT64, [3, None])],
    )
    adapter = OnnxAdapter(model)
    assert adapter.shape(_value(adapter, "out")) == (3, UNKNOWN)
    assert adapter.unknown_dim_origin(_value(adapter, "out"), 1) is _node(adapter, "nz")
    assert adapter.unknown_dim_origin(_value(adapter, "out"), 0) is None


def test_a_slice_keeps_the_axes_it_does_not_cut_and_is_where_a_cut_one_was_lost():
    # x[:, s:e] with run-time bounds: axis 0 stays n, axis 1 is lost by the Slice.
    model = _model(
        [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["sl"]), helper.make_node("Relu", ["sl"], ["out"])],
        [_tensor("x", FLOAT, ["n", 8]), _tensor("starts", INT64, [1]), _tensor("ends", INT64, [1])],
        [_tensor("out", FLOAT, ["n", None])], [_ints("axes", [1])],
    )
    adapter = OnnxAdapter(model)
    out = _value(adapter, "out")
    assert adapter.shape(out) == (Symbol("n"), UNKNOWN)
    assert adapter.unknown_dim_origin(out, 1) is _node(adapter, "sl")
    assert adapter.unknown_dim_origin(out, 0) is None


def test_symbols_are_not_unknown():
    model = _model([helper.make_node("Neg", ["x"], ["out"])], [_tensor("x", FLOAT, ["n", 8])],
                   [_tensor("out", FLOAT, ["n", 8])])
    adapter = OnnxAdapter(model)
    assert adapter.shape(_value(adapter, "out"))[0] == Symbol("n")
    assert adapter.unknown_dim_origin(_value(adapter, "out"), 0) is None


def test_explain_names_the_reshape_a_shipped_rule_could_not_see_through():
    # Expand into an Add whose other operand went through a Reshape to a runtime shape.
    model = _model(
        [helper.make_node("Expand", ["x", "shape"], ["e"]), helper.make_node("Reshape", ["z", "s"], ["y"]),
         helper.make_node("Add", ["e", "y"], ["out"])],
        [_tensor("x", FLOAT, [1, 16]), _tensor("z", FLOAT, [4, 16]), _tensor("s", INT64, [2])],
        [_tensor("out", FLOAT, [4, 16])], [_ints("shape", [4, 16])],
    )
    rules = rewrite.load_rules(dialects=["onnx"]).only("remove_broadcast_expand").rules
    (item,) = explain(rules, OnnxAdapter(model), registered_predicates())
    assert not item.fired and item.truth == "unknown"
    assert item.failed == "aligned_dim(other, axis, of=%e) == dim(%e, axis)"
    assert item.origins == ("dim 0 of %y(?, ?) was lost by the shape inference of 'Reshape(y)' (Reshape)",)
    assert "  unknown: dim 0 of %y(?, ?) was lost by the shape inference of 'Reshape(y)' (Reshape)" in (
        format_text([item]).splitlines())


def test_explain_names_no_node_where_the_dims_are_known():
    model = _model(
        [helper.make_node("Expand", ["x", "shape"], ["e"]), helper.make_node("Add", ["e", "y"], ["out"])],
        [_tensor("x", FLOAT, [1, 16]), _tensor("y", FLOAT, ["c", 16])],
        [_tensor("out", FLOAT, [4, 16])], [_ints("shape", [4, 16])],
    )
    rules = rewrite.load_rules(dialects=["onnx"]).only("remove_broadcast_expand").rules
    (item,) = explain(rules, OnnxAdapter(model), registered_predicates())
    assert not item.fired and item.origins == ()


def test_mil_walks_to_the_op_that_lost_the_dim(monkeypatch):
    from coremltools.converters.mil import Builder as mb

    from rewrite.backends.mil import MilAdapter

    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 4))])
    def program(x):
        return mb.relu(x=mb.exp(x=x))

    adapter = MilAdapter(program)
    relu = program.functions["main"].outputs[0]
    exp = relu.op.inputs["x"]
    assert adapter.unknown_dim_origin(relu, 0) is None  # every dim is known
    # coremltools infers MIL types as it builds; an unknown dim is what a
    # frontend leaves. Stand one in for exp's output and what follows it.
    known = adapter.shape
    monkeypatch.setattr(adapter, "shape", lambda value: (UNKNOWN, 4) if value in (exp, relu) else known(value))
    assert adapter.unknown_dim_origin(relu, 0) is exp.op
    assert adapter.unknown_dim_origin(relu, 1) is None
