"""The ONNX Max/Min chain rules (rules/onnx/chains.rules) and the Flatten rules (rules/onnx/flatten.rules).

Hand-built models with symbolic dims: node counts before and after, and
onnxruntime's outputs before and after at two input sizes at least
(`rewrite_and_compare`), NaN included for Max and Min; then the cases each
rule must leave alone; then the bundled exports.
"""

from __future__ import annotations

from collections import Counter
from copy import deepcopy
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx_cases import FLOAT, INT64, counts, floats, initializer, node, rewrite_and_compare, run, tensor

import rewrite
from rewrite.onnx import optimize

ONNX_RULES = rewrite.load_rules(dialects=["onnx"])
FLOAT16 = TensorProto.FLOAT16
MAX_MIN_RULES = ["onnx_fuse_max_min_chains", "onnx_remove_max_min_of_one_value",
                 "onnx_remove_max_min_under_a_stronger_bound", "onnx_drop_weaker_max_min_bound"]
FLATTEN_RULES = ["onnx_remove_noop_flatten", "onnx_fuse_flatten_of_regrouping"]


def model(nodes, inputs, initializers=(), opset=18):
    """A checked model whose one output `y` is typed by onnx's inference."""
    graph = helper.make_graph(nodes, "test", inputs, [helper.make_empty_tensor_value_info("y")],
                              initializer=list(initializers))
    built = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    inferred = onnx.shape_inference.infer_shapes(built).graph.output[0]
    built.graph.output[0].CopyFrom(inferred)
    onnx.checker.check_model(built, full_check=True)
    return built


def unchanged(built, rules=ONNX_RULES):
    before = counts(built)
    assert rules.apply(built).fires == 0 and counts(built) == before


def ops(counter: Counter) -> Counter:
    """The node counts without Constants (a rule's new constant is a Constant node until `optimize` moves it)."""
    return Counter({op: n for op, n in counter.items() if op != "Constant"})


def constant(built, name):
    for item in built.graph.initializer:
        if item.name == name:
            return onnx.numpy_helper.to_array(item)
    (made,) = [n for n in built.graph.node if n.op_type == "Constant" and n.output[0] == name]
    return onnx.numpy_helper.to_array(made.attribute[0].t)


def with_nans(array, seed):
    """`array` with about a quarter of its elements NaN, at places that differ by seed."""
    result = array.copy()
    result[np.random.default_rng(seed).random(result.shape) < 0.25] = np.nan
    return result


def test_the_rules_are_in_the_shipped_library():
    names = {rule.name for rule in ONNX_RULES.rules}
    assert set(MAX_MIN_RULES + FLATTEN_RULES) <= names


# ---------------------------------------------------------------- Max and Min chains


@pytest.mark.parametrize("op_type", ["Max", "Min"])
def test_a_chain_is_one_op_and_keeps_every_nan(op_type):
    # Max(Max(a[b, 1], c[1, s]), d[s]): the operands broadcast to (b, s), symbolic.
    nodes = [node(op_type, ["a", "c"], ["m"]), node(op_type, ["m", "d"], ["y"])]
    built = model(nodes, [tensor("a", FLOAT, ["b", 1]), tensor("c", FLOAT, [1, "s"]), tensor("d", FLOAT, ["s"])])
    cases = []
    for seed, (b, s) in enumerate(((2, 3), (5, 7), (4, 1))):
        case = {"a": floats(b, 1, seed=seed), "c": floats(1, s, seed=seed + 10), "d": floats(s, seed=seed + 20)}
        if seed:
            case = {name: with_nans(v, 10 * seed + i) for i, (name, v) in enumerate(case.items())}
        cases.append(case)
    expected = [run(built, case)[0] for case in cases]
    outcome = rewrite_and_compare(built, cases, ONNX_RULES)  # NaN where NaN was (assert_array_equal)
    assert outcome.fired == 1 and outcome.before == Counter({op_type: 2}) and outcome.after == Counter({op_type: 1})
    assert list(built.graph.node[0].input) == ["a", "c", "d"]
    for case, output in zip(cases[1:], expected[1:]):
        # onnxruntime propagates NaN from every operand, before and after: the rule relies on it.
        any_nan = np.isnan(case["a"]) | np.isnan(case["c"]) | np.isnan(case["d"])
        assert any_nan.any() and (np.isnan(output) == any_nan).all()


def test_a_chain_of_three_from_either_side_is_one_op():
    # Min(a, Min(Min(b, c), d)), int64 and fp16 alike.
    for dtype, make in ((INT64, lambda *s, seed: np.random.default_rng(seed).integers(-9, 9, s)),
                        (FLOAT16, lambda *s, seed: floats(*s, seed=seed).astype(np.float16))):
        nodes = [node("Min", ["b", "c"], ["m1"]), node("Min", ["m1", "d"], ["m2"]), node("Min", ["a", "m2"], ["y"])]
        built = model(nodes, [tensor(n, dtype, ["n", 4]) for n in "abcd"])
        cases = [{name: make(n, 4, seed=n + i) for i, name in enumerate("abcd")} for n in (2, 5)]
        outcome = rewrite_and_compare(built, cases, ONNX_RULES)
        assert outcome.before == Counter({"Min": 3}) and outcome.after == Counter({"Min": 1})
        assert sorted(built.graph.node[0].input) == ["a", "b", "c", "d"]


def test_max_of_a_value_with_itself_is_the_value():
    nodes = [node("Max", ["x", "x"], ["m"]), node("Min", ["m"], ["o"]), node("Relu", ["o"], ["y"])]
    built = model(nodes, [tensor("x", FLOAT, ["b", 4])])
    cases = [{"x": with_nans(floats(b, 4, seed=b), b)} for b in (2, 5)]
    cases[0]["x"][0, :2] = [-0.0, np.inf]
    outcome = rewrite_and_compare(built, cases, ONNX_RULES)
    assert outcome.fired == 2 and outcome.after == Counter({"Relu": 1})


@pytest.mark.parametrize("inner, outer, kept", [
    (0.0, -1.0, 0.0),   # the outer bound is weaker: the inner Max is the result
    (-1.0, 0.5, 0.5),   # the inner bound is weaker: one Max by 0.5
])
def test_max_by_constants_of_a_max_by_a_constant(inner, outer, kept):
    nodes = [node("Max", ["x", "c1"], ["m"]), node("Max", ["c2", "m"], ["y"])]
    built = model(nodes, [tensor("x", FLOAT, ["b", "s"])],
                  [initializer("c1", np.array(inner, np.float32)), initializer("c2", np.array([outer], np.float32))])
    cases = [{"x": with_nans(floats(2, 3, seed=1), 1)}, {"x": floats(5, 1, seed=2)}]
    outcome = rewrite_and_compare(built, cases, ONNX_RULES)
    assert outcome.before == Counter({"Max": 2}) and outcome.after == Counter({"Max": 1})
    constants = {i.name: onnx.numpy_helper.to_array(i).item() for i in built.graph.initializer}
    assert [constants[name] for name in built.graph.node[0].input if name in constants] == [kept]
    extremes = np.array([[-100.0, np.nan, 100.0]], np.float32)
    np.testing.assert_array_equal(run(built, {"x": extremes})[0], [[kept, np.nan, 100.0]])


def test_min_under_a_narrower_min_read_elsewhere_goes_alone():
    # Min(Min(x, 6), 8): the outer Min goes; the inner one stays for its other use.
    nodes = [node("Min", ["x", "six"], ["m"]), node("Min", ["m", "eight"], ["o"]), node("Neg", ["m"], ["n"]),
             node("Add", ["o", "n"], ["y"])]
    built = model(nodes, [tensor("x", INT64, ["b"])],
                  [initializer("six", np.array(6)), initializer("eight", np.array([8]))])
    cases = [{"x": np.arange(b) * 3 - 4} for b in (3, 7)]
    outcome = rewrite_and_compare(built, cases, ONNX_RULES)
    assert outcome.before["Min"] == 2 and outcome.after["Min"] == 1


def _max_chain(op_types, inputs, initializers=(), other_use=False):
    """op_types[0](x, inputs[0]) then op_types[1](that, inputs[1])."""
    nodes = [node(op_types[0], ["x", inputs[0]], ["m"]), node(op_types[1], ["m", inputs[1]], ["y"])]
    if other_use:
        nodes[1] = node(op_types[1], ["m", inputs[1]], ["o"])
        nodes += [node("Relu", ["m"], ["r"]), node("Add", ["o", "r"], ["y"])]
    return model(nodes, [tensor("x", FLOAT, ["b", 1]), tensor("z", FLOAT, ["b", 1])], initializers)


NOT_CHAINS = {
    "a Max of a Min": lambda: _max_chain(["Min", "Max"], ["z", "z"]),
    "a Min of a Max by constants": lambda: _max_chain(
        ["Max", "Min"], ["c1", "c2"], [initializer("c1", np.array(0.0, np.float32)),
                                       initializer("c2", np.array(6.0, np.float32))]),
    "the inner Max read elsewhere": lambda: _max_chain(["Max", "Max"], ["z", "z"], other_use=True),
    "a bound of each zero": lambda: _max_chain(
        ["Max", "Max"], ["c1", "c2"], [initializer("c1", np.array(0.0, np.float32)),
                                       initializer("c2", np.array(-0.0, np.float32))]),
    "a weaker bound that widens": lambda: _max_chain(
        ["Max", "Max"], ["c1", "c2"], [initializer("c1", np.array(1.0, np.float32)),
                                       initializer("c2", np.zeros(3, np.float32))]),
    "a bound that is not one number": lambda: _max_chain(
        ["Max", "Max"], ["c1", "c2"], [initializer("c1", np.array([[0.0, 5.0]], np.float32)),
                                       initializer("c2", np.array(1.0, np.float32))]),
    "a NaN bound": lambda: _max_chain(
        ["Max", "Max"], ["c1", "c2"], [initializer("c1", np.array(0.0, np.float32)),
                                       initializer("c2", np.array(np.nan, np.float32))]),
}


@pytest.mark.parametrize("case", sorted(NOT_CHAINS))
def test_what_is_no_max_min_chain_stays(case):
    built = NOT_CHAINS[case]()
    if "bound" not in case:
        unchanged(built)
        return
    # Neither bound goes; the chain still becomes one op of both bounds.
    unchanged(built, ONNX_RULES.only(*MAX_MIN_RULES[2:]))
    cases = [{"x": with_nans(floats(b, 1, seed=b), b), "z": floats(b, 1)} for b in (2, 5)]
    outcome = rewrite_and_compare(built, cases, ONNX_RULES)
    assert outcome.after == Counter({"Max": 1}) and len(built.graph.node[0].input) == 3


# ---------------------------------------------------------------- Flatten


@pytest.mark.parametrize("opset, axis", [(9, 1), (11, -1), (18, 1)])
def test_a_flatten_of_a_matrix_at_axis_1_goes(opset, axis):
    built = model([node("Flatten", ["x"], ["f"], axis=axis), node("Relu", ["f"], ["y"])],
                  [tensor("x", FLOAT, ["b", "s"])], opset=opset)
    outcome = rewrite_and_compare(built, [{"x": floats(2, 3)}, {"x": floats(5, 1, seed=1)}], ONNX_RULES)
    assert outcome.fired == 1 and outcome.after == Counter({"Relu": 1})


def test_a_flatten_of_an_unsqueeze_copies_the_batch():
    # Flatten(Unsqueeze(x[b, 12, 1], 1), 1) is Reshape(x, [0, 12]): an empty batch runs too.
    nodes = [node("Unsqueeze", ["x", "axes"], ["u"]), node("Flatten", ["u"], ["f"], axis=1),
             node("Relu", ["f"], ["y"])]
    built = model(nodes, [tensor("x", FLOAT, ["b", 12, 1])], [initializer("axes", np.array([1]))])
    cases = [{"x": floats(b, 12, 1, seed=b)} for b in (2, 5, 0)]
    outcome = rewrite_and_compare(built, cases, ONNX_RULES)
    assert outcome.fired == 1 and outcome.before == Counter({"Unsqueeze": 1, "Flatten": 1, "Relu": 1})
    assert ops(outcome.after) == Counter({"Reshape": 1, "Relu": 1})
    assert constant(built, built.graph.node[-2].input[1]).tolist() == [0, 12]


def test_a_flatten_of_an_unsqueeze_that_puts_back_the_matrix_goes():
    # Flatten(Unsqueeze(x[b, s], 1), 2) is Reshape(x, [0, 0]), which onnx_remove_noop_reshape removes.
    nodes = [node("Unsqueeze", ["x", "axes"], ["u"]), node("Flatten", ["u"], ["f"], axis=2),
             node("Relu", ["f"], ["y"])]
    built = model(nodes, [tensor("x", FLOAT, ["b", "s"])], [initializer("axes", np.array([1]))])
    cases = [{"x": floats(2, 3)}, {"x": floats(5, 1, seed=1)}, {"x": floats(0, 4)}]
    only = ONNX_RULES.only("onnx_fuse_flatten_of_regrouping")
    outcome = rewrite_and_compare(deepcopy(built), cases, only)
    assert outcome.fired == 1 and ops(outcome.after) == Counter({"Reshape": 1, "Relu": 1})
    outcome = rewrite_and_compare(built, cases, ONNX_RULES)
    assert outcome.after == Counter({"Relu": 1})


def test_a_flatten_of_a_reshape_with_literal_dims_is_one_reshape():
    # The heads of x[2, 3, 64] split and flattened back to rows: Reshape(x, [6, 64]).
    nodes = [node("Reshape", ["x", "heads"], ["r"]), node("Flatten", ["r"], ["y"], axis=2)]
    built = model(nodes, [tensor("x", FLOAT, [2, 3, 64])], [initializer("heads", np.array([0, 0, 4, 16]))])
    outcome = rewrite_and_compare(built, [{"x": floats(2, 3, 64, seed=s)} for s in (0, 1)], ONNX_RULES)
    assert outcome.before == Counter({"Reshape": 1, "Flatten": 1}) and ops(outcome.after) == Counter({"Reshape": 1})
    assert constant(built, built.graph.node[-1].input[1]).tolist() == [6, 64]


def test_a_reshape_of_a_flatten_is_one_reshape():
    # onnx_fuse_reshapes, whose regrouping class has Flatten.
    nodes = [node("Flatten", ["x"], ["f"], axis=1), node("Reshape", ["f", "shape"], ["y"])]
    built = model(nodes, [tensor("x", FLOAT, ["b", 3, 4])], [initializer("shape", np.array([2, 6, 2]))])
    cases = [{"x": floats(2, 3, 4, seed=s)} for s in (0, 1)]
    outcome = rewrite_and_compare(built, cases, ONNX_RULES)
    assert outcome.after == Counter({"Reshape": 1})


def test_reshape_to_zero_and_minus_one_fails_on_an_empty_batch():
    # Why a Flatten over a symbolic batch is not Reshape(x, [0, -1]): onnxruntime cannot
    # solve the -1 beside a 0, where the Flatten runs.
    flatten = model([node("Flatten", ["x"], ["y"], axis=1)], [tensor("x", FLOAT, ["b", 3, 4])])
    reshape = model([node("Reshape", ["x", "shape"], ["y"])], [tensor("x", FLOAT, ["b", 3, 4])],
                    [initializer("shape", np.array([0, -1]))])
    empty = {"x": np.zeros((0, 3, 4), np.float32)}
    assert run(flatten, empty)[0].shape == (0, 12)
    with pytest.raises(Exception, match="cannot be reshaped"):
        run(reshape, empty)


NOT_FLATTENS = {
    "a flatten on its own": lambda: model([node("Flatten", ["x"], ["y"], axis=1)],
                                          [tensor("x", FLOAT, ["b", 3, 4])]),
    "axis 0 of a matrix whose rows may be many": lambda: model([node("Flatten", ["x"], ["y"], axis=0)],
                                                              [tensor("x", FLOAT, ["b", 4])]),
    "a vector": lambda: model([node("Flatten", ["x"], ["y"], axis=1)], [tensor("x", FLOAT, ["n"])]),
    "a scalar": lambda: model([node("Flatten", ["x"], ["y"], axis=0)], [tensor("x", FLOAT, [])]),
    "a squeeze over a symbolic batch would need [0, -1]": lambda: model(
        [node("Squeeze", ["x", "axes"], ["s"]), node("Flatten", ["s"], ["y"], axis=1)],
        [tensor("x", FLOAT, ["b", 1, "s", 4])], [initializer("axes", np.array([1]))]),
    "the inner reshape read elsewhere": lambda: model(
        [node("Reshape", ["x", "shape"], ["r"]), node("Flatten", ["r"], ["f"], axis=2), node("Relu", ["r"], ["q"]),
         node("Reshape", ["q", "back"], ["p"]), node("Add", ["f", "p"], ["y"])],
        [tensor("x", FLOAT, [2, 12])],
        [initializer("shape", np.array([2, 3, 4])), initializer("back", np.array([6, 4]))]),
    "a transpose": lambda: model([node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
                                  node("Flatten", ["t"], ["y"], axis=2)], [tensor("x", FLOAT, [2, 3, 4])]),
}


@pytest.mark.parametrize("case", sorted(NOT_FLATTENS))
def test_what_is_no_flatten_rewrite_stays(case):
    built = NOT_FLATTENS[case]()
    unchanged(built, ONNX_RULES.only(*FLATTEN_RULES))
    unchanged(built)


# ---------------------------------------------------------------- the bundled exports

MODELS = Path(__file__).resolve().parent.parent / "backends" / "onnx_models"
# The exports that have a Max, Min or Flatten at all. None is a chain: the dynamo
# exports' Max broadcasts two index ranges for a Shape, T5's Min clamps a bucket by a
# constant, and the TorchScript exports' Flatten reads a Cast of a ConstantOfShape.
BUNDLED = [f"{name}_{exporter}.onnx" for name in ("gpt2", "llama", "t5_encoder")
           for exporter in ("dynamo", "torchscript")]


@pytest.mark.parametrize("name", BUNDLED)
def test_the_rules_on_the_bundled_exports(name):
    from test_onnx_exported_models import MANIFEST, _feeds

    (entry,) = [e for e in MANIFEST["files"] if e["file"] == name]
    built = onnx.load(str(MODELS / name))
    assert {"Max", "Min", "Flatten"} & set(counts(built))
    after = deepcopy(built)
    result = optimize(after)
    fires = {rule: n.fires for rule, n in result.statistics.rules.items() if n.fires}
    assert not set(fires) & set(MAX_MIN_RULES + FLATTEN_RULES)
    onnx.checker.check_model(after, full_check=True)
    for seed, shape in enumerate(entry["test_shapes"]):
        case = _feeds(entry, shape, seed)
        for old, new in zip(run(built, case), run(after, case)):
            assert old.shape == new.shape and old.dtype == new.dtype
            np.testing.assert_allclose(new, old, rtol=1e-5, atol=1e-5)
