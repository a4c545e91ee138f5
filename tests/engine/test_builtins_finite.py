"""`max_finite(dtype)` and `lowest_finite(dtype)`: the finite range of a dtype,
for rules that fold constants to guard against overflow."""

from __future__ import annotations

import numpy as np
import pytest

from rewrite.api import RuleSet
from rewrite.engine.conditions import Conditions, Tracer
from rewrite.engine.matcher import Matcher
from rewrite.language.errors import RuleError
from rewrite.language.logic import Truth
from tests.engine.toy_ir import Graph, ToyAdapter, load_toy_rules

YES, NO, MAYBE = Truth.YES, Truth.NO, Truth.UNKNOWN

# (x * a) * b folded to x * (a*b); the guard keeps a*b finite in x's dtype.
FOLD = """
dialect toy
rule fold_scalar_muls "(x * a) * b is x * (a*b) when a*b stays finite"
  match %outer = mul(x=%inner = mul(x=%x, y=%a), y=%b)
  where is_const(%a) and is_const(%b)
  {guard}
  rewrite %outer -> mul(x=%x, y=as_dtype(const(%a) * const(%b), dtype(%x)))
"""
GUARD = "abs(const(%a) * const(%b)) <= max_finite(dtype(%x))"


def _graph(a: float, b: float, dtype: str = "fp16") -> Graph:
    graph = Graph()
    x = graph.input("x", (2, 3))
    x.dtype = dtype
    inner = graph.op("mul", x=x, y=graph.const(np.array(a, dtype=np.float16)), shape=(2, 3))
    graph.main.outputs = [graph.op("mul", x=inner, y=graph.const(np.array(b, dtype=np.float16)), shape=(2, 3))]
    return graph


def _verdict(write_rules, graph: Graph, condition: str) -> Truth:
    """The condition on `graph`'s last mul, decided untraced and traced (which must agree)."""
    (rule,) = load_toy_rules(write_rules(FOLD.format(guard=f"where {condition}"))).rules
    adapter = ToyAdapter(graph)
    matcher = Matcher(adapter)
    (env,) = list(matcher.match_rule(rule, graph.main.ops[-1]))
    conditions = [c.expr for c in rule.conditions]
    truth, _ = Conditions(adapter, matcher, {}).holds(conditions, env)
    assert Conditions(adapter, matcher, {}, tracer=Tracer()).holds(conditions, env)[0] is truth
    return truth


@pytest.mark.parametrize("condition", [
    "max_finite(fp16) == 65504 and lowest_finite(fp16) == -65504",
    "max_finite(fp32) == 3.4028234663852886e38",  # (2 - 2^-23) * 2^127
    "lowest_finite(fp32) == -max_finite(fp32)",
    "max_finite(fp64) > 1e308 and lowest_finite(fp64) < -1e308",
    "max_finite(bf16) == 3.3895313892515355e38 and lowest_finite(bf16) == -max_finite(bf16)",  # (2 - 2^-7) * 2^127
    "max_finite(int32) == 2147483647 and lowest_finite(int32) == -2147483648",
    "max_finite(int8) == 127 and lowest_finite(int8) == -128",
    "max_finite(uint8) == 255 and lowest_finite(uint8) == 0",
    "max_finite(int64) == 9223372036854775807 and lowest_finite(uint64) == 0",
    "max_finite(bool) == 1 and lowest_finite(bool) == 0",
    "lowest(fp16) < lowest_finite(fp16) and is_finite(max_finite(fp16))",
    "max_finite(dtype(%x)) == 65504",  # the dtype of a graph value
])
def test_the_finite_range_of_each_dtype(write_rules, condition):
    assert _verdict(write_rules, _graph(2.0, 3.0), condition) is YES


@pytest.mark.parametrize("condition", ['max_finite("fp17") == 1', 'lowest_finite("") == 1'])
def test_an_unknown_dtype_has_an_unknown_range(write_rules, condition):
    assert _verdict(write_rules, _graph(2.0, 3.0), condition) is MAYBE


@pytest.mark.parametrize("a, b, dtype, expected", [
    (2.0, 3.0, "fp16", YES),
    (300.0, 300.0, "fp16", NO),  # 90000 > 65504
    (-300.0, 300.0, "fp16", NO),  # abs: an overflow to -inf is one too
    (300.0, 300.0, "fp32", YES),
])
def test_the_overflow_guard(write_rules, a, b, dtype, expected):
    assert _verdict(write_rules, _graph(a, b, dtype), GUARD) is expected


@pytest.mark.parametrize("guarded", [True, False])
def test_without_the_guard_the_fold_overflows(write_rules, guarded):
    (rule,) = load_toy_rules(write_rules(FOLD.format(guard=f"where {GUARD}" if guarded else ""))).rules
    graph = _graph(300.0, 300.0)
    with np.errstate(over="ignore"):  # the unguarded fold overflows, as it is meant to here
        statistics = RuleSet((rule,)).apply_with(ToyAdapter(graph))
    assert statistics.fired("fold_scalar_muls") == (0 if guarded else 1)
    if not guarded:
        factor = graph.main.outputs[0].producer.inputs["y"].constant
        assert factor.dtype == np.float16 and np.isinf(factor)  # what the guard is for


def test_a_dtype_is_what_it_takes(write_rules):
    with pytest.raises(RuleError, match="argument 'dtype' of 'max_finite' must be string, not value"):
        load_toy_rules(write_rules(FOLD.format(guard="where max_finite(%x) > 0")))
