"""Every example the shipped rules carry runs as a test; broken examples fail."""

from __future__ import annotations

import pytest

import rewrite
from rewrite.examples import run_examples

SHIPPED = rewrite.load_rules()
CASES = [(rule.name, example.description) for rule in SHIPPED.rules for example in rule.examples]


def test_every_shipped_rule_has_a_firing_and_a_kept_example():
    for rule in SHIPPED.rules:
        kinds = {example.expected is None for example in rule.examples}
        assert kinds == {True, False}, rule.name


@pytest.mark.parametrize("rule_name, description", CASES, ids=[f"{r}: {d}" for r, d in CASES])
def test_shipped_example(rule_name, description):
    (result,) = [r for r in run_examples(SHIPPED, rule_name) if r.description == description]
    assert result.passed, result.message


RULE = """
dialect mil
rule r "multiplying by one is the identity"
  match %y = mul(x=%x, y=%factor)
  {condition}
  rewrite %y -> %x
  example "times {factor}"
    input %x: fp32[4]
    %y = mul(x=%x, y={factor})
    %out = add(x=%y, y=%x)
    output %out
  {outcome}
"""
SOUND = "where const(%factor) == 1.0"


def _result(write_rules, condition=SOUND, factor="1.0", outcome="unchanged"):
    text = RULE.format(condition=condition, factor=factor, outcome=outcome)
    (result,) = run_examples(rewrite.load_rules(write_rules(text)))
    return result


def test_a_right_example_passes(write_rules):
    result = _result(write_rules, outcome="becomes\n    %out = add(x=%x, y=%x)")
    assert result.passed, result.message


def test_a_wrong_becomes_fails(write_rules):
    result = _result(write_rules, outcome="becomes\n    %out = sub(x=%x, y=%x)")
    assert not result.passed and "the rewritten graph differs" in result.message


def test_a_wrong_unchanged_fails(write_rules):
    result = _result(write_rules, outcome="unchanged")
    assert not result.passed and "expected no change" in result.message


def test_a_right_unchanged_passes(write_rules):
    assert _result(write_rules, factor="2.0", outcome="unchanged").passed


def test_an_unsound_rewrite_fails_on_values(write_rules):
    # Without its condition the rule also drops `* 2`: the structure is what
    # the example claims, the values are not.
    result = _result(write_rules, condition="", factor="2.0", outcome="becomes\n    %out = add(x=%x, y=%x)")
    assert not result.passed and "changed value" in result.message


def test_examples_are_checked_when_rules_load(write_rules):
    text = RULE.format(condition=SOUND, factor="1.0", outcome="unchanged").replace("%y = mul(x=%x,", "%y = mul(z=%x,")
    with pytest.raises(rewrite.RuleError, match="op 'mul' has no operand 'z'"):
        rewrite.load_rules(write_rules(text))
