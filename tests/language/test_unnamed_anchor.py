"""An anchor needs no name: `match op(...)` and `match _ = op(...)`, for rules
that never refer to it; naming a value nothing binds says how to name it."""

from __future__ import annotations

import pytest

import rewrite
from rewrite.examples import run_examples
from rewrite.language import ast
from rewrite.language.errors import RuleError
from rewrite.language.parser import parse_rules

# A tile by ones that a mul reads is dropped; the mul itself is only where the rule looks.
MIL_RULE = """
dialect mil
rule tile_by_ones_into_mul "A tile by all-ones reps that a mul reads is its input."
  match {anchor}mul(x=%t = tile(x=%x, reps=%reps), y=_)
  where is_const(%reps) and forall r in const(%reps): r == 1
  where internal(%t)
  rewrite %t -> %x
  example "a tile by ones only the mul reads"
    input %x: fp32[B, 4]
    input %y: fp32[B, 4]
    %t = tile(x=%x, reps=[1, 1])
    %m = mul(x=%t, y=%y)
    output %m
  becomes
    %m = mul(x=%x, y=%y)
  example "a tile that widens stays"
    input %x: fp32[B, 4]
    input %y: fp32[B, 8]
    %t = tile(x=%x, reps=[1, 2])
    %m = mul(x=%t, y=%y)
    output %m
  unchanged
"""

ONNX_RULE = """
dialect onnx
rule expand_to_own_shape_into_mul "An Expand to its input's own shape, read by a Mul, is its input."
  match _ = Mul(A=%e = Expand(input=%x, shape=%s), B=_)
  where is_const(%s) and const(%s) == shape(%x)
  rewrite %e -> %x
  example "an Expand that widens nothing"
    input %x: fp32[2, 4]
    input %y: fp32[2, 4]
    %e = Expand(input=%x, shape=[2, 4])
    %m = Mul(A=%e, B=%y)
    output %m
  becomes
    %m = Mul(A=%x, B=%y)
  example "an Expand that widens"
    input %x: fp32[1, 4]
    input %y: fp32[2, 4]
    %e = Expand(input=%x, shape=[2, 4])
    %m = Mul(A=%e, B=%y)
    output %m
  unchanged
"""


@pytest.mark.parametrize("anchor", ["", "_ = "])
def test_both_spellings_parse_to_an_unnamed_anchor(anchor):
    (rule,) = parse_rules(MIL_RULE.format(anchor=anchor), "a.rules").rules
    clause = rule.anchor
    assert not clause.named and clause.var == ast.UNNAMED_ANCHOR
    assert clause.pattern.op == "mul" and (clause.span.line, clause.span.column) == (4, 9 + len(anchor))
    named = parse_rules(MIL_RULE.format(anchor="%m = "), "a.rules").rules[0].anchor
    assert named.named and named.pattern == clause.pattern


@pytest.mark.parametrize("anchor", ["", "_ = "])
def test_a_rule_with_an_unnamed_anchor_fires_and_counts_it_as_matched(write_rules, anchor):
    # `internal(%t)` holds only if the anchor, bound under no name, is still
    # among the ops the rule matched.
    rules = rewrite.load_rules(write_rules(MIL_RULE.format(anchor=anchor)))
    assert rules.warnings == ()  # an unnamed anchor is not an unused binding
    results = run_examples(rules)
    assert [(r.passed, r.message) for r in results] == [(True, ""), (True, "")]


def test_a_named_anchor_the_rule_never_uses_is_still_a_warning(write_rules):
    rules = rewrite.load_rules(write_rules(MIL_RULE.format(anchor="%m = ")))
    (warning,) = rules.warnings
    assert "'%m' is bound but never used" in warning.message


def test_an_onnx_rule_with_an_unnamed_anchor_fires(write_rules):
    rules = rewrite.load_rules(write_rules(ONNX_RULE))
    assert not rules.rules[0].anchor.named and rules.warnings == ()
    assert [(r.passed, r.message) for r in run_examples(rules)] == [(True, ""), (True, "")]


def _errors(write_rules, text: str) -> list[str]:
    path = write_rules(text)
    with pytest.raises(RuleError) as raised:
        rewrite.load_rules(path)
    return [d.render().replace(f"{path.parent}/", "") for d in raised.value.diagnostics]


def test_a_rewrite_that_needs_the_anchor_says_how_to_name_it(write_rules):
    (error,) = _errors(write_rules, """
        dialect mil
        rule r "relu(relu(x)) is relu(x)"
          match relu(x=%inner = relu(x=_))
          rewrite %outer -> %inner
        """)
    assert error == (
        "test.rules:4:11: error: '%outer' is not bound here (the anchor has no name; "
        "if '%outer' means it, write 'match %outer = relu(...)')\n"
        "    rewrite %outer -> %inner\n"
        "            ^"
    )


def test_a_condition_that_needs_the_anchor_says_so_too(write_rules):
    (error,) = _errors(write_rules, """
        dialect mil
        rule r "relu(relu(x)) is relu(x)"
          match _ = relu(x=%inner = relu(x=_))
          where not block_output(%outer)
          rewrite %inner -> %inner
        """)
    assert error.startswith("test.rules:4:26: error: '%outer' is not bound here (the anchor has no name;")


def test_a_named_anchor_gives_no_such_hint(write_rules):
    (error,) = _errors(write_rules, """
        dialect mil
        rule r "relu(relu(x)) is relu(x)"
          match %outer = relu(x=%inner = relu(x=_))
          rewrite %other -> %inner
        """)
    assert error.startswith("test.rules:4:11: error: '%other' is not bound here\n")


def test_only_the_anchor_may_go_unnamed(write_rules):
    (error,) = _errors(write_rules, """
        dialect mil
        rule r "relu(relu(x)) is relu(x)"
          match %outer = relu(x=%inner)
          match relu(x=_)
          rewrite %outer -> %inner
        """)
    assert error.startswith(
        "test.rules:4:9: error: only the first 'match' (the anchor) may go without a name; "
        "a later 'match' walks from a value bound before it: 'match %v = op(...)'"
    )
