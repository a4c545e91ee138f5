"""Parsing: grammar.lark -> AST, and syntax errors with file:line:col and a caret."""

from __future__ import annotations

import pytest

from rewrite.language import ast
from rewrite.language.errors import RuleError
from rewrite.language.parser import parse_rules

TILE_RULE = """\
dialect mil
import broadcasting from "elementwise.rules"

rule remove_broadcast_tiles "drop tiles"
  match %t = tile(x=%x, reps=%reps)
  where forall axis in axes(%x): %reps[axis] == 1 or dim(%x, axis) == 1
  where every use %u of %t:
          %u is broadcasting(%t, %other) in any order
          and %other is not %t
  rewrite %t -> %x
"""


def test_parses_a_rule_into_frozen_dataclasses():
    rule_file = parse_rules(TILE_RULE, "tiles.rules")
    assert rule_file.dialect == "mil"
    assert rule_file.imports == (ast.Import("elementwise.rules", ("broadcasting",), rule_file.imports[0].span),)
    (rule,) = rule_file.rules
    assert rule.name == "remove_broadcast_tiles"
    assert rule.description == "drop tiles"
    assert rule.dialect == "mil"
    anchor = rule.anchor
    assert anchor.var == "%t"
    assert anchor.pattern.op == "tile"
    assert [o.name for o in anchor.pattern.operands] == ["x", "reps"]
    assert len(rule.conditions) == 2
    assert rule.conditions[0].text.startswith("forall axis in axes(%x)")
    (action,) = rule.actions
    assert action == ast.ReplaceAction("%t", ast.ValueRef("%x", action.span), action.span)
    with pytest.raises(AttributeError):
        rule.name = "other"  # frozen


def test_quantifier_body_extends_to_the_right():
    rule_file = parse_rules(TILE_RULE, "tiles.rules")
    every_use = rule_file.rules[0].conditions[1].expr
    assert isinstance(every_use, ast.EveryUse)
    body = every_use.body
    assert isinstance(body, ast.And)
    assert isinstance(body.left, ast.Matches) and body.left.pattern.any_order
    assert isinstance(body.right, ast.SameValue) and body.right.negated


def test_operator_precedence():
    text = 'dialect mil\nrule r "d" match %a = add(x=%x, y=%y) where not 1 + 2 * 3 == 7 or rank(%x) > 1 and true\n' \
           "rewrite %a -> %x\n"
    expr = parse_rules(text, "p.rules").rules[0].conditions[0].expr
    # or binds loosest, then and, then not, then comparison, then + and *.
    assert isinstance(expr, ast.Or)
    assert isinstance(expr.left, ast.Not)
    comparison = expr.left.operand
    assert isinstance(comparison, ast.Compare) and comparison.operator == "=="
    assert isinstance(comparison.left, ast.Arithmetic) and comparison.left.operator == "+"
    assert isinstance(comparison.left.right, ast.Arithmetic) and comparison.left.right.operator == "*"
    assert isinstance(expr.right, ast.And)


def test_rewrite_actions():
    text = """dialect mil
rule r "d"
  match %s = select(cond=%c, a=%a, b=%b)
  rewrite
    %z = fill_like(ref_tensor=%b, value=0.0)
    %w = add(x=%a, y=%z)
    %s -> %s with a=%w
"""
    actions = parse_rules(text, "r.rules").rules[0].actions
    assert [type(a).__name__ for a in actions] == ["BuildAction", "BuildAction", "ReplaceAction"]
    assert isinstance(actions[2].replacement, ast.Rebuild)
    assert actions[2].replacement.arguments[0].name == "a"


def test_patterns_rest_wildcard_nested():
    text = """dialect mil
rule r "d"
  match %m = mul(%e = exp(x=_), %rest...) in any order
  rewrite %m -> %e
"""
    pattern = parse_rules(text, "r.rules").rules[0].anchor.pattern
    first, rest = pattern.operands
    assert first.pattern.var == "%e" and first.pattern.producer.op == "exp"
    assert isinstance(first.pattern.producer.operands[0].pattern, ast.Wildcard)
    assert rest.rest and rest.pattern.var == "%rest"


@pytest.mark.parametrize(
    "text, line, column, expected",
    [
        ('dialect mil\nrule r "d"\n  match %t tile(x=%x)\n', 3, 12, "expected '='"),
        ('dialect mil\nrule r "d" match %t = tile(x=%x,', 2, 33, "unexpected end of file"),
        ("dialect mil\nrule r \"d\" match %t = tile(x=%x) where $\n", 2, 40, "unexpected character '$'"),
        ("rule 3", 1, 6, "expected a name"),
    ],
)
def test_syntax_errors_point_at_the_text(text, line, column, expected):
    with pytest.raises(RuleError) as raised:
        parse_rules(text, "bad.rules")
    diagnostic = raised.value.first
    assert (diagnostic.span.file, diagnostic.span.line, diagnostic.span.column) == ("bad.rules", line, column)
    rendered = str(raised.value)
    assert rendered.startswith(f"bad.rules:{line}:{column}: error:")
    assert expected in rendered
    source_line, caret = rendered.splitlines()[1:3]
    assert source_line.strip() == text.splitlines()[line - 1].strip()
    assert caret.index("^") - 2 == column - 1
