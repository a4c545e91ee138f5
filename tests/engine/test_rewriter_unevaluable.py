"""A rewrite value that cannot be evaluated means "do not fire": nothing changes,
the statistics count it, and nothing the rewrite built is left behind."""

from __future__ import annotations

import numpy as np
import pytest

from rewrite.engine.conditions import Conditions
from rewrite.engine.matcher import ABSENT, Matcher
from rewrite.engine.rewriter import find_unevaluable, why_no_value
from rewrite.language.logic import UNKNOWN, Symbol, Truth
from tests.engine.toy_ir import Graph, ToyAdapter, evaluate, load_toy_rules

FOLD_UNIFORM = """
dialect toy
rule fold_uniform "x * c, c one number repeated, is x times that number"
  match %m = mul(x=%x, y=%c)
  where is_const(%c) and rank(%c) == 1
  rewrite %m -> mul(x=%x, y=uniform(%c))
"""

# Builds an op first, then one it cannot evaluate: the first must not stay.
BUILD_THEN_FOLD = """
dialect toy
rule negate_then_fold "x * c is -x times minus c's one number"
  match %m = mul(x=%x, y=%c)
  where is_const(%c) and rank(%c) == 1
  rewrite
    %n = neg(x=%x)
    %m -> mul(x=%n, y=0 - uniform(%c))
"""

# The size of a symbolic dim is no constant to build with.
SCALE_BY_DIM = """
dialect toy
rule scale_by_rows "x + 0 becomes x times its row count (an engine test, not a sound rule)"
  match %a = add(x=%x, y=%z)
  where is_const(%z)
  rewrite %a -> mul(x=%x, y=dim(%x, 0))
"""


def _scaled(constant, x_shape=(4,)):
    graph = Graph()
    x = graph.input("x", x_shape)
    graph.main.outputs = [graph.op("mul", x=x, y=graph.const(np.asarray(constant, dtype=np.float32)),
                                   shape=x_shape)]
    return graph


def _types(graph):
    return [op.type for op in graph.main.ops]


@pytest.mark.parametrize("text", [FOLD_UNIFORM, BUILD_THEN_FOLD])
def test_a_rewrite_value_that_is_unknown_does_not_fire(write_rules, text):
    graph = _scaled([np.nan] * 4)
    before = _types(graph)
    statistics = load_toy_rules(write_rules(text)).apply_with(ToyAdapter(graph), check_types=True)
    # Not fired, not an error even in checked mode, and nothing built is left.
    assert statistics.fires == 0 and statistics.unevaluable == 1 and statistics.refused == 0
    assert _types(graph) == before
    counts = statistics.as_dict()["rules"]
    assert next(iter(counts.values()))["unevaluable"] == 1


@pytest.mark.parametrize("text", [FOLD_UNIFORM, BUILD_THEN_FOLD])
def test_a_rewrite_value_that_is_known_fires(write_rules, text):
    graph = _scaled([2.0] * 4)
    inputs = {"x": np.arange(4, dtype=np.float32)}
    expected = evaluate(graph, inputs)[0]
    statistics = load_toy_rules(write_rules(text)).apply_with(ToyAdapter(graph))
    assert statistics.fires == 1 and statistics.unevaluable == 0
    np.testing.assert_array_equal(evaluate(graph, inputs)[0], expected)


@pytest.mark.parametrize("x_shape, fires", [(("b", 4), False), ((3, 4), True)])
def test_a_symbolic_dim_is_no_value_to_build_with(write_rules, x_shape, fires):
    graph = Graph()
    x = graph.input("x", x_shape)
    graph.main.outputs = [graph.op("add", x=x, y=graph.const(np.zeros(4, dtype=np.float32)), shape=x_shape)]
    statistics = load_toy_rules(write_rules(SCALE_BY_DIM)).apply_with(ToyAdapter(graph))
    assert statistics.fires == int(fires) and statistics.unevaluable == int(not fires)
    assert ("mul" in _types(graph)) is fires


@pytest.mark.parametrize("value, reason", [
    (UNKNOWN, "it is unknown"),
    (Truth.UNKNOWN, "it is unknown"),
    (Symbol("b"), "it is the symbolic dim b, not a number"),
    (ABSENT, "it is an absent operand"),
    ([1, UNKNOWN], "element 1 is unknown"),
    ((1, [2, Symbol("n")]), "element 1 element 1 is the symbolic dim n, not a number"),
])
def test_what_has_no_value(value, reason):
    assert why_no_value(value) == reason


@pytest.mark.parametrize("value", [0, 1.5, float("nan"), "fp16", True, Truth.YES, [1, 2], None,
                                   np.array([np.nan, 1.0])])
def test_what_has_a_value(value):
    # NaN is a number a rule may well build; only what is not known is refused.
    assert why_no_value(value) is None


def test_the_innermost_part_without_a_value_is_named(write_rules):
    rules = load_toy_rules(write_rules(FOLD_UNIFORM.replace("y=uniform(%c)", "y=[1, uniform(%c) * 2]")))
    (rule,) = rules.rules
    graph = _scaled([np.nan] * 4)
    adapter = ToyAdapter(graph)
    mul = graph.main.ops[-1]
    env = {"%m": mul.outputs[0], "%x": mul.inputs["x"], "%c": mul.inputs["y"]}
    found = find_unevaluable(Conditions(adapter, Matcher(adapter), {}), rule.actions[0].replacement.arguments, env)
    assert found.argument.name == "y"
    assert type(found.expression).__name__ == "Call" and found.expression.function == "uniform"
    assert found.value is UNKNOWN and found.reason == "it is unknown"
    assert "operand 'y'" in str(found) and "cannot be evaluated" in str(found)
