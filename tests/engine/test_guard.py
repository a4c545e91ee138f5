"""The shape guard refuses every rewrite whose consumers' types it cannot prove unchanged.

The rules here are deliberately unsound (they drop a tile with no condition
at all), so that what stops them is the guard alone.
"""

from __future__ import annotations

import numpy as np
import pytest

from rewrite import UnsoundRewriteError
from tests.engine.toy_ir import Graph, evaluate, load_toy_rules

RECKLESS = """
dialect toy
rule drop_tile "drops any tile, proving nothing"
  match %t = tile(x=%x, reps=_)
  rewrite %t -> %x
"""

RECKLESS_IN_ONE_CONSUMER = """
dialect toy
rule drop_tile_in_add "drops a tile in its add consumer only, proving nothing"
  match %u = add(x=%t, y=_)
  match %t = tile(x=%x, reps=_)
  rewrite %t -> %x in %u
"""


def _run(write_rules, text, graph, **options):
    rules = load_toy_rules(write_rules(text))
    from tests.engine.toy_ir import ToyAdapter

    return rules.apply_with(ToyAdapter(graph), **options)


def _tile_into(consumer, x_shape, tiled_shape, other_shape, reps, out_shape=None):
    graph = Graph()
    x = graph.input("x", x_shape)
    other = graph.input("other", other_shape)
    tiled = graph.op("tile", x=x, reps=graph.const(reps), shape=tiled_shape)
    out_shape = out_shape or tuple(np.broadcast_shapes(tiled_shape, other_shape))
    graph.main.outputs = [graph.op(consumer, x=tiled, y=other, shape=out_shape)]
    return graph


@pytest.mark.parametrize("x_shape, tiled_shape, other_shape, reps, out_shape, why", [
    ((1, 16), (4, 16), (1, 16), [4, 1], None, "the other operand is 1 where the tile widened"),
    ((16,), (1, 16), (16,), [1, 1], None, "the tile raised the rank the output has"),
    ((1, 16), (0, 16), (1, 16), [0, 1], None, "a zero repeat: the output would grow from 0 to 1"),
    ((1, 1), ("b", 8), ("c", 8), ["b", 8], ("d", 8), "the output's first dim is proved to be neither b nor c"),
])
def test_an_unproved_rewrite_is_refused(write_rules, x_shape, tiled_shape, other_shape, reps, out_shape, why):
    graph = _tile_into("add", x_shape, tiled_shape, other_shape, [1, 1] if "b" in reps else reps, out_shape)
    statistics = _run(write_rules, RECKLESS, graph)
    assert graph.count("tile") == 1, why
    assert statistics.fired("drop_tile") == 0
    assert statistics.rules["drop_tile"].refused >= 1


def test_a_proved_rewrite_goes_through(write_rules):
    graph = _tile_into("mul", (4, 1), (4, 16), (4, 16), [1, 16])
    inputs = {"x": np.arange(4.0).reshape(4, 1), "other": np.ones((4, 16))}
    before = evaluate(graph, inputs)[0]
    statistics = _run(write_rules, RECKLESS, graph)
    assert statistics.fired("drop_tile") == 1 and statistics.refused == 0
    assert graph.count("tile") == 0
    np.testing.assert_array_equal(evaluate(graph, inputs)[0], before)


def test_a_symbolic_axis_passed_through_needs_no_proof(write_rules):
    graph = _tile_into("mul", ("b", 1), ("b", 16), ("c", 16), [1, 16], out_shape=("b", 16))
    assert _run(write_rules, RECKLESS, graph).fired("drop_tile") == 1


def test_a_consumer_that_does_not_broadcast_is_refused(write_rules):
    graph = Graph()
    x = graph.input("x", (1,))
    tiled = graph.op("tile", x=x, reps=graph.const([8]), shape=(8,))
    graph.main.outputs = [graph.op("neg", x=tiled, shape=(8,))]
    statistics = _run(write_rules, RECKLESS, graph)
    assert graph.count("tile") == 1 and statistics.rules["drop_tile"].refused == 1


def test_a_block_output_keeps_its_type(write_rules):
    graph = Graph()
    x = graph.input("x", (1, 4))
    tiled = graph.op("tile", x=x, reps=graph.const([3, 1]), shape=(3, 4))
    graph.main.outputs = [tiled]
    assert _run(write_rules, RECKLESS, graph).fired("drop_tile") == 0
    assert graph.count("tile") == 1


def test_both_operands_of_one_op_are_looked_at_together(write_rules):
    # mul(t, t): dropping the tile takes both operands back to (1,).
    graph = Graph()
    x = graph.input("x", (1,))
    tiled = graph.op("tile", x=x, reps=graph.const([8]), shape=(8,))
    graph.main.outputs = [graph.op("mul", x=tiled, y=tiled, shape=(8,))]
    assert _run(write_rules, RECKLESS, graph).fired("drop_tile") == 0


def test_a_replacement_in_one_consumer_is_guarded_too(write_rules):
    graph = _tile_into("add", (1, 16), (4, 16), (1, 16), [4, 1])
    statistics = _run(write_rules, RECKLESS_IN_ONE_CONSUMER, graph)
    assert statistics.fired("drop_tile_in_add") == 0 and graph.count("tile") == 1


def test_refused_rewrites_leave_nothing_they_built(write_rules):
    text = """
    dialect toy
    rule negate_twice "replaces a tile by a wrong-shaped value it builds"
      match %t = tile(x=%x, reps=_)
      rewrite %t -> neg(x=%x)
    """
    graph = _tile_into("add", (1, 16), (4, 16), (1, 16), [4, 1])
    count = graph.count()
    statistics = _run(write_rules, text, graph)
    assert statistics.refused >= 1 and graph.count() == count and graph.count("neg") == 0


def test_checked_mode_makes_a_refusal_an_error_naming_the_rule(write_rules):
    graph = _tile_into("add", (1, 16), (4, 16), (1, 16), [4, 1])
    with pytest.raises(UnsoundRewriteError, match="rule 'drop_tile'.*shape guard refused.*axis 0"):
        _run(write_rules, RECKLESS, graph, check_types=True)
