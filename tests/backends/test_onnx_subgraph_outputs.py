"""A rewrite inside a subgraph never makes a body return a value it did not compute.

A bypass (`%old -> %x`) whose `%old` is a body output and whose `%x` is a
value of an enclosing graph, or the body's own input or initializer, would
leave "Subgraph output (y) is an outer scope value being returned directly",
which onnxruntime refuses and onnx's full checker rejects. Every shipped
ONNX rule that bypasses is tried here on its own examples, moved into the
bodies of `If`, `Loop` and `Scan` (and an `If` inside a `Loop` body), with
every value the example computes made a body output and the example's
inputs left in the main graph. The output must pass the full checker (run
with `optimize`'s own safeguard off, so that the adapter alone is tested),
the rule must have fired, and onnxruntime must compute the same outputs.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import rewrite
from rewrite.backends.onnx import examples as onnx_examples
from rewrite.backends.onnx import tensors as onnx_tensors
from rewrite.backends.onnx import validation as onnx_validation
from rewrite.examples import SYMBOLIC_SIZES, example_ops, random_input
from rewrite.language import ast
from rewrite.onnx import optimize

_ELEMENT_TYPES = onnx_tensors.ELEMENT_TYPES
RULES = rewrite.load_rules(dialects=["onnx"])


def _bypasses(rule: ast.Rule) -> bool:
    return any(isinstance(action, ast.ReplaceAction) and isinstance(action.replacement, (ast.ValueRef, ast.Index))
               for action in rule.actions)


CASES = [
    (rule, example)
    for rule in RULES.rules if _bypasses(rule)
    for example in rule.examples if example.expected is not None
]
KINDS = ("if", "loop", "scan", "if_in_loop")


def test_the_rules_that_bypass_include_the_ones_found_unsound_in_bodies():
    assert set(FOUND_UNSOUND_IN_BODIES) | {"onnx_remove_identity"} <= {rule.name for rule, _ in CASES}


def _flat(example: ast.Example) -> tuple[onnx.ModelProto, list[str]]:
    inputs = [(s.var.lstrip("%"), s.dtype, s.dims) for s in example.inputs]
    outputs = [var.lstrip("%") for var in example.outputs]
    model = onnx_examples.build_example(inputs, example_ops(example.statements), outputs, opset=example.opset)
    return model, outputs


def _typed(model: onnx.ModelProto, names: list[str]) -> dict[str, onnx.TypeProto]:
    """The types onnx infers for `names` in the flat model."""
    inferred = onnx.shape_inference.infer_shapes(model)
    graph = inferred.graph
    types = {info.name: info.type for info in [*graph.value_info, *graph.output, *graph.input]}
    return {name: types[name] for name in names if name in types}


def _body(model: onnx.ModelProto, suffix: str, values: list[str], extra_inputs=(), extra_nodes=(),
          extra_outputs=()) -> onnx.GraphProto:
    """The example's nodes and constants as a body, renamed apart by `suffix`, outputting every value it computes."""
    produced = {name for node in model.graph.node for name in node.output}
    produced |= {tensor.name for tensor in model.graph.initializer}
    nodes = []
    for node in model.graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name += suffix
        copy.input[:] = [name + suffix if name in produced else name for name in node.input]
        copy.output[:] = [name + suffix for name in node.output]
        nodes.append(copy)
    initializers = []
    for tensor in model.graph.initializer:
        copy = onnx.TensorProto()
        copy.CopyFrom(tensor)
        copy.name += suffix
        initializers.append(copy)
    outputs = [*extra_outputs, *(helper.make_empty_tensor_value_info(name + suffix) for name in values)]
    return helper.make_graph([*extra_nodes, *nodes], "body" + suffix, list(extra_inputs), outputs, initializers)


def _nested(example: ast.Example, kind: str, every_value: bool) -> tuple[onnx.ModelProto, list[str]]:
    """The example inside a body of `kind`, its outputs the example's (or, with `every_value`, every
    value it computes); the names of the main graph's outputs."""
    flat, declared = _flat(example)
    values = [name for node in flat.graph.node for name in node.output if name] if every_value else declared
    types = _typed(flat, values)
    main_inputs = list(flat.graph.input)
    opset = flat.opset_import[0].version
    bool_scalar = helper.make_tensor_value_info
    if kind == "if":
        node = helper.make_node("If", ["flag"], [f"{v}_out" for v in values],
                                then_branch=_body(flat, "_then", values), else_branch=_body(flat, "_else", values))
        main_inputs.append(bool_scalar("flag", TensorProto.BOOL, []))
        nodes, outputs, initializers = [node], [f"{v}_out" for v in values], []
    elif kind == "loop":
        body = _loop_body(flat, "_loop", values)
        node = helper.make_node("Loop", ["trips", ""], [f"{v}_out" for v in values], body=body)
        nodes, outputs = [node], [f"{v}_out" for v in values]
        initializers = [numpy_helper.from_array(np.array(2, np.int64), "trips")]
    elif kind == "scan":
        step = helper.make_tensor_value_info("step", TensorProto.FLOAT, [1])
        body = _body(flat, "_scan", values, extra_inputs=[step])
        node = helper.make_node("Scan", ["steps"], [f"{v}_out" for v in values], body=body, num_scan_inputs=1)
        main_inputs.append(helper.make_tensor_value_info("steps", TensorProto.FLOAT, [2, 1]))
        nodes, outputs, initializers = [node], [f"{v}_out" for v in values], []
    else:  # an If inside a Loop body: two levels deep
        inner = helper.make_node("If", ["flag"], [f"{v}_inner" for v in values],
                                 then_branch=_body(flat, "_then", values), else_branch=_body(flat, "_else", values))
        body = helper.make_graph(
            [helper.make_node("Identity", ["cond_in"], ["cond_out"]), inner], "loop_body",
            [bool_scalar("iteration", TensorProto.INT64, []), bool_scalar("cond_in", TensorProto.BOOL, [])],
            [bool_scalar("cond_out", TensorProto.BOOL, []),
             *(helper.make_empty_tensor_value_info(f"{v}_inner") for v in values)],
        )
        node = helper.make_node("Loop", ["trips", ""], [f"{v}_out" for v in values], body=body)
        main_inputs.append(bool_scalar("flag", TensorProto.BOOL, []))
        nodes, outputs = [node], [f"{v}_out" for v in values]
        initializers = [numpy_helper.from_array(np.array(2, np.int64), "trips")]
    graph = helper.make_graph(nodes, "nested", main_inputs, [helper.make_empty_tensor_value_info(o) for o in outputs],
                              initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    _type_outputs(model, values, types, kind)
    return model, outputs


def _loop_body(flat, suffix, values) -> onnx.GraphProto:
    return _body(
        flat, suffix, values,
        extra_inputs=[helper.make_tensor_value_info("iteration", TensorProto.INT64, []),
                      helper.make_tensor_value_info("cond_in", TensorProto.BOOL, [])],
        extra_nodes=[helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        extra_outputs=[helper.make_tensor_value_info("cond_out", TensorProto.BOOL, [])],
    )


def _type_outputs(model: onnx.ModelProto, values, types, kind: str) -> None:
    """The main outputs typed as onnx infers them (the checker wants them typed); a loop or scan stacks a step axis."""
    for output, value in zip(model.graph.output, values):
        if value not in types:
            continue
        output.type.CopyFrom(types[value])
        if kind != "if" and output.type.tensor_type.HasField("shape"):
            dims = list(output.type.tensor_type.shape.dim)
            output.type.tensor_type.shape.ClearField("dim")
            output.type.tensor_type.shape.dim.add().dim_value = 2
            for dim in dims:
                output.type.tensor_type.shape.dim.add().CopyFrom(dim)


def _feeds(example: ast.Example, size: int, kind: str) -> dict:
    rng = np.random.default_rng(size)
    feeds = {}
    for statement in example.inputs:
        shape = tuple(size if isinstance(d, str) else d for d in statement.dims)
        feeds[statement.var.lstrip("%")] = random_input(rng, statement.dtype, shape)
    if kind in ("if", "if_in_loop"):
        feeds["flag"] = np.array(size % 2 == 0)
    if kind == "scan":
        feeds["steps"] = np.zeros((2, 1), np.float32)
    return feeds


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    """onnxruntime's outputs, or the reference evaluator's for an op onnxruntime has no kernel for at the opset."""
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    try:
        session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except onnxruntime.capi.onnxruntime_pybind11_state.NotImplemented:
        from onnx.reference import ReferenceEvaluator

        return [np.asarray(value) for value in ReferenceEvaluator(model).run(None, feeds)]
    return session.run(None, feeds)


def _count(model: onnx.ModelProto, op_type: str) -> int:
    return rewrite.backends.onnx.count_nodes(model, op_type)


FIRED_WITH_EVERY_VALUE_AN_OUTPUT: set[tuple[str, str]] = set()


@pytest.mark.parametrize("every_value", [False, True], ids=["outputs", "every-value-out"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("rule", "example"), CASES, ids=[f"{r.name}-{i}" for i, (r, _) in enumerate(CASES)])
def test_a_bypass_in_a_body_leaves_a_valid_model_with_the_same_values(rule, example, kind, every_value):
    """With the example's own outputs the rule fires as it does in the main graph; with every value a body
    output it may not (a rule may keep what a body returns), but whatever it does leaves a valid model."""
    opset = example.opset if isinstance(example.opset, int) else 18
    if kind in ("loop", "if_in_loop") and opset < 11 or kind == "scan" and opset < 9:
        pytest.skip(f"no {kind} without loop-carried values at opset {opset}; its If case covers it")
    flat, _ = _flat(example)
    if onnx_validation.problem(flat) is not None:
        pytest.skip("onnx's checker cannot type the example at its opset (1 or 2), so not its nested twin either")
    model, _ = _nested(example, kind, every_value)
    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.checker.ValidationError as error:  # the construction's own fault, not the rule's
        pytest.fail(f"the nested example is not valid to begin with: {error}")
    before = onnx.ModelProto()
    before.CopyFrom(model)
    anchors = sorted(rule.anchor.pattern.types)
    anchored_before = sum(_count(model, t) for t in anchors)
    result = optimize(model, rules=RULES.only(rule.name), fold=False, prune_dead=False,
                      constants_as_initializers=False, max_rounds=1, validate=False, assume=rule.assumption_names)
    fired = result.statistics.fired(rule.name)
    if every_value:
        if fired:
            FIRED_WITH_EVERY_VALUE_AN_OUTPUT.add((rule.name, kind))
    else:
        assert fired >= 1, "the rule did not fire in the body"
        assert sum(_count(model, t) for t in anchors) < anchored_before
    onnx.checker.check_model(model, full_check=True)
    for size in SYMBOLIC_SIZES:
        feeds = _feeds(example, size, kind)
        for old, new in zip(_run(before, feeds), _run(model, feeds)):
            assert old.shape == new.shape and old.dtype == new.dtype
            if old.dtype.kind in "fc":
                np.testing.assert_allclose(new, old, rtol=1e-5, atol=1e-6)
            else:
                np.testing.assert_array_equal(new, old)


FOUND_UNSOUND_IN_BODIES = (
    "onnx_remove_mul_by_one", "onnx_remove_div_by_one", "onnx_remove_noop_cast", "onnx_remove_noop_reshape",
    "onnx_remove_noop_expand", "onnx_remove_identity_transpose", "onnx_remove_inference_dropout",
    "onnx_remove_max_min_of_one_value",
)


def test_the_rules_once_unsound_in_bodies_fired_on_a_value_the_body_returns():
    """The cases above with every value a body output tried these rules where the bug was: else they proved nothing."""
    if not FIRED_WITH_EVERY_VALUE_AN_OUTPUT:
        pytest.skip("run with the parametrized cases above")
    missing = [(name, kind) for name in FOUND_UNSOUND_IN_BODIES for kind in KINDS
               if (name, kind) not in FIRED_WITH_EVERY_VALUE_AN_OUTPUT]
    assert not missing
