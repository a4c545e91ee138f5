"""Explanations name the failing condition as written, where it failed and what it saw."""

from __future__ import annotations

import numpy as np

from rewrite.engine.explain import explain, format_text
from tests.engine.test_driver import TILES
from tests.engine.toy_ir import Graph, ToyAdapter, load_toy_rules


def _graph(other_shape):
    graph = Graph()
    x = graph.input("x", other_shape)
    y = graph.input("y", ("b", 1))
    tile = graph.op("tile", x=y, reps=graph.const(np.array([1, 8])), shape=("b", 8))
    graph.main.outputs = [graph.op("mul", x=x, y=tile, shape=("b", 8))]
    return graph


def test_a_fire_and_a_failure_with_path_and_values(write_rules):
    rules = load_toy_rules(write_rules(TILES))
    fired = explain(rules.rules, ToyAdapter(_graph(("b", 8))), {})
    assert [(e.rule, e.fired, e.reason) for e in fired] == [("drop_tile", True, "fires")]

    graph = _graph(("b", "c"))  # the other operand's last dim is a symbol, not 8
    before = [op.type for op in graph.main.ops]
    (item,) = explain(rules.rules, ToyAdapter(graph), {})
    assert [op.type for op in graph.main.ops] == before  # nothing was rewritten
    assert not item.fired and item.truth == "unknown"
    assert item.failed == "aligned_dim(%other, axis, of=%t) == %reps[axis]"
    assert item.location.endswith("test.rules:12")
    assert item.condition.startswith("every use %u of %t:")
    assert any(step.startswith("%u = ") for step in item.path) and "axis = 1" in item.path
    assert item.values == ("aligned_dim(%other, axis, of=%t) = c", "%reps[axis] = 8")
    text = format_text([item])
    assert "drop_tile @ tile_" in text and "NOT FIRED" in text and "-> unknown" in text


def test_a_pattern_that_does_not_match_says_so(write_rules):
    text = TILES.replace("match %t = tile(x=%x, reps=%reps)", "match %t = tile(x=%x = exp(x=_), reps=%reps)")
    rules = load_toy_rules(write_rules(text))
    (item,) = explain(rules.rules, ToyAdapter(_graph(("b", 8))), {})
    assert item.reason == "pattern does not match" and "exp(x=_)" in item.condition
