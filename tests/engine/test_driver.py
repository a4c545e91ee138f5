"""The engine over a toy IR: matching, conditions, sweeps, order, cap and cleanup."""

from __future__ import annotations

import numpy as np
import pytest

import rewrite
from rewrite.engine.driver import RewriteLimitError
from tests.engine.toy_ir import Block, Graph, Op, ToyAdapter, Value, evaluate, load_toy_rules

DOUBLE_NEGATION = """
dialect toy
rule double_negation "neg(neg(x)) is x."
  match %outer = neg(x=%inner)
  match %inner = neg(x=%x)
  rewrite %outer -> %x
"""

TILES = """
dialect toy
class broadcasting = add | mul | sub
rule drop_tile "a tile of size-1 axes into a broadcasting op goes"
  match %t = tile(x=%x, reps=%reps)
  where forall axis in axes(%x): %reps[axis] == 1 or dim(%x, axis) == 1
  where not block_output(%t)
  where every use %u of %t:
          %u is broadcasting(%t, %other) in any order
          and same_block(%u, %t)
          and %other is not %t
          and forall axis in axes(%t) where %reps[axis] > 1:
                aligned_dim(%other, axis, of=%t) == %reps[axis]
  rewrite %t -> %x
"""


def _apply(write_rules, text, graph):
    rules = load_toy_rules(write_rules(text))
    return rules.apply_with(ToyAdapter(graph))


def _negation_chain(length):
    graph = Graph()
    value = graph.input("x", (4,))
    for _ in range(length):
        value = graph.op("neg", x=value, shape=(4,))
    graph.main.outputs = [graph.op("exp", x=value, shape=(4,))]
    return graph


@pytest.mark.parametrize("length, left", [(1, 1), (2, 0), (4, 0), (5, 1)])
def test_chains_rewrite_to_a_fixed_point(write_rules, length, left):
    graph = _negation_chain(length)
    inputs = {"x": np.linspace(-1, 1, 4)}
    before = evaluate(graph, inputs)
    statistics = _apply(write_rules, DOUBLE_NEGATION, graph)
    assert graph.count("neg") == left
    assert statistics.fired("double_negation") == length // 2
    np.testing.assert_allclose(evaluate(graph, inputs)[0], before[0])


def test_later_decisions_see_earlier_rewrites_in_the_same_sweep(write_rules):
    graph = Graph()
    x, z = graph.input("x", (1,)), graph.input("z", (1,))
    tx = graph.op("tile", x=x, reps=graph.const([8]), shape=(8,))
    tz = graph.op("tile", x=z, reps=graph.const([8]), shape=(8,))
    graph.main.outputs = [graph.op("add", x=tx, y=tz, shape=(8,))]
    inputs = {"x": np.array([2.0]), "z": np.array([3.0])}
    before = evaluate(graph, inputs)[0]
    statistics = _apply(write_rules, TILES, graph)
    # Removing either tile is sound; removing both would shrink the output to (1,).
    assert graph.count("tile") == 1
    assert statistics.fired("drop_tile") == 1
    after = evaluate(graph, inputs)[0]
    assert after.shape == (8,)
    np.testing.assert_array_equal(after, before)


def test_dead_ops_are_removed_with_the_anchor(write_rules):
    graph = Graph()
    x, y = graph.input("x", (4, 8)), graph.input("y", (4, 1))
    t = graph.op("tile", x=y, reps=graph.const([1, 8]), shape=(4, 8))
    graph.main.outputs = [graph.op("mul", x=x, y=t, shape=(4, 8))]
    assert graph.count() == 3
    statistics = _apply(write_rules, TILES, graph)
    assert graph.count() == 1  # the tile and its reps const are gone
    assert statistics.removed_ops == 2


def test_unknown_never_fires(write_rules):
    graph = Graph()
    x, y = graph.input("x", ("b", "c")), graph.input("y", ("b", 1))
    t = graph.op("tile", x=y, reps=graph.const([1, 8]), shape=("b", 8))
    graph.main.outputs = [graph.op("mul", x=x, y=t, shape=("b", 8))]
    assert _apply(write_rules, TILES, graph).fired("drop_tile") == 0
    assert graph.count("tile") == 1


def test_nested_blocks_are_rewritten_in_place(write_rules):
    graph = Graph()
    x = graph.input("x", (4,))
    inner = Block()
    value = graph.op("neg", x=x, shape=(4,), block=inner)
    value = graph.op("neg", x=value, shape=(4,), block=inner)
    inner.outputs = [graph.op("exp", x=value, shape=(4,), block=inner)]
    branch = Op("branch", {}, [], graph.main, [inner], "branch")
    branch.outputs.append(Value("branch_out", (4,), producer=branch, block=graph.main))
    graph.main.ops.append(branch)
    graph.main.outputs = [branch.outputs[0]]
    inputs = {"x": np.arange(4.0)}
    before = evaluate(graph, inputs)[0]
    _apply(write_rules, DOUBLE_NEGATION, graph)
    assert graph.count("neg") == 0
    np.testing.assert_allclose(evaluate(graph, inputs)[0], before)


def test_benefit_orders_rules_on_one_anchor(write_rules):
    text = """
    dialect toy
    rule low "first in the file, low benefit"
      match %y = exp(x=%x)
      rewrite %y -> neg(x=%x)
    rule high "second in the file, higher benefit"
      match %y = exp(x=%x)
      benefit 5
      rewrite %y -> %x
    """
    graph = Graph()
    x = graph.input("x", (2,))
    graph.main.outputs = [graph.op("mul", x=graph.op("exp", x=x, shape=(2,)), y=x, shape=(2,))]
    statistics = _apply(write_rules, text, graph)
    assert statistics.fired("high") == 1 and statistics.fired("low") == 0
    assert graph.count("exp") == 0 and graph.count("neg") == 0


def test_the_cap_names_the_rules_still_firing(write_rules):
    text = """
    dialect toy
    rule forever "rebuilds its own anchor"
      match %y = exp(x=%x)
      rewrite %y -> exp(x=%x)
    """
    graph = Graph()
    x = graph.input("x", (2,))
    graph.main.outputs = [graph.op("exp", x=x, shape=(2,))]
    rules = load_toy_rules(write_rules(text))
    with pytest.raises(RewriteLimitError, match=r"still firing after 5 sweeps: forever"):
        rules.apply_with(ToyAdapter(graph), max_sweeps=5)


def test_runs_are_deterministic(write_rules):
    results = []
    for _ in range(2):
        graph = _negation_chain(6)
        statistics = _apply(write_rules, DOUBLE_NEGATION, graph)
        results.append((statistics.as_dict()["rules"]["double_negation"]["fires"], [op.type for op in graph.main.ops]))
    assert results[0] == results[1]


def test_rest_operands_and_any_order(write_rules):
    text = """
    dialect toy
    rule exp_first "sum(..., exp(x), ...) with exp moved first"
      match %s = sum(%e = exp(x=%x), %rest...) in any order
      where len(%rest) == 2
      rewrite %s -> add(x=%e, y=%x)
    """
    graph = Graph()
    a, b = graph.input("a", (2,)), graph.input("b", (2,))
    e = graph.op("exp", x=a, shape=(2,))
    graph.main.outputs = [graph.op("sum", values=(b, e, b), shape=(2,))]
    statistics = _apply(write_rules, text, graph)
    assert statistics.fired("exp_first") == 1
    assert graph.count("sum") == 0 and graph.count("add") == 1


def test_registered_predicates_decide(write_rules):
    seen = []

    @rewrite.register_predicate("named_x", "value")
    def named_x(context, value):
        seen.append(context.adapter.value_name(value))
        return context.adapter.value_name(value) == "x"

    try:
        text = """
        dialect toy
        rule drop_exp_of_x "exp of the input named x goes"
          match %y = exp(x=%v)
          where named_x(%v)
          rewrite %y -> %v
        """
        graph = Graph()
        x, z = graph.input("x", (2,)), graph.input("z", (2,))
        graph.main.outputs = [graph.op("add", x=graph.op("exp", x=x, shape=(2,)),
                                       y=graph.op("exp", x=z, shape=(2,)), shape=(2,))]
        statistics = _apply(write_rules, text, graph)
        assert statistics.fired("drop_exp_of_x") == 1
        assert seen[:2] == ["x", "z"]  # program order; later sweeps ask again about z
        assert graph.count("exp") == 1
    finally:
        rewrite.unregister_predicate("named_x")


def test_patterns_in_a_quantifier_filter_bind_for_its_body(write_rules):
    text = """
    dialect toy
    rule add_of_negated "add(a, neg(y)) where y is not the add itself becomes sub(a, y)"
      match %s = add(x=%a, y=%b)
      where forall i in [0] where %b is neg(x=%y): %y is not %s
      where %b is neg(x=%y)
      rewrite %s -> sub(x=%a, y=%y)
    """
    graph = Graph()
    a, y = graph.input("a", (3,)), graph.input("y", (3,))
    graph.main.outputs = [graph.op("add", x=a, y=graph.op("neg", x=y, shape=(3,)), shape=(3,))]
    inputs = {"a": np.array([1.0, 2.0, 3.0]), "y": np.array([0.5, 0.5, 4.0])}
    before = evaluate(graph, inputs)[0]
    statistics = _apply(write_rules, text, graph)
    assert statistics.fired("add_of_negated") == 1
    assert graph.count("add") == 0 and graph.count("neg") == 0 and graph.count("sub") == 1
    np.testing.assert_allclose(evaluate(graph, inputs)[0], before)
