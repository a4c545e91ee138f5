"""remove_broadcast_expand and remove_broadcast_tile on hand-built ONNX graphs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from onnx_cases import (
    BOOL,
    FLOAT,
    INT64,
    RULES,
    floats,
    initializer,
    model,
    node,
    rewrite_and_compare,
    tensor,
)


def _mean_times_x(consumer="Mul", shape_from="shape_of_x"):
    nodes = [node("ReduceMean", ["x", "axes"], ["m"], keepdims=1)]
    if shape_from == "shape_of_x":
        nodes.append(node("Shape", ["x"], ["s"]))
    nodes += [node("Expand", ["m", "s"], ["e"]), node(consumer, ["x", "e"], ["y"])]
    initializers = [initializer("axes", np.array([-1], dtype=np.int64))]
    if shape_from == "constant":
        initializers.append(initializer("s", np.array([1, 16], dtype=np.int64)))
    return model(nodes, [tensor("x", FLOAT, ["b", 16])], [tensor("y", FLOAT, ["b", 16])], initializers)


FEEDS = [{"x": floats(2, 16)}, {"x": floats(5, 16, seed=1)}]


@pytest.mark.parametrize("consumer", ["Mul", "Add", "Sub", "Div", "Max", "Min", "Sum", "Mean", "Pow"])
def test_expand_to_the_shape_of_the_other_operand_goes(consumer):
    outcome = rewrite_and_compare(_mean_times_x(consumer), FEEDS)
    assert outcome.fired == 1
    assert outcome.before["Expand"] == 1 and outcome.after["Expand"] == 0
    assert outcome.after["Shape"] == 0  # the shape plumbing died with it


def test_expand_to_a_constant_shape_that_only_widens_a_literal_axis():
    outcome = rewrite_and_compare(_mean_times_x(shape_from="constant"), FEEDS)
    assert outcome.fired == 1 and outcome.after["Expand"] == 0


def test_where_with_three_operands():
    nodes = [
        node("Shape", ["x"], ["s"]),
        node("Expand", ["fill", "s"], ["e"]),
        node("Where", ["mask", "x", "e"], ["y"]),
    ]
    built = model(
        nodes,
        [tensor("mask", BOOL, ["b", 16]), tensor("x", FLOAT, ["b", 16])],
        [tensor("y", FLOAT, ["b", 16])],
        [initializer("fill", np.array([[-1e9]], dtype=np.float32))],
    )
    feeds = [{"mask": floats(b, 16) > 0, "x": floats(b, 16, seed=b)} for b in (2, 5)]
    outcome = rewrite_and_compare(built, feeds)
    assert outcome.fired == 1 and outcome.after["Expand"] == 0


def test_torchscript_expand_minus_one_chain_is_followed():
    # x.expand(-1, 16) as the TorchScript exporter spells it:
    # Where(Equal(shape, -1), ones_like(shape), shape) feeding Expand.
    nodes = [
        node("Shape", ["x"], ["shape_x"]),
        node("Gather", ["shape_x", "zero"], ["batch"], axis=0),
        node("Unsqueeze", ["batch", "axis0"], ["batch_1d"]),
        node("Concat", ["batch_1d", "sixteen"], ["wanted"], axis=0),
        node("Equal", ["wanted", "minus_one"], ["is_free"]),
        node("ConstantOfShape", ["two"], ["ones"], value=helper.make_tensor("v", INT64, [1], [1])),
        node("Where", ["is_free", "ones", "wanted"], ["target"]),
        node("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
        node("Expand", ["m", "target"], ["e"]),
        node("Mul", ["x", "e"], ["y"]),
    ]
    built = model(
        nodes, [tensor("x", FLOAT, ["b", 16])], [tensor("y", FLOAT, ["b", 16])],
        [
            initializer("zero", np.array(0, dtype=np.int64)),
            initializer("axis0", np.array([0], dtype=np.int64)),
            initializer("sixteen", np.array([16], dtype=np.int64)),
            initializer("minus_one", np.array([-1], dtype=np.int64)),
            initializer("two", np.array([2], dtype=np.int64)),
            initializer("axes", np.array([-1], dtype=np.int64)),
        ],
    )
    outcome = rewrite_and_compare(built, FEEDS)
    assert outcome.fired == 1 and outcome.after["Expand"] == 0


def test_tile_with_constant_repeats_goes():
    nodes = [node("ReduceMean", ["x", "axes"], ["m"], keepdims=1), node("Tile", ["m", "repeats"], ["t"]),
             node("Add", ["t", "x"], ["y"])]
    built = model(nodes, [tensor("x", FLOAT, [4, 16])], [tensor("y", FLOAT, [4, 16])],
                  [initializer("axes", np.array([-1], dtype=np.int64)),
                   initializer("repeats", np.array([1, 16], dtype=np.int64))])
    outcome = rewrite_and_compare(built, [{"x": floats(4, 16)}, {"x": floats(4, 16, seed=3)}])
    assert outcome.fired == 1 and outcome.after["Tile"] == 0


# ------------------------------------------------------------------ kept


def test_the_published_counterexample_is_kept():
    # x: float[?], s a graph input, y: float[1]; with x=[1.], s=[5] bypassing
    # would shrink the output from (5,) to (1,).
    built = model(
        [node("Expand", ["x", "s"], ["e"]), node("Add", ["e", "y"], ["out"])],
        [tensor("x", FLOAT, [None]), tensor("s", INT64, [1]), tensor("y", FLOAT, [1])],
        [tensor("out", FLOAT, [None])],
    )
    feeds = [
        {"x": np.array([1.0], np.float32), "s": np.array([5], np.int64), "y": np.array([2.0], np.float32)},
        {"x": np.array([1.0, 2.0], np.float32), "s": np.array([2], np.int64), "y": np.array([2.0], np.float32)},
    ]
    outcome = rewrite_and_compare(built, feeds)
    assert outcome.fired == 0 and outcome.after["Expand"] == 1


def test_prelu_slope_is_one_way_and_kept():
    nodes = [node("Shape", ["x"], ["s"]), node("Expand", ["slope", "s"], ["e"]), node("PRelu", ["x", "e"], ["y"])]
    built = model(nodes, [tensor("x", FLOAT, ["b", 16])], [tensor("y", FLOAT, ["b", 16])],
                  [initializer("slope", np.full((1, 16), 0.1, np.float32))])
    outcome = rewrite_and_compare(built, FEEDS)
    assert outcome.fired == 0 and outcome.after["Expand"] == 1


def test_expand_in_front_of_prelus_x_is_kept():
    nodes = [node("Expand", ["x", "s"], ["e"]), node("PRelu", ["e", "slope"], ["y"])]
    built = model(nodes, [tensor("x", FLOAT, [1, 16])], [tensor("y", FLOAT, [4, 16])],
                  [initializer("s", np.array([4, 16], np.int64)),
                   initializer("slope", np.full((4, 16), 0.1, np.float32))])
    outcome = rewrite_and_compare(built, [{"x": floats(1, 16)}, {"x": floats(1, 16, seed=2)}])
    assert outcome.fired == 0


def test_other_operand_without_the_full_size_is_kept():
    nodes = [node("Expand", ["x", "s"], ["e"]), node("Mul", ["e", "z"], ["y"])]
    built = model(nodes, [tensor("x", FLOAT, ["b", 1]), tensor("z", FLOAT, ["b", 1])],
                  [tensor("y", FLOAT, ["b", 16])], [initializer("s", np.array([1, 16], np.int64))])
    feeds = [{"x": floats(b, 1), "z": floats(b, 1, seed=b)} for b in (2, 5)]
    outcome = rewrite_and_compare(built, feeds)
    assert outcome.fired == 0 and outcome.after["Expand"] == 1


def test_expand_that_is_both_operands_is_kept():
    nodes = [node("Expand", ["x", "s"], ["e"]), node("Mul", ["e", "e"], ["y"])]
    built = model(nodes, [tensor("x", FLOAT, [4, 1])], [tensor("y", FLOAT, [4, 16])],
                  [initializer("s", np.array([4, 16], np.int64))])
    outcome = rewrite_and_compare(built, [{"x": floats(4, 1)}, {"x": floats(4, 1, seed=4)}])
    assert outcome.fired == 0


def test_expand_that_raises_the_rank_is_kept_when_others_lack_it():
    nodes = [node("Expand", ["x", "s"], ["e"]), node("Add", ["e", "z"], ["y"])]
    built = model(nodes, [tensor("x", FLOAT, [16]), tensor("z", FLOAT, [16])], [tensor("y", FLOAT, [4, 16])],
                  [initializer("s", np.array([4, 16], np.int64))])
    outcome = rewrite_and_compare(built, [{"x": floats(16), "z": floats(16, seed=1)}])
    assert outcome.fired == 0


def test_an_axis_passed_through_needs_no_proof_whatever_its_name():
    # The Expand keeps axis 0 ('b' to 'b'); y calls that axis 'c'. Nothing is
    # compared there, and the output is the same at any runtime sizes.
    nodes = [node("Shape", ["x"], ["s"]), node("Expand", ["m", "s"], ["e"]), node("Mul", ["e", "y"], ["out"])]
    built = model(nodes, [tensor("x", FLOAT, ["b", 16]), tensor("m", FLOAT, ["b", 1]), tensor("y", FLOAT, ["c", 16])],
                  [tensor("out", FLOAT, [None, 16])])
    feeds = [{"x": floats(3, 16), "m": floats(3, 1), "y": floats(3, 16, seed=2)},
             {"x": floats(1, 16), "m": floats(1, 1), "y": floats(4, 16, seed=3)}]
    outcome = rewrite_and_compare(built, feeds)
    assert outcome.fired == 1


def test_a_widened_symbolic_axis_needs_the_same_symbol():
    # The Expand widens axis 0 from 1 to 'b'; y has 'c' there. With b=4, c=1
    # bypassing would shrink the output from (4, 16) to (1, 16).
    nodes = [node("Shape", ["x"], ["s"]), node("Expand", ["m", "s"], ["e"]), node("Mul", ["e", "y"], ["out"])]
    built = model(nodes, [tensor("x", FLOAT, ["b", 16]), tensor("m", FLOAT, [1, 16]), tensor("y", FLOAT, ["c", 16])],
                  [tensor("out", FLOAT, [None, 16])])
    feeds = [{"x": floats(4, 16), "m": floats(1, 16), "y": floats(1, 16, seed=2)},
             {"x": floats(3, 16), "m": floats(1, 16), "y": floats(3, 16, seed=3)}]
    outcome = rewrite_and_compare(built, feeds)
    assert outcome.fired == 0 and outcome.after["Expand"] == 1


def test_a_widened_symbolic_axis_with_the_same_symbol_goes():
    nodes = [node("Shape", ["x"], ["s"]), node("Expand", ["m", "s"], ["e"]), node("Mul", ["e", "x"], ["out"])]
    built = model(nodes, [tensor("x", FLOAT, ["b", 16]), tensor("m", FLOAT, [1, 16])],
                  [tensor("out", FLOAT, ["b", 16])])
    feeds = [{"x": floats(4, 16), "m": floats(1, 16)}, {"x": floats(1, 16, seed=5), "m": floats(1, 16)}]
    outcome = rewrite_and_compare(built, feeds)
    assert outcome.fired == 1 and outcome.after["Expand"] == 0


def test_reused_exporter_placeholders_do_not_make_dims_equal():
    # value_info claims e and y share 'Expand_dim0'; only graph inputs are trusted.
    nodes = [node("Expand", ["m", "s"], ["e"]), node("Mul", ["e", "y"], ["out"])]
    built = model(
        nodes,
        [tensor("m", FLOAT, ["b", 1]), tensor("s", INT64, [2]), tensor("y", FLOAT, ["c", 16])],
        [tensor("out", FLOAT, [None, 16])],
        value_info=[tensor("e", FLOAT, ["Expand_dim0", 16])],
    )
    feeds = [{"m": floats(2, 1), "s": np.array([2, 16], np.int64), "y": floats(2, 16)}]
    outcome = rewrite_and_compare(built, feeds)
    assert outcome.fired == 0


def test_expand_that_is_a_graph_output_is_kept():
    nodes = [node("Shape", ["x"], ["s"]), node("Expand", ["m", "s"], ["e"]), node("Mul", ["x", "e"], ["y"])]
    built = model(nodes, [tensor("x", FLOAT, ["b", 16]), tensor("m", FLOAT, ["b", 1])],
                  [tensor("y", FLOAT, ["b", 16]), tensor("e", FLOAT, ["b", 16])])
    feeds = [{"x": floats(2, 16), "m": floats(2, 1)}]
    outcome = rewrite_and_compare(built, feeds)
    assert outcome.fired == 0


def _if_model(expand_inside: bool):
    branch_nodes = [node("Mul", ["x", "e"], ["then_y"])]
    if expand_inside:
        branch_nodes = [node("Shape", ["x"], ["s"]), node("Expand", ["m", "s"], ["e"])] + branch_nodes
    then_branch = helper.make_graph(branch_nodes, "then", [], [tensor("then_y", FLOAT, ["b", 16])])
    else_branch = helper.make_graph([node("Identity", ["x"], ["else_y"])], "else", [],
                                    [tensor("else_y", FLOAT, ["b", 16])])
    outer = [node("If", ["flag"], ["y"], then_branch=then_branch, else_branch=else_branch)]
    if not expand_inside:
        outer = [node("Shape", ["x"], ["s"]), node("Expand", ["m", "s"], ["e"])] + outer
    return model(outer, [tensor("flag", BOOL, []), tensor("x", FLOAT, ["b", 16]), tensor("m", FLOAT, ["b", 1])],
                 [tensor("y", FLOAT, ["b", 16])])


def _if_feeds():
    return [{"flag": np.array(f), "x": floats(b, 16, seed=b), "m": floats(b, 1)} for f in (True, False) for b in (2, 5)]


def test_expand_and_consumer_inside_a_branch_go():
    built = _if_model(expand_inside=True)
    outcome = rewrite_and_compare(built, _if_feeds())
    assert outcome.fired == 1
    (then_branch,) = [a.g for a in built.graph.node[0].attribute if a.name == "then_branch"]
    assert [n.op_type for n in then_branch.node] == ["Mul"]


def test_expand_outside_consumed_inside_a_branch_is_kept():
    built = _if_model(expand_inside=False)
    outcome = rewrite_and_compare(built, _if_feeds())
    assert outcome.fired == 0 and outcome.after["Expand"] == 1


def test_idempotent():
    built = _mean_times_x()
    assert rewrite_and_compare(built, FEEDS).fired == 1
    text = built.SerializeToString()
    assert rewrite_and_compare(built, FEEDS).fired == 0
    assert built.SerializeToString() == text


def test_many_expands_sharing_one_shape_initializer_all_go():
    # The shared shape constant loses a use per rewrite; its use list is
    # compacted lazily, and everything it feeds must still be right.
    nodes, previous = [], "x"
    for index in range(40):
        nodes += [node("Expand", ["m", "s"], [f"e{index}"]), node("Mul", [previous, f"e{index}"], [f"y{index}"])]
        previous = f"y{index}"
    built = model(nodes, [tensor("x", FLOAT, [4, 16]), tensor("m", FLOAT, [4, 1])], [tensor(previous, FLOAT, [4, 16])],
                  [initializer("s", np.array([1, 16], np.int64))])
    feeds = [{"x": floats(4, 16), "m": np.full((4, 1), 1.01, np.float32)}]
    outcome = rewrite_and_compare(built, feeds)
    assert outcome.fired == 40 and outcome.after["Expand"] == 0


@pytest.mark.parametrize("op_type", ["Sum", "Max", "Min", "Mean"])
def test_a_variadic_op_with_the_expand_as_its_only_input_is_kept(op_type):
    # With no other operand nothing carries the widened size: bypassing
    # would shrink the output from (4, 16) to (1, 16).
    nodes = [node("Expand", ["x", "s"], ["e"]), node(op_type, ["e"], ["y"])]
    built = model(nodes, [tensor("x", FLOAT, [1, 16])], [tensor("y", FLOAT, [4, 16])],
                  [initializer("s", np.array([4, 16], np.int64))])
    # (A lone Max or Min of one value is that value, onnx_remove_max_min_of_one_value,
    # which leaves the Expand as it is: the Expand rules are what this is about.)
    outcome = rewrite_and_compare(built, [{"x": floats(1, 16)}], RULES.only("remove_broadcast_expand"))
    assert outcome.fired == 0 and outcome.after["Expand"] == 1
