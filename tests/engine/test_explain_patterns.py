"""`explain` for a pattern that does not match names the innermost sub-pattern that
failed, where it is written, the operands followed to reach it, and what the graph
has there instead: not the whole `match` block."""

from __future__ import annotations

import numpy as np
import pytest

from rewrite.engine.explain import PATTERN, explain, format_text
from rewrite.engine.matcher import Matcher
from tests.engine.test_driver import DOUBLE_NEGATION, TILES
from tests.engine.toy_ir import Graph, ToyAdapter, load_toy_rules


def _position(path, text):
    """`file:line:col` of the first occurrence of `text` in the rules file."""
    for number, line in enumerate(path.read_text().split("\n"), 1):
        if text in line:
            return f"{path}:{number}:{line.index(text) + 1}"
    raise AssertionError(f"{text!r} is not in {path}")


def _tile_of_neg():
    """mul(x, tile(neg(y), [1, 8])): the tile's input is produced by a neg of a graph input."""
    graph = Graph()
    x = graph.input("x", ("b", 8))
    y = graph.input("y", ("b", 1))
    negated = graph.op("neg", x=y, shape=("b", 1))
    tile = graph.op("tile", x=negated, reps=graph.const(np.array([1, 8])), shape=("b", 8))
    graph.main.outputs = [graph.op("mul", x=x, y=tile, shape=("b", 8))]
    return graph, tile.producer, negated.producer


def _explain_one(write_rules, text, graph):
    path = write_rules(text)
    explanations = explain(load_toy_rules(path).rules, ToyAdapter(graph), {})
    assert len(explanations) == 1
    return path, explanations[0]


def _tiles_matching(pattern):
    return TILES.replace("tile(x=%x, reps=%reps)", pattern)


def test_a_wrong_op_type_names_the_nested_pattern_and_what_is_there(write_rules):
    graph, tile, negated = _tile_of_neg()
    path, item = _explain_one(write_rules, _tiles_matching("tile(x=%x = exp(x=_), reps=%reps)"), graph)
    assert not item.fired and item.reason == PATTERN and item.truth == "no"
    assert item.failed == "exp(x=_)"
    assert item.location == _position(path, "exp(x=_)")
    assert item.condition == "match %t = tile(x=%x = exp(x=_), reps=%reps)"
    assert item.path == (f"operand x of '{tile.name}' (tile)",)
    assert item.values == (f"it is '{negated.name}' (neg), not exp",)
    assert format_text([item]).splitlines()[1:] == [
        "  pattern does not match at: exp(x=_)",
        "  in: match %t = tile(x=%x = exp(x=_), reps=%reps)",
        f"  at: operand x of '{tile.name}' (tile)",
        f"  saw: it is '{negated.name}' (neg), not exp",
    ]


def test_the_failing_path_is_followed_down_to_an_input(write_rules):
    graph, tile, negated = _tile_of_neg()
    path, item = _explain_one(write_rules, _tiles_matching("tile(x=%x = neg(x=%z = exp(x=_)), reps=%reps)"), graph)
    assert item.failed == "exp(x=_)" and item.location == _position(path, "exp(x=_)")
    assert item.path == (f"operand x of '{tile.name}' (tile)", f"operand x of '{negated.name}' (neg)")
    assert item.values == ("%y is an input: no op produces it",)


def test_a_value_that_must_repeat_names_both(write_rules):
    graph, tile, negated = _tile_of_neg()
    path, item = _explain_one(write_rules, _tiles_matching("tile(x=%x = neg(x=%x), reps=%reps)"), graph)
    assert item.failed == "%x" and item.location == _position(path, "%x)")
    assert item.values == (f"it is %y, but %x is already %{negated.name}",)


def test_a_missing_operand_names_the_operand_pattern(write_rules):
    graph = Graph()
    y = graph.input("y", (1, 8))
    tile = graph.op("tile", x=y, shape=(1, 8))  # no reps at all
    graph.main.outputs = [graph.op("exp", x=tile, shape=(1, 8))]
    path, item = _explain_one(write_rules, TILES, graph)
    assert item.failed == "reps=%reps" and item.location == _position(path, "reps=%reps")
    assert item.values == (f"'{tile.producer.name}' (tile) has no operand 'reps'",) and item.path == ()


def test_a_positional_pattern_with_too_few_operands(write_rules):
    text = """
    dialect toy
    rule sum_of_two "sum(a, b) is add(a, b)"
      match %s = sum(%a, %b)
      rewrite %s -> add(x=%a, y=%b)
    """
    graph = Graph()
    a, b, c = (graph.input(name, (4,)) for name in "abc")
    total = graph.op("sum", values=(a, b, c), shape=(4,))
    graph.main.outputs = [total]
    path, item = _explain_one(write_rules, text, graph)
    assert item.failed == "sum(%a, %b)"
    assert item.values == (f"'{total.producer.name}' (sum) has 3 operand(s), the pattern 2",)


def test_a_later_match_clause_is_quoted_alone(write_rules):
    graph = Graph()
    x = graph.input("x", (4,))
    inner = graph.op("exp", x=x, shape=(4,))
    graph.main.outputs = [graph.op("neg", x=inner, shape=(4,))]
    path, item = _explain_one(write_rules, DOUBLE_NEGATION, graph)
    assert item.condition == "match %inner = neg(x=%x)"
    assert item.failed == "neg(x=%x)" and item.location == _position(path, "neg(x=%x)")
    assert item.values == (f"it is '{inner.producer.name}' (exp), not neg",)
    assert item.path == (f"%inner = %{inner.name}(4)",)


def test_an_op_class_lists_its_members(write_rules):
    text = """
    dialect toy
    class broadcasting = add | mul | sub
    rule drop_tile_into_broadcasting "a tile of nothing into a broadcasting op goes"
      match %u = exp(x=%t = tile(x=%x, reps=_))
      match %x = broadcasting(x=_, y=_)
      rewrite %u -> exp(x=%x)
    """
    graph, _, negated = _tile_of_neg()
    graph.main.outputs = [graph.op("exp", x=graph.main.ops[-2].outputs[0], shape=("b", 8))]
    explanations = explain(load_toy_rules(write_rules(text)).rules, ToyAdapter(graph), {})
    (item,) = [e for e in explanations if e.failed.startswith("broadcasting")]
    assert item.values == (f"it is '{negated.name}' (neg), not broadcasting (add, mul, sub)",)


def test_in_any_order_the_way_that_got_furthest_is_reported(write_rules):
    text = """
    dialect toy
    rule scaled_exp "an engine test"
      match %m = mul(x=%a = exp(x=%i = neg(x=_)), y=%b) in any order
      rewrite %m -> %b
    """
    graph = Graph()
    p, q = graph.input("p", (4,)), graph.input("q", (4,))
    exp = graph.op("exp", x=q, shape=(4,))
    mul = graph.op("mul", x=p, y=exp, shape=(4,))
    graph.main.outputs = [mul]
    # Taking x=%p fails at once (no op produces p); taking y=exp(q) gets one op further.
    path, item = _explain_one(write_rules, text, graph)
    assert item.failed == "neg(x=_)"
    assert item.path == (f"operand y of '{mul.producer.name}' (mul)", f"operand x of '{exp.producer.name}' (exp)")
    assert item.values == ("%q is an input: no op produces it",)


def test_a_pattern_that_matches_is_explained_by_its_conditions(write_rules):
    graph, tile, _ = _tile_of_neg()
    path = write_rules(_tiles_matching("tile(x=%x = neg(x=_), reps=%reps)").replace(
        "where not block_output(%t)", "where not block_output(%t) and rank(%x) == 3"))
    rules = load_toy_rules(path)
    (item,) = explain(rules.rules, ToyAdapter(graph), {})
    assert item.reason == "condition is no" and item.failed == "rank(%x) == 3"
    # And the matcher says there is no mismatch to report.
    assert Matcher(ToyAdapter(graph)).mismatch(rules.rules[0], tile) is None


def test_a_mismatch_leaves_the_matcher_untraced(write_rules):
    graph, tile, _ = _tile_of_neg()
    rules = load_toy_rules(write_rules(_tiles_matching("tile(x=%x = exp(x=_), reps=%reps)")))
    matcher = Matcher(ToyAdapter(graph))
    assert matcher.mismatch(rules.rules[0], tile) is not None
    assert matcher._trace is None  # deciding afterwards pays nothing for explaining
    assert list(matcher.match_rule(rules.rules[0], tile)) == []


@pytest.mark.parametrize("pattern", ["tile(x=%x, reps=%reps)", "tile(x=%x = neg(x=_), reps=%reps)"])
def test_a_matching_pattern_has_no_mismatch(write_rules, pattern):
    graph, tile, _ = _tile_of_neg()
    rules = load_toy_rules(write_rules(_tiles_matching(pattern)))
    assert Matcher(ToyAdapter(graph)).mismatch(rules.rules[0], tile) is None
