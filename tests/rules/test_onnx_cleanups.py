"""The ONNX cleanup rules (rules/onnx/cleanups.rules, rules/onnx/chains.rules) on hand-built models.

Each model has symbolic dims; onnxruntime must give the same outputs before
and after at two input sizes (`rewrite_and_compare`), and the node counts say
what went. The negative cases are the ones each rule must not fire on.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx_cases import BOOL, FLOAT, INT64, OPSET, counts, floats, initializer, node, rewrite_and_compare, run, tensor

import rewrite

ONNX_RULES = rewrite.load_rules(dialects=["onnx"])
INT32, FLOAT16 = TensorProto.INT32, TensorProto.FLOAT16
INT64_MAX = np.iinfo(np.int64).max


def model(nodes, inputs, outputs, initializers=(), opset=OPSET):
    """A checked model; an output declared without a shape is typed by onnx's inference."""
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializer=list(initializers))
    built = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    inferred = {info.name: info.type for info in onnx.shape_inference.infer_shapes(built).graph.output}
    for output in built.graph.output:
        if not output.type.tensor_type.HasField("shape") and output.name in inferred:  # or no dtype either
            output.type.CopyFrom(inferred[output.name])
    onnx.checker.check_model(built, full_check=True)
    return built


def only(*names):
    return ONNX_RULES.only(*names)


def feeds(**shapes):
    """Two feeds of float inputs: `name=(dims at size 2, dims at size 5)`."""
    return [{name: floats(*dims[i], seed=i) for name, dims in shapes.items()} for i in range(2)]


def unchanged(built, rules):
    before = counts(built)
    statistics = rules.apply(built)
    assert statistics.fires == 0 and counts(built) == before
    return statistics


# ---------------------------------------------------------------- Identity


def test_identity_between_expand_and_mul_goes_and_so_does_the_expand():
    # Issue 14: `Expand -> Identity -> Mul` kept its Expand, where `Expand -> Mul` lost it.
    nodes = [
        node("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
        node("Shape", ["x"], ["s"]),
        node("Expand", ["m", "s"], ["e"]),
        node("Identity", ["e"], ["i"]),
        node("Mul", ["x", "i"], ["y"]),
    ]
    built = model(nodes, [tensor("x", FLOAT, ["b", 16])], [tensor("y", FLOAT, ["b", 16])],
                  [initializer("axes", np.array([-1]))])
    outcome = rewrite_and_compare(built, feeds(x=[(2, 16), (5, 16)]), ONNX_RULES)
    assert outcome.before["Identity"] == 1 and outcome.after["Identity"] == 0
    assert outcome.after["Expand"] == 0 and outcome.after["Shape"] == 0


def test_identity_as_graph_output_gives_its_name_to_its_input():
    nodes = [node("Relu", ["x"], ["r"]), node("Identity", ["r"], ["y"])]
    built = model(nodes, [tensor("x", FLOAT, ["b", 4])], [tensor("y", FLOAT, ["b", 4])])
    outcome = rewrite_and_compare(built, feeds(x=[(2, 4), (5, 4)]), only("onnx_remove_identity"))
    assert outcome.fired == 1 and outcome.after == Counter({"Relu": 1})
    assert built.graph.node[0].output[0] == "y"  # the output kept its name


@pytest.mark.parametrize("case", ["graph input", "another output", "an initializer"])
def test_identity_as_output_that_would_need_a_bridge_stays(case):
    # The engine would bridge these with a new Identity: the rule would never settle.
    inputs, initializers, outputs = [tensor("x", FLOAT, ["b", 4])], [], [tensor("y", FLOAT, ["b", 4])]
    if case == "graph input":
        nodes = [node("Identity", ["x"], ["y"])]
    elif case == "another output":
        nodes = [node("Relu", ["x"], ["r"]), node("Identity", ["r"], ["y"])]
        outputs.append(tensor("r", FLOAT, ["b", 4]))
    else:
        nodes = [node("Identity", ["w"], ["i"]), node("Add", ["x", "i"], ["s"]), node("Identity", ["w"], ["y"])]
        outputs = [tensor("s", FLOAT, ["b", 4]), tensor("y", FLOAT, [4])]
        initializers = [initializer("w", np.ones(4, np.float32))]
    built = model(nodes, inputs, outputs, initializers)
    expected = [run(built, f) for f in feeds(x=[(2, 4), (5, 4)])]
    statistics = only("onnx_remove_identity").apply(built)
    assert counts(built)["Identity"] == 1  # only a non-output Identity went
    assert statistics.fires == (1 if case == "an initializer" else 0)
    for f, outputs_before in zip(feeds(x=[(2, 4), (5, 4)]), expected):
        for old, new in zip(outputs_before, run(built, f)):
            np.testing.assert_array_equal(old, new)


def test_identity_inside_an_if_branch_goes():
    def branch(name, op):
        return helper.make_graph([node(op, ["x"], [f"r_{name}"]), node("Identity", [f"r_{name}"], [f"i_{name}"])],
                                 name, [], [tensor(f"i_{name}", FLOAT, ["b", 4])])

    nodes = [node("If", ["flag"], ["y"], then_branch=branch("then", "Relu"), else_branch=branch("else", "Neg"))]
    built = model(nodes, [tensor("x", FLOAT, ["b", 4]), tensor("flag", BOOL, [])], [tensor("y", FLOAT, ["b", 4])])
    cases = [{"x": floats(b, 4, seed=b), "flag": np.array(flag)} for b, flag in ((2, True), (5, False))]
    outcome = rewrite_and_compare(built, cases, only("onnx_remove_identity"))
    assert outcome.fired == 2
    for attribute in built.graph.node[0].attribute:
        assert [n.op_type for n in attribute.g.node] in (["Relu"], ["Neg"])


# ---------------------------------------------------------------- single no-ops


def _one_op(op_type, inputs, initializers=(), opset=18, dtype=FLOAT, dims=("b", "s", 4), typed=False, **attributes):
    """x -> op -> Relu; the output typed by onnx, or as x when `typed` (where onnx cannot infer it)."""
    nodes = [node(op_type, ["x", *inputs], ["o"], **attributes), node("Relu", ["o"], ["y"])]
    output = tensor("y", dtype, list(dims)) if typed else helper.make_empty_tensor_value_info("y")
    return model(nodes, [tensor("x", dtype, list(dims))], [output], initializers, opset=opset)


SIZES = [(2, 3, 4), (5, 1, 4)]


@pytest.mark.parametrize(
    "rule, build",
    [
        ("onnx_remove_noop_cast", lambda: _one_op("Cast", [], to=TensorProto.FLOAT)),
        ("onnx_remove_noop_cast", lambda: _one_op("Cast", [], opset=6, to=TensorProto.FLOAT)),
        ("onnx_remove_noop_expand", lambda: model(
            [node("Shape", ["x"], ["s"]), node("Expand", ["x", "s"], ["o"]), node("Relu", ["o"], ["y"])],
            [tensor("x", FLOAT, ["b", "s", 4])], [tensor("y", FLOAT, None)])),
        ("onnx_remove_noop_expand", lambda: _one_op("Expand", ["ones"], [initializer("ones", np.array([1, 1]))])),
        ("onnx_remove_identity_transpose", lambda: _one_op("Transpose", [], perm=[0, 1, 2])),
        ("onnx_remove_identity_transpose", lambda: _one_op("Transpose", [], opset=9, perm=[0, 1, 2])),
        ("onnx_remove_noop_reshape", lambda: model(
            [node("Shape", ["x"], ["s"]), node("Reshape", ["x", "s"], ["o"]), node("Relu", ["o"], ["y"])],
            [tensor("x", FLOAT, ["b", "s", 4])], [tensor("y", FLOAT, None)])),
        ("onnx_remove_full_slice", lambda: _one_op(
            "Slice", ["starts", "ends", "axes"],
            [initializer("starts", np.array([0, 0])), initializer("ends", np.array([INT64_MAX, INT64_MAX])),
             initializer("axes", np.array([0, 1]))])),
        ("onnx_remove_full_slice", lambda: _one_op("Slice", [], opset=9, starts=[0], ends=[INT64_MAX], axes=[1])),
        ("onnx_remove_zero_pad", lambda: _one_op("Pad", ["pads"], [initializer("pads", np.zeros(6, np.int64))])),
        ("onnx_remove_zero_pad", lambda: _one_op("Pad", [], opset=10, typed=True, pads=[0] * 6, mode="edge")),
        ("onnx_remove_noop_unsqueeze", lambda: _one_op("Unsqueeze", ["axes"],
                                                       [initializer("axes", np.zeros(0, np.int64))])),
        ("onnx_remove_mul_by_one", lambda: _one_op("Mul", ["one"], [initializer("one", np.array(1.0, np.float32))])),
        ("onnx_remove_div_by_one", lambda: _one_op("Div", ["one"], [initializer("one", np.ones(4, np.float32))])),
        ("onnx_remove_inference_dropout", lambda: _one_op("Dropout", [], opset=10, ratio=0.5)),
        ("onnx_remove_inference_dropout", lambda: _one_op("Dropout", ["ratio"],
                                                          [initializer("ratio", np.array(0.5, np.float32))])),
        ("onnx_remove_inference_dropout", lambda: _one_op(
            "Dropout", ["ratio", "training"],
            [initializer("ratio", np.array(0.5, np.float32)), initializer("training", np.array(False))])),
    ],
)
def test_a_noop_is_removed(rule, build):
    built = build()
    op_type = next(n.op_type for n in built.graph.node if n.op_type not in ("Shape", "Relu"))
    outcome = rewrite_and_compare(built, feeds(x=SIZES), only(rule))
    assert outcome.fired == 1
    assert outcome.before[op_type] == 1 and outcome.after[op_type] == 0
    assert outcome.after["Relu"] == 1 and sum(outcome.after.values()) == 1


def test_zero_paddings_at_opset_1_are_removed():
    # onnxruntime runs no Pad-1; the rule reads its `paddings` attribute all the same. (The
    # outputs are the Pads' own: the shape guard cannot type a Relu-1 consumer, and refuses.)
    nodes = [node("Pad", ["x"], ["y"], paddings=[0, 0, 0, 0]), node("Pad", ["x"], ["z"], paddings=[0, 1, 0, 0])]
    built = model(nodes, [tensor("x", FLOAT, [2, 3])], [tensor("y", FLOAT, [2, 3]), tensor("z", FLOAT, [2, 4])],
                  opset=1)
    assert only("onnx_remove_zero_pad").apply(built).fires == 1
    assert counts(built) == Counter({"Pad": 1, "Identity": 1})  # x bridged to the output y


def test_a_squeeze_of_literal_dims_without_ones_is_removed():
    built = _one_op("Squeeze", [], dims=(2, 3, 4))
    outcome = rewrite_and_compare(built, [{"x": floats(2, 3, 4)}, {"x": floats(2, 3, 4, seed=1)}],
                                  only("onnx_remove_noop_squeeze"))
    assert outcome.fired == 1 and outcome.after == Counter({"Relu": 1})


def test_a_reshape_to_minus_one_and_seq_is_solved_symbolically():
    # Reshape(input_ids[batch, seq], [-1, seq]), as TorchScript spells it.
    nodes = [
        node("Shape", ["x"], ["s"]),
        node("Gather", ["s", "one"], ["seq"], axis=0),
        node("Unsqueeze", ["seq", "zero"], ["seq_1d"]),
        node("Concat", ["minus_one", "seq_1d"], ["target"], axis=0),
        node("Reshape", ["x", "target"], ["r"]),
        node("Add", ["r", "x"], ["y"]),
    ]
    built = model(nodes, [tensor("x", INT64, ["b", "s"])], [tensor("y", INT64, ["b", "s"])],
                  [initializer("one", np.array(1)), initializer("zero", np.array([0])),
                   initializer("minus_one", np.array([-1]))])
    cases = [{"x": np.arange(b * s).reshape(b, s)} for b, s in ((2, 3), (5, 7))]
    outcome = rewrite_and_compare(built, cases, ONNX_RULES)
    assert outcome.after["Reshape"] == 0 and sum(outcome.after.values()) == 1


NOT_NOOPS = {
    "a Cast to fp16": lambda: _one_op("Cast", [], to=TensorProto.FLOAT16),
    "an Expand of a size-1 axis to a symbol": lambda: model(
        [node("Shape", ["y"], ["s"]), node("Expand", ["x", "s"], ["o"])],
        [tensor("x", FLOAT, [1, 4]), tensor("y", FLOAT, ["b", 4])], [tensor("o", FLOAT, None)]),
    "an Expand between two different symbols": lambda: model(
        [node("Shape", ["y"], ["s"]), node("Expand", ["x", "s"], ["o"])],
        [tensor("x", FLOAT, ["n"]), tensor("y", FLOAT, ["m"])], [tensor("o", FLOAT, None)]),
    "an Expand that adds an axis": lambda: _one_op("Expand", ["shape"], [initializer("shape", np.array([1, 1, 1, 1]))]),
    "a Transpose without perm (reverses)": lambda: _one_op("Transpose", []),
    "a Transpose swapping two equal dims": lambda: _one_op("Transpose", [], dims=(3, 3, 4), perm=[1, 0, 2]),
    "a Reshape with -1 not provably the same dim": lambda: _one_op(
        "Reshape", ["shape"], [initializer("shape", np.array([-1, 3, 4]))]),
    "a Slice ending at 64 on a symbolic axis": lambda: _one_op(
        "Slice", ["starts", "ends", "axes"],
        [initializer("starts", np.array([0])), initializer("ends", np.array([64])),
         initializer("axes", np.array([0]))]),
    "a reversing Slice": lambda: _one_op(
        "Slice", ["starts", "ends", "axes", "steps"],
        [initializer("starts", np.array([-1])), initializer("ends", np.array([-INT64_MAX])),
         initializer("axes", np.array([2])), initializer("steps", np.array([-1]))]),
    "a Pad that shifts": lambda: _one_op("Pad", ["pads"], [initializer("pads", np.array([0, 0, 1, 0, 0, -1]))]),
    "a Squeeze of symbolic dims (one may be 1)": lambda: model(
        [node("Squeeze", ["x"], ["o"]), node("Size", ["o"], ["y"])], [tensor("x", FLOAT, ["b", "s", 4])],
        [tensor("y", INT64, [])]),
    "a Squeeze with empty axes of a value with a 1 (onnxruntime squeezes it)": lambda: _one_op(
        "Squeeze", ["axes"], [initializer("axes", np.zeros(0, np.int64))], dims=(2, 1, 4)),
    "a Mul by a 1 that widens": lambda: _one_op("Mul", ["one"],
                                                [initializer("one", np.ones((2, 1, 1, 1), np.float32))]),
    "a Mul by 2": lambda: _one_op("Mul", ["two"], [initializer("two", np.array(2.0, np.float32))]),
    "a Div of 1 by x": lambda: model([node("Div", ["one", "x"], ["y"])], [tensor("x", FLOAT, ["b", "s", 4])],
                                     [tensor("y", FLOAT, None)], [initializer("one", np.array(1.0, np.float32))]),
    "a Div by a 1 that widens": lambda: _one_op("Div", ["one"], [initializer("one", np.ones((3, 1, 1), np.float32))],
                                                dims=("b", 1, 4)),
    "a Dropout in training mode": lambda: _one_op(
        "Dropout", ["ratio", "training"],
        [initializer("ratio", np.array(0.0, np.float32)), initializer("training", np.array(True))]),
}


@pytest.mark.parametrize("case", sorted(NOT_NOOPS))
def test_what_is_no_noop_stays(case):
    built = NOT_NOOPS[case]()
    unchanged(built, ONNX_RULES)


def test_dropout_with_its_mask_used_keeps_the_node_but_not_its_use():
    nodes = [node("Dropout", ["x"], ["d", "mask"]), node("Relu", ["d"], ["y"]), node("Not", ["mask"], ["m"])]
    built = model(nodes, [tensor("x", FLOAT, ["b", 4])], [tensor("y", FLOAT, None), tensor("m", BOOL, None)])
    outcome = rewrite_and_compare(built, feeds(x=[(2, 4), (5, 4)]), ONNX_RULES)
    assert outcome.fired == 1 and outcome.after["Dropout"] == 1
    assert built.graph.node[1].input[0] == "x"  # the Relu reads x directly


def test_dropout_at_opset_6_only_goes_in_test_mode():
    nodes = [node("Dropout", ["x"], ["d"], ratio=0.5), node("Relu", ["d"], ["y"])]
    training = model(nodes, [tensor("x", FLOAT, ["b", 4])], [tensor("y", FLOAT, None)], opset=6)
    unchanged(training, ONNX_RULES)  # is_test defaults to 0: the op drops at random
    nodes[0] = node("Dropout", ["x"], ["d"], ratio=0.5, is_test=1)
    testing = model(nodes, [tensor("x", FLOAT, ["b", 4])], [tensor("y", FLOAT, None)], opset=6)
    assert ONNX_RULES.apply(testing).fires == 1 and counts(testing) == Counter({"Relu": 1})


# ---------------------------------------------------------------- arithmetic: shapes, dtypes and -0.0


def _binary(op_type, constant, dtype=FLOAT, constant_first=False, dims=("b", 4)):
    inputs = ["c", "x"] if constant_first else ["x", "c"]
    return model([node(op_type, inputs, ["y"])], [tensor("x", dtype, list(dims))], [tensor("y", dtype, None)],
                 [initializer("c", constant)])


def test_mul_by_one_keeps_negative_zero_nan_and_inf():
    built = _binary("Mul", np.array([1.0], np.float32), constant_first=True)
    special = np.array([[-0.0, 0.0, np.nan, np.inf], [-np.inf, -1.5, 3.0, -0.0]], np.float32)
    outcome = rewrite_and_compare(built, [{"x": special}, {"x": floats(5, 4)}], ONNX_RULES)
    # x is the graph's input and y its output: the engine bridges them with an Identity.
    assert outcome.fired == 1 and outcome.after == Counter({"Identity": 1})
    assert np.signbit(run(built, {"x": special})[0]).tolist() == np.signbit(special).tolist()


@pytest.mark.parametrize("op_type, constant_first", [("Add", False), ("Add", True), ("Sub", False)])
def test_integer_add_and_sub_of_zero_go(op_type, constant_first):
    built = _binary(op_type, np.array(0, np.int64), INT64, constant_first)
    cases = [{"x": np.arange(b * 4).reshape(b, 4) - 3} for b in (2, 5)]
    outcome = rewrite_and_compare(built, cases, ONNX_RULES)
    assert outcome.fired == 1 and outcome.after == Counter({"Identity": 1})  # the input-to-output bridge


@pytest.mark.parametrize("op_type, zero", [("Add", 0.0), ("Add", -0.0), ("Sub", 0.0), ("Sub", -0.0)])
def test_float_add_and_sub_of_zero_stay(op_type, zero):
    # x + 0.0 turns -0.0 into +0.0, and so does x - (-0.0); x + (-0.0) and
    # x - 0.0 would be exact, but no condition can read a zero's sign.
    built = _binary(op_type, np.array(zero, np.float32))
    unchanged(built, ONNX_RULES)
    negative_zero = {"x": np.full((2, 4), -0.0, np.float32)}
    keeps_the_sign = (op_type == "Add") == (np.signbit(zero))
    assert bool(np.signbit(run(built, negative_zero)[0]).all()) == keeps_the_sign


def test_zero_minus_x_stays():
    unchanged(_binary("Sub", np.array(0, np.int64), INT64, constant_first=True), ONNX_RULES)


@pytest.mark.parametrize("op_type", ["Mul", "Add", "Sub", "Div"])
def test_an_identity_constant_that_broadcasts_wider_stays(op_type):
    value = 1 if op_type in ("Mul", "Div") else 0
    built = _binary(op_type, np.full((3, 1), value, np.int64), INT64, dims=("b",))
    unchanged(built, ONNX_RULES)


# ---------------------------------------------------------------- chains


def _chain(nodes, dims, dtype=FLOAT, initializers=(), opset=18):
    return model(nodes, [tensor("x", dtype, list(dims))], [helper.make_empty_tensor_value_info("y")],
                 initializers, opset=opset)


def test_cast_of_exact_cast_is_one_cast():
    built = _chain([node("Cast", ["x"], ["a"], to=TensorProto.FLOAT), node("Cast", ["a"], ["y"], to=INT32)],
                   ["b", 4], FLOAT16)
    cases = [{"x": (floats(b, 4, seed=b) * 100).astype(np.float16)} for b in (2, 5)]
    outcome = rewrite_and_compare(built, cases, ONNX_RULES)
    assert outcome.fired == 1 and outcome.after == Counter({"Cast": 1})


def test_cast_round_trip_through_a_wider_dtype_disappears():
    built = _chain([node("Cast", ["x"], ["a"], to=TensorProto.DOUBLE), node("Cast", ["a"], ["c"], to=FLOAT),
                    node("Relu", ["c"], ["y"])], ["b", 4])
    outcome = rewrite_and_compare(built, feeds(x=[(2, 4), (5, 4)]), ONNX_RULES)
    assert outcome.after == Counter({"Relu": 1})


@pytest.mark.parametrize("via, source", [(TensorProto.FLOAT, INT32), (TensorProto.FLOAT16, FLOAT),
                                          (TensorProto.BOOL, FLOAT), (INT32, INT64)])
def test_an_inexact_cast_chain_stays(via, source):
    built = _chain([node("Cast", ["x"], ["a"], to=via), node("Cast", ["a"], ["y"], to=source)], ["b"], source)
    unchanged(built, ONNX_RULES)
    if source == INT32:  # and it matters: 2^24 + 1 does not survive fp32
        assert run(built, {"x": np.array([2**24 + 1], np.int32)})[0].tolist() == [2**24]


def test_reshape_of_reshape_is_one_reshape():
    built = _chain([node("Reshape", ["x", "s1"], ["a"]), node("Reshape", ["a", "s2"], ["y"])], [2, 3, 4],
                   initializers=[initializer("s1", np.array([-1, 4])), initializer("s2", np.array([4, -1]))])
    outcome = rewrite_and_compare(built, [{"x": floats(2, 3, 4)}, {"x": floats(2, 3, 4, seed=1)}], ONNX_RULES)
    assert outcome.fired == 1 and outcome.after == Counter({"Reshape": 1})


def test_reshape_round_trip_over_a_symbolic_batch_disappears():
    built = _chain([node("Reshape", ["x", "s1"], ["a"]), node("Reshape", ["a", "s2"], ["r"]),
                    node("Relu", ["r"], ["y"])], ["b", 3, 4],
                   initializers=[initializer("s1", np.array([-1, 12])), initializer("s2", np.array([2, 3, 4]))])
    # Only a batch of 2 runs: the second Reshape fixes it. The outer shape is
    # fully given, so the two Reshapes are one, and that one is not x's shape.
    cases = [{"x": floats(2, 3, 4)}, {"x": floats(2, 3, 4, seed=1)}]
    outcome = rewrite_and_compare(built, cases, ONNX_RULES)
    assert outcome.after == Counter({"Reshape": 1, "Relu": 1})


def test_reshape_with_a_zero_of_a_reshape_stays():
    built = _chain([node("Reshape", ["x", "s1"], ["a"]), node("Reshape", ["a", "s2"], ["y"])], [2, 6],
                   initializers=[initializer("s1", np.array([3, 4])), initializer("s2", np.array([0, 2, -1]))])
    unchanged(built, ONNX_RULES)


def test_transpose_and_its_inverse_disappear():
    built = _chain([node("Transpose", ["x"], ["a"], perm=[0, 2, 1, 3]),
                    node("Transpose", ["a"], ["t"], perm=[0, 2, 1, 3]),
                    node("Relu", ["t"], ["y"])], ["b", "h", "s", 8])
    outcome = rewrite_and_compare(built, feeds(x=[(2, 3, 4, 8), (5, 1, 7, 8)]), ONNX_RULES)
    assert outcome.after == Counter({"Relu": 1})


def test_transposes_compose():
    built = _chain([node("Transpose", ["x"], ["a"], perm=[0, 2, 1]), node("Transpose", ["a"], ["y"], perm=[2, 0, 1])],
                   ["b", 3, "s"])
    outcome = rewrite_and_compare(built, feeds(x=[(2, 3, 4), (5, 3, 1)]), ONNX_RULES)
    assert outcome.after == Counter({"Transpose": 1})
    assert list(built.graph.node[0].attribute[0].ints) == [1, 0, 2]


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_unsqueezes_fuse(opset):
    if opset < 13:
        nodes = [node("Unsqueeze", ["x"], ["a"], axes=[1]), node("Unsqueeze", ["a"], ["y"], axes=[-1])]
        initializers = []
    else:
        nodes = [node("Unsqueeze", ["x", "a1"], ["a"]), node("Unsqueeze", ["a", "a2"], ["y"])]
        initializers = [initializer("a1", np.array([1])), initializer("a2", np.array([-1]))]
    built = _chain(nodes, ["b", "s"], initializers=initializers, opset=opset)
    outcome = rewrite_and_compare(built, feeds(x=[(2, 3), (5, 1)]), ONNX_RULES)
    assert outcome.fired == 1 and outcome.after["Unsqueeze"] == 1
    assert run(built, {"x": floats(2, 3)})[0].shape == (2, 1, 3, 1)


@pytest.mark.parametrize("opset", [11, 13])
def test_squeeze_and_unsqueeze_cancel(opset):
    def op(op_type, source, target, axes):
        if opset < 13:
            return [node(op_type, [source], [target], axes=axes)], []
        return [node(op_type, [source, f"{target}_axes"], [target])], [initializer(f"{target}_axes", np.array(axes))]

    unsqueeze, first = op("Unsqueeze", "x", "u", [0, 2])
    squeeze, second = op("Squeeze", "u", "s", [-2, 0])
    built = _chain(unsqueeze + squeeze + [node("Relu", ["s"], ["y"])], ["b", "s"], initializers=first + second,
                   opset=opset)
    outcome = rewrite_and_compare(built, feeds(x=[(2, 3), (5, 1)]), ONNX_RULES)
    assert outcome.after == Counter({"Relu": 1})

    squeeze, first = op("Squeeze", "x", "s", [1])
    unsqueeze, second = op("Unsqueeze", "s", "u", [1])
    built = _chain(squeeze + unsqueeze + [node("Relu", ["u"], ["y"])], ["b", 1, "s"], initializers=first + second,
                   opset=opset)
    outcome = rewrite_and_compare(built, feeds(x=[(2, 1, 3), (5, 1, 1)]), ONNX_RULES)
    assert outcome.after == Counter({"Relu": 1})


def test_squeeze_of_unsqueeze_on_another_axis_stays():
    built = _chain([node("Unsqueeze", ["x", "a"], ["u"]), node("Squeeze", ["u", "b"], ["y"])], [1, "s"],
                   initializers=[initializer("a", np.array([2])), initializer("b", np.array([0]))])
    unchanged(built, ONNX_RULES)


def test_relu_of_relu():
    built = _chain([node("Relu", ["x"], ["a"]), node("Relu", ["a"], ["y"])], ["b", 4])
    outcome = rewrite_and_compare(built, feeds(x=[(2, 4), (5, 4)]), ONNX_RULES)
    assert outcome.after == Counter({"Relu": 1})


@pytest.mark.parametrize("opset", [6, 13])
@pytest.mark.parametrize("inner, outer, kept", [((0.0, 6.0), (-1.0, 8.0), (0.0, 6.0)),
                                                ((-10.0, 10.0), (0.0, 6.0), (0.0, 6.0))])
def test_nested_clips_are_one(opset, inner, outer, kept):
    def clip(source, target, bounds):
        if opset < 11:
            return [node("Clip", [source], [target], min=bounds[0], max=bounds[1])], []
        names = [f"{target}_min", f"{target}_max"]
        return [node("Clip", [source, *names], [target])], [
            initializer(n, np.array(b, np.float32)) for n, b in zip(names, bounds)]

    first, first_constants = clip("x", "a", inner)
    second, second_constants = clip("a", "y", outer)
    built = _chain(first + second, ["b", 4], initializers=first_constants + second_constants, opset=opset)
    special = np.array([[np.nan, -20.0, 20.0, 3.0]], np.float32)
    outcome = rewrite_and_compare(built, [{"x": special}, {"x": floats(5, 4) * 10}], ONNX_RULES)
    assert outcome.fired == 1 and outcome.after == Counter({"Clip": 1})
    extremes = np.array([[-100.0, 100.0, -100.0, 100.0]], np.float32)
    np.testing.assert_array_equal(run(built, {"x": extremes})[0], [list(kept) * 2])


def test_overlapping_clips_stay():
    built = _chain([node("Clip", ["x", "lo1", "hi1"], ["a"]), node("Clip", ["a", "lo2", "hi2"], ["y"])], ["b", 4],
                   initializers=[initializer(n, np.array(v, np.float32))
                                 for n, v in (("lo1", -10.0), ("hi1", 4.0), ("lo2", 0.0), ("hi2", 6.0))])
    unchanged(built, ONNX_RULES)


# ---------------------------------------------------------------- the exported models

MODELS = Path(__file__).resolve().parent.parent / "backends" / "onnx_models"
MANIFEST = json.loads((MODELS / "manifest.json").read_text())


def _feeds(entry: dict, shape: dict, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    result = {}
    for name, dims in shape["inputs"].items():
        hint = entry["input_generation"][name]
        if hint["kind"] == "randint":
            result[name] = rng.integers(hint["low"], hint["high"], size=dims).astype(hint["dtype"])
        else:
            result[name] = rng.standard_normal(size=dims).astype(hint["dtype"])
    return result


@pytest.mark.parametrize("entry", MANIFEST["files"], ids=[e["file"] for e in MANIFEST["files"]])
def test_the_onnx_library_on_exported_models(entry):
    built = onnx.load(str(MODELS / entry["file"]))
    cases = [_feeds(entry, shape, seed) for seed, shape in enumerate(entry["test_shapes"])]
    expected = [run(built, f) for f in cases]
    before = len(built.graph.node)
    ONNX_RULES.apply(built)
    onnx.checker.check_model(built, full_check=True)
    assert len(built.graph.node) <= before
    if "torchscript" in entry["file"] and entry["file"].split("_")[0] in ("attention", "llama", "gpt2"):
        assert len(built.graph.node) < before * 0.9  # the cleanups take at least a tenth of these
    for f, outputs in zip(cases, expected):
        for old, new in zip(outputs, run(built, f)):
            assert old.shape == new.shape and old.dtype == new.dtype
            np.testing.assert_allclose(new, old, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- boolean identities and shared Unsqueezes


@pytest.mark.parametrize("op_type, constant", [("And", True), ("Or", False)])
def test_and_with_true_and_or_with_false_go(op_type, constant):
    # torch.export's transformers 5 masks: And(ones, condition).
    nodes = [node("Greater", ["x", "zero"], ["c"]), node(op_type, ["k", "c"], ["m"]), node("Not", ["m"], ["y"])]
    built = _chain(nodes, ["b", "s"], initializers=[initializer("zero", np.array(0.0, np.float32)),
                                                     initializer("k", np.full((1, 1), constant))])
    outcome = rewrite_and_compare(built, feeds(x=[(2, 3), (5, 1)]), ONNX_RULES)
    assert outcome.fired == 1 and outcome.after == Counter({"Greater": 1, "Not": 1})


@pytest.mark.parametrize("op_type, constant", [("And", True), ("Or", False)])
def test_a_boolean_identity_that_widens_stays(op_type, constant):
    nodes = [node("Greater", ["x", "zero"], ["c"]), node(op_type, ["k", "c"], ["m"]), node("Not", ["m"], ["y"])]
    built = _chain(nodes, ["b", 1], initializers=[initializer("zero", np.array(0.0, np.float32)),
                                                   initializer("k", np.full((1, 3), constant))])
    unchanged(built, ONNX_RULES)


def test_an_unsqueeze_read_by_two_unsqueezes_fuses_into_both():
    # torch.export reads one range as a row and as a column: both fuse, and the shared
    # Unsqueeze goes with the second.
    nodes = [node("Unsqueeze", ["x", "a01"], ["a"]), node("Unsqueeze", ["a", "a2"], ["row"]),
             node("Unsqueeze", ["a", "a3"], ["col"]), node("Add", ["row", "col"], ["y"])]
    built = _chain(nodes, ["s"], initializers=[initializer("a01", np.array([0, 1])), initializer("a2", np.array([2])),
                                                initializer("a3", np.array([3]))])
    outcome = rewrite_and_compare(built, feeds(x=[(3,), (5,)]), ONNX_RULES)
    # (each new Unsqueeze's axes are a Constant, which optimize stores as an initializer)
    assert outcome.fired == 2 and outcome.after == Counter({"Unsqueeze": 2, "Add": 1, "Constant": 2})


def test_an_unsqueeze_read_by_another_op_too_stays():
    nodes = [node("Unsqueeze", ["x", "a0"], ["a"]), node("Unsqueeze", ["a", "a2"], ["u"]),
             node("Relu", ["a"], ["r"]), node("Add", ["u", "r"], ["y"])]
    built = _chain(nodes, ["s"], initializers=[initializer("a0", np.array([0])), initializer("a2", np.array([2]))])
    unchanged(built, ONNX_RULES)
