"""`explain` says when a rule holds but a rewrite value cannot be evaluated: the
operand, the innermost part without a value, what it was computed from, and why."""

from __future__ import annotations

import numpy as np

from rewrite.engine.explain import UNEVALUABLE, explain, format_text
from tests.engine.test_rewriter_unevaluable import BUILD_THEN_FOLD, FOLD_UNIFORM, SCALE_BY_DIM, _scaled
from tests.engine.toy_ir import Graph, ToyAdapter, load_toy_rules


def _explain(write_rules, text, graph):
    (item,) = explain(load_toy_rules(write_rules(text)).rules, ToyAdapter(graph), {})
    return item


def test_uniform_of_a_constant_holding_nan(write_rules):
    graph = _scaled([np.nan] * 4)
    before = [op.type for op in graph.main.ops]
    item = _explain(write_rules, FOLD_UNIFORM, graph)
    assert [op.type for op in graph.main.ops] == before  # explaining builds nothing
    assert not item.fired and item.reason == UNEVALUABLE and item.truth == "unknown"
    assert item.condition == "y=uniform(%c)" and item.failed == "uniform(%c)"
    assert item.location.endswith("test.rules:5")
    constant = graph.main.ops[0].outputs[0].name
    assert item.values == (f"%c = %{constant}(4) = [nan, nan, nan, nan]",)
    assert "NaN" in item.note and item.note.startswith("uniform(%c) is unknown")
    assert format_text([item]).splitlines()[1:] == [
        "  the conditions hold, but a rewrite value cannot be evaluated; the rule does not fire",
        "  in: y=uniform(%c)",
        "  failed: uniform(%c)  -> unknown",
        f"  saw: %c = %{constant}(4) = [nan, nan, nan, nan]",
        f"  why: {item.note}",
    ]


def test_uniform_of_a_constant_of_several_numbers(write_rules):
    item = _explain(write_rules, FOLD_UNIFORM, _scaled([1.0, 2.0, 3.0, 4.0]))
    assert item.reason == UNEVALUABLE and "elements are not all one number" in item.note


def test_the_innermost_part_is_named_after_an_op_the_rule_builds(write_rules):
    # y=0 - uniform(%c) fails at uniform(%c); x=%n reads the op built first and is not evaluated.
    item = _explain(write_rules, BUILD_THEN_FOLD, _scaled([np.nan] * 4))
    assert item.reason == UNEVALUABLE and item.condition == "y=0 - uniform(%c)" and item.failed == "uniform(%c)"


def test_a_symbolic_dim(write_rules):
    graph = Graph()
    x = graph.input("x", ("b", 4))
    graph.main.outputs = [graph.op("add", x=x, y=graph.const(np.zeros(4, dtype=np.float32)), shape=("b", 4))]
    item = _explain(write_rules, SCALE_BY_DIM, graph)
    assert item.reason == UNEVALUABLE and item.failed == "dim(%x, 0)"
    assert "symbolic dim b" in item.note and "%x = %x(b, 4)" in item.values


def test_a_rewrite_value_that_evaluates_fires(write_rules):
    item = _explain(write_rules, FOLD_UNIFORM, _scaled([2.0] * 4))
    assert item.fired and item.reason == "fires" and item.note == ""
