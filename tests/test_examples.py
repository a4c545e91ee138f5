"""Every example the shipped rules carry runs as a test; broken examples fail."""

from __future__ import annotations

import numpy as np
import pytest

import rewrite
from rewrite import backends
from rewrite.api import RuleSet
from rewrite.examples import canonical, example_ops, random_input, run_examples

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


FIRING = [(rule, example) for rule in SHIPPED.rules for example in rule.examples if example.expected is not None]
FIRING_IDS = [f"{rule.name}: {example.description}" for rule, example in FIRING]
# The predicate input of a nested program, and a true and a false value for it.
FLAGS = {
    "mil": (("flag", "fp32", [1]), (np.array([1.0], np.float32), np.array([-1.0], np.float32))),
    "onnx": (("flag", "bool", []), (np.array(True), np.array(False))),
}


def _built(rule, example, nested: bool):
    backend = backends.backend_module(rule.dialect)
    inputs = [(s.var.lstrip("%"), s.dtype, s.dims) for s in example.inputs]
    if nested:
        inputs.append(FLAGS[rule.dialect][0])
    outputs = [var.lstrip("%") for var in example.outputs]
    program = backend.build_example(inputs, example_ops(example.statements), outputs,
                                    nested_by="flag" if nested else None, opset=example.opset)
    return backend, program


def _feeds(example, size: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        s.var.lstrip("%"): random_input(rng, s.dtype, tuple(size if isinstance(d, str) else d for d in s.dims))
        for s in example.inputs
    }


@pytest.mark.parametrize("rule, example", FIRING, ids=FIRING_IDS)
def test_a_firing_example_fires_the_same_inside_both_branches_of_a_conditional(rule, example):
    _, flat = _built(rule, example, nested=False)
    flat_fires = RuleSet((rule,)).apply(flat, assume=rule.assumption_names).fires
    backend, program = _built(rule, example, nested=True)
    original = backend.copy_program(program)
    fires = RuleSet((rule,)).apply(program, assume=rule.assumption_names).fires
    assert flat_fires >= 1 and fires == 2 * flat_fires
    for flag in FLAGS[rule.dialect][1]:
        feeds = {**_feeds(example, 3), "flag": flag}
        expected, got = backend.evaluate_example(original, feeds), backend.evaluate_example(program, feeds)
        assert expected.keys() == got.keys()
        for name, value in expected.items():
            tolerance = 2e-3 if value.dtype == np.float16 else 1e-5
            np.testing.assert_allclose(got[name], value, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("rule, example", FIRING, ids=FIRING_IDS)
def test_a_firing_example_is_a_fixed_point_after_one_run(rule, example):
    _, program = _built(rule, example, nested=False)
    assert RuleSet((rule,)).apply(program, assume=rule.assumption_names).fires >= 1
    printed = canonical(backends.adapter_for(program))
    assert RuleSet((rule,)).apply(program, assume=rule.assumption_names).fires == 0
    assert canonical(backends.adapter_for(program)) == printed


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


def test_an_example_that_does_not_fire_says_which_condition_failed_where_and_on_what(write_rules):
    result = _result(write_rules, factor="2.0", outcome="becomes\n    %out = add(x=%x, y=%x)")
    lines = result.message.splitlines()
    assert not result.passed and lines[0] == "expected the rule to fire; it did not:"
    # explain's trace at the anchor: the failing condition as written, its file:line, the values it saw.
    assert lines[1].startswith("r @ ") and "  NOT FIRED  " in lines[1] and lines[1].endswith("test.rules:4")
    assert lines[2:] == ["  failed: const(%factor) == 1.0  -> no", "  saw: const(%factor) = 2.0; 1.0 = 1.0"]


def test_an_example_that_fires_but_should_not_says_what_held(write_rules):
    result = _result(write_rules, outcome="unchanged")
    lines = result.message.splitlines()
    assert not result.passed and lines[0] == "expected no change; the rule fired 1 time(s):"
    why = lines.index("why, on the example as written:")
    assert "  FIRES  " in lines[why + 1]
    held, bound = lines[why + 2], lines[why + 3]
    assert held.startswith("  held: where const(%factor) == 1.0  (") and held.endswith(
        "test.rules:4); saw: const(%factor) = 1.0")
    assert bound.startswith("  bound: %y = %") and "%x = %x(4)" in bound


def test_an_example_without_the_anchor_op_says_so(write_rules):
    result = _result(write_rules, factor="1.0", outcome="becomes\n    %out = add(x=%x, y=%x)")
    assert result.passed  # the rule as written, for contrast
    text = RULE.format(condition=SOUND, factor="1.0", outcome="becomes\n    %out = add(x=%x, y=%x)")
    text = text.replace("%y = mul(x=%x, y=1.0)", "%y = sub(x=%x, y=1.0)")
    (result,) = run_examples(rewrite.load_rules(write_rules(text)))
    assert not result.passed
    assert result.message.splitlines()[1] == "no op of the example is a candidate anchor: none is a 'mul'"
