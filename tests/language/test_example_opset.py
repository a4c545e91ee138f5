"""`opset N` in an example: the graph is built at that ONNX opset or Core ML target."""

from __future__ import annotations

import pytest

import rewrite
from rewrite.examples import run_examples
from rewrite.language.errors import RuleError

# Sum broadcasts from opset 8 only: the same graph is rewritten at 18, and
# must not be at 7, where Sum-6 takes operands of one shape.
ONNX_RULE = """
dialect onnx
import multidirectional from "{broadcasting}"
rule drop_tile "a Tile into an op that broadcasts anyway"
  match %t = Tile(input=%x, repeats=%r)
  where is_const(%r) and every use %u of %t: broadcasts(%u) and %u is multidirectional(%t, %o) in any order
                     and forall axis in axes(%t): aligned_dim(%o, axis, of=%t) == dim(%t, axis)
  rewrite %t -> %x
  example "at the default opset"
    input %x: fp32[1, 4]
    input %y: fp32[3, 4]
    %t = Tile(input=%x, repeats=[3, 1])
    %out = Sum(data_0=(%t, %y))
    output %out
  becomes
    %out = Sum(data_0=(%x, %y))
  example "at opset 7"
    opset 7
    input %x: fp32[1, 4]
    input %y: fp32[3, 4]
    %t = Tile(input=%x, repeats=[3, 1])
    %out = Sum(data_0=(%t, %y))
    output %out
  unchanged
"""


def test_an_onnx_example_is_built_at_its_opset(write_rules):
    broadcasting = rewrite.shipped_rules_path() / "onnx" / "broadcasting.rules"
    rules = rewrite.load_rules(write_rules(ONNX_RULE.format(broadcasting=broadcasting)))
    (example,) = [e for e in rules.rules[0].examples if e.opset is not None]
    assert example.opset == 7
    results = run_examples(rules)
    assert [(r.description, r.passed) for r in results] == [("at the default opset", True), ("at opset 7", True)]


def test_without_the_opset_line_the_old_opset_example_is_rewritten(write_rules):
    broadcasting = rewrite.shipped_rules_path() / "onnx" / "broadcasting.rules"
    text = ONNX_RULE.format(broadcasting=broadcasting).replace("    opset 7\n", "")
    results = run_examples(rewrite.load_rules(write_rules(text)))
    assert [r.passed for r in results] == [True, False]  # the line is what made the difference


MIL_RULE = """
dialect mil
rule to_fill_like "a zeros tensor shaped like x"
  match %m = mul(x=%x, y=%zero)
  where is_const(%zero) and const(%zero) == 0.0 and shape(%m) == shape(%x) and dtype(%x) == "fp32"
  rewrite %m -> fill_like(ref_tensor=%x, value=0.0)
  example "fill_like exists from iOS16"
    opset iOS16
    input %x: fp32[B, 4]
    %m = mul(x=%x, y=0.0)
    output %m
  becomes
    %m = fill_like(ref_tensor=%x, value=0.0)
  example "before iOS16 the rule cannot build it, so it does not fire"
    opset iOS15
    input %x: fp32[B, 4]
    %m = mul(x=%x, y=0.0)
    output %m
  unchanged
"""


def test_a_mil_example_is_built_for_its_target_and_an_op_the_target_lacks_is_not_built(write_rules):
    results = run_examples(rewrite.load_rules(write_rules(MIL_RULE)))
    assert [(r.passed, r.message) for r in results] == [(True, ""), (True, "")]


@pytest.mark.parametrize("line, expected", [
    ("opset iOS99", "iOS99"),
    ("opset 99", "opset 99"),
])
def test_an_unknown_opset_is_a_check_error_at_the_example(write_rules, line, expected):
    from rewrite.examples import example_errors

    text = MIL_RULE if "iOS" in line else ONNX_RULE.format(
        broadcasting=rewrite.shipped_rules_path() / "onnx" / "broadcasting.rules")
    text = text.replace("opset iOS16", line).replace("opset 7", line)
    (error,) = example_errors(rewrite.load_rules(write_rules(text)).rules)
    assert expected in error.message and "cannot be built" in error.message
    assert error.span.line > 1


def test_two_opset_lines_are_an_error(write_rules):
    with pytest.raises(RuleError) as raised:
        rewrite.load_rules(write_rules(MIL_RULE.replace("opset iOS15\n", "opset iOS15\n    opset iOS16\n")))
    assert "one 'opset'" in raised.value.render()
