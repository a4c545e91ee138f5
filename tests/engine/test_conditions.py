"""Each condition construct and builtin, evaluated to its exact three-valued answer."""

from __future__ import annotations

import numpy as np
import pytest

from rewrite.engine.conditions import Conditions, Tracer
from rewrite.engine.matcher import Matcher
from rewrite.language.logic import Truth
from tests.engine.toy_ir import Graph, ToyAdapter, load_toy_rules

YES, NO, MAYBE = Truth.YES, Truth.NO, Truth.UNKNOWN


@pytest.fixture
def graph():
    """y = add(x:(b, 8), tile(s:(1, 1), reps [4, 8])) with a second use of the tile."""
    graph = Graph()
    x = graph.input("x", ("b", 8))
    s = graph.input("s", (1, 1))
    reps = graph.const(np.array([4, 8]))
    tile = graph.op("tile", x=s, reps=reps, shape=(4, 8))
    total = graph.op("add", x=x, y=tile, shape=("b", 8))
    graph.main.outputs = [total, graph.op("exp", x=tile, shape=(4, 8))]
    return graph


CASES = [
    # literals, arithmetic, comparison
    ("1 + 2 * 3 == 7", YES),
    ("10 / 4 == 2.5 and 8 / 4 == 2", YES),
    ("-1 < 0", YES),
    ("mod(7, 3) == 1 and abs(-2) == 2", YES),
    # shapes: literal, symbolic, out of range
    ("rank(%x) == 2", YES),
    ("dim(%x, 1) == 8 and dim(%x, -1) == 8", YES),
    ("dim(%x, 0) == 4", MAYBE),  # b is not provably 4 ...
    ("dim(%x, 0) != 4", MAYBE),  # ... nor provably not 4
    ("dim(%x, 0) == dim(%x, 0)", YES),  # the same symbol
    ("dim(%x, 0) == 1", MAYBE),  # a symbol is never provably 1
    ("dim(%x, 5) == 8", MAYBE),  # no such axis: unknown, never yes
    ("is_symbolic(dim(%x, 0)) and not is_symbolic(dim(%x, 1))", YES),
    ("is_known(dim(%x, 1)) and not is_known(dim(%x, 0))", YES),
    ("shape(%t) == [4, 8]", YES),
    ("shape(%x) == [4, 8]", MAYBE),
    ("axes(%t) == [0, 1] and len(axes(%t)) == 2 and range(2) == [0, 1]", YES),
    ("aligned_dim(%s, 1, of=%t) == 1 and aligned_dim(%x, 0, of=%t) == 4", MAYBE),
    ("aligned_dim(%s, 1, of=%t) == 1", YES),
    # constants
    ("is_const(%reps) and not is_const(%x)", YES),
    ("const(%reps) == [4, 8] and %reps[0] == 4 and %reps[-1] == 8", YES),
    ("%reps[2] == 8", MAYBE),  # out of range
    ("%x[0] == 1", MAYBE),  # not a constant
    # dtypes and op types
    ('dtype(%x) == fp32 and dtype(%x) == "fp32"', YES),
    ('op_type(%t) == "tile" and op_type(%reps) == "const"', YES),
    ('op_type(%x) == "tile"', MAYBE),  # an input has no producing op
    # uses and blocks
    ("use_count(%t) == 2 and not one_use(%t)", YES),
    ("one_use(%reps) and not block_output(%reps)", YES),
    ("same_block(%t, %x)", YES),
    # identity and patterns
    ("%t is %t and %x is not %t", YES),
    ("%t is tile(x=%s2, reps=_) and %s2 is %s", YES),
    ("%t is not add(%a, %b)", YES),
    # quantifiers
    ("forall i in axes(%t): %reps[i] > 1", YES),
    ("forall i in axes(%t) where %reps[i] > 4: dim(%t, i) == 8", YES),
    ("exists i in axes(%x): is_symbolic(dim(%x, i))", YES),
    ("exists i in []: true", NO),
    ("forall i in axes(%x): dim(%x, i) == 8", MAYBE),
    ("forall i in axes(%x): dim(%x, i) == 9", NO),  # one literal no decides it
    # a filter that may or may not select an element (b == 4 is unknown)
    ("forall i in axes(%x) where dim(%x, i) == 4: false", MAYBE),
    ("forall i in axes(%x) where dim(%x, i) == 4: true", YES),
    ("forall i in axes(%x) where dim(%x, i) == 4 or i == 1: dim(%x, i) == 8", MAYBE),
    ("forall i in axes(%x) where dim(%x, i) == 4 or i == 1: i == 7", NO),
    ("exists i in axes(%x) where dim(%x, i) == 4: true", MAYBE),
    ("exists i in axes(%x) where dim(%x, i) == 4: false", NO),
    ("exists i in axes(%x) where dim(%x, i) == 4 or i == 1: dim(%x, i) == 8", YES),
    ("exists i in axes(%x) where not (dim(%x, i) == 8): dim(%x, i) == 1", MAYBE),
    # unknown arguments, positional and keyword
    ("aligned_dim(%x, dim(%x, 0), of=%t) == 4", MAYBE),
    ("aligned_dim(%s, 1, of=%reps[5]) == 1", MAYBE),
    ("dim(%reps[5], 0) == 1 or rank(%reps[5]) == 1", MAYBE),
    ("every use %u of %t: %u is add(_, _) or %u is exp(x=_)", YES),
    ("every use %u of %t: %u is add(%t, %other) in any order and rank(%other) == 2", NO),
    # conditional expressions and comprehensions: only a proved condition counts
    ("(1 if dim(%x, 1) == 8 else 2) == 1", YES),
    ("(1 if dim(%x, 0) == 4 else 2) == 2", YES),  # unknown picks the else branch
    ("[i * 2 for i in range(3)] == [0, 2, 4]", YES),
    ("[i for i in axes(%x) if is_known(dim(%x, i))] == [1]", YES),
    ("[i for i in axes(%x) if dim(%x, i) == 4] == []", YES),  # an unknown filter leaves the element out
    ("[%reps[i] for i in axes(%t)] == const(%reps)", YES),
    # tolerances, NaN and Inf
    ("close(1.00001, 1.0, rel=1e-4) and not close(1.01, 1.0, rel=1e-4)", YES),
    ("close(1.0001, 1.0, ulps=8, dtype=fp16) and not close(1.0001, 1.0, ulps=8, dtype=fp32)", YES),
    ("close(1.0, 1.0)", YES),
    ("close(1.0, 1.0000001)", NO),  # no tolerance given: exact
    ("close(nan, nan, rel=1.0) or close(inf, 1.0, abs=1e30)", NO),
    ("close(inf, inf)", YES),
    ("close(dim(%x, 0), 4, abs=1)", MAYBE),
    ("close(1.0, 1.0, ulps=1, dtype=int32)", MAYBE),  # an int dtype has no ulp
    ("is_nan(nan) and is_inf(-inf) and is_finite([1.0, 2.0]) and not is_finite([1.0, inf])", YES),
    ("is_finite(dim(%x, 0))", MAYBE),
    # uniform values, scaling chains, uses within the match
    ("uniform(%s) == 1", MAYBE),  # an input is no constant
    ("uniform(%reps) == 4", MAYBE),  # [4, 8] is not uniform
    ("unscaled(%t) is %t and scale_of(%t) == 1", YES),
    ("internal(%reps)", YES),  # used by the matched tile only
    ("internal(%t)", NO),  # the exp is no op the rule matched
    # `or` binds what both sides bind; `is %new` names a value
    ("(%t is tile(x=%z, reps=_) or %t is add(x=%z, y=_)) and %z is %s", YES),
    ("(%t is add(x=%z, y=_) or %t is tile(x=%z, reps=_)) and %z is %s", YES),
    ("(%t is add(x=%z, y=_) or %t is exp(x=%z)) and %z is %s", NO),
    ("%t is %u and %u is %t and rank(%u) == 2", YES),
    # three-valued connectives
    ("dim(%x, 0) == 4 or true", YES),
    ("dim(%x, 0) == 4 and false", NO),
    ("not (dim(%x, 0) == 4)", MAYBE),
]


def _verdict(write_rules, graph, where_clauses: str):
    """The conditions' verdict (and bindings) on the graph's add, as the driver would reach it."""
    text = f"""
    dialect toy
    rule probe "evaluates conditions"
      match %y = add(x=%x, y=%t)
      match %t = tile(x=%s, reps=%reps)
      {where_clauses}
      rewrite %y -> %y
    """
    (rule,) = load_toy_rules(write_rules(text)).rules
    adapter = ToyAdapter(graph)
    matcher = Matcher(adapter)
    anchor = next(op for op in graph.main.ops if op.type == "add")
    (env,) = list(matcher.match_rule(rule, anchor))
    conditions = [c.expr for c in rule.conditions]
    decided = Conditions(adapter, matcher, {}).holds(conditions, env)
    # Traced (explain's), the same closures must give the very same verdict and bindings.
    assert Conditions(adapter, matcher, {}, tracer=Tracer()).holds(conditions, env) == decided
    return decided


@pytest.mark.parametrize("condition, expected", CASES, ids=[c for c, _ in CASES])
def test_condition(write_rules, graph, condition, expected):
    truth, _ = _verdict(write_rules, graph, f"where {condition}")
    assert truth is expected


def test_an_unknown_clause_is_not_forgotten_by_a_later_and_clause(write_rules, graph):
    # Regression: flattening a later `where a and b` once reset the verdict to yes.
    truth, final = _verdict(write_rules, graph, "where dim(%x, 0) == 4\n      where true and true")
    assert truth is MAYBE and final is None
