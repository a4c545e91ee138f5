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


# ------------------------------------------------------------ every error, not only the first

BROKEN = """\
dialect mil
rule a "d"
  match %t = tile(x=%x reps=%r)
  rewrite %t -> %x
rule b "fine"
  match %t = tile(x=%x, reps=%r)
  rewrite %t -> %x
rule c "d"
  match %t = tile(x=%x, reps=%r)
  where $ 1
  rewrite %t -> %x
rule d "d"
  match %t = tile(x=%x, reps=%r
rule e "d"
  match %t = tile(x=(%x, %y), reps=%r)
  rewrite %t -> %x
rule f "fine"
  match %t = tile(x=%x, reps=%r)
  rewrite %t -> %x
"""
# (line, column, what the message says) of each error in BROKEN, in order.
BROKEN_ERRORS = [
    (3, 24, "unexpected 'reps'; expected ')', ','"),
    (10, 9, "unexpected character '$'"),
    (14, 1, "unexpected 'rule'; expected ')', ','"),  # rule d runs into rule e, which is still read
    (15, 21, "a tuple is not a pattern"),
]


def _errors(text: str, path: str = "bad.rules") -> RuleError:
    with pytest.raises(RuleError) as raised:
        parse_rules(text, path)
    return raised.value


def test_every_error_of_a_file_is_reported_each_with_its_place_and_a_caret():
    error = _errors(BROKEN)
    found = [(d.span.line, d.span.column) for d in error.diagnostics]
    assert found == [(line, column) for line, column, _ in BROKEN_ERRORS]
    lines = error.render().splitlines()
    assert len(lines) == 3 * len(BROKEN_ERRORS)
    for index, (line, column, words) in enumerate(BROKEN_ERRORS):
        head, quoted, caret = lines[3 * index : 3 * index + 3]
        assert head.startswith(f"bad.rules:{line}:{column}: error: ") and words in head
        assert quoted.strip() == BROKEN.splitlines()[line - 1].strip()
        assert caret.index("^") - 2 == column - 1
    assert error.error_count == len(BROKEN_ERRORS)


def test_lark_alone_reports_the_same_errors():
    from rewrite.language.errors import SourceText
    from rewrite.language.parser import parse_with_lark

    with pytest.raises(RuleError) as raised:
        parse_with_lark(SourceText("bad.rules", BROKEN))
    assert raised.value.render() == _errors(BROKEN).render()


def test_good_rules_after_a_broken_one_add_no_error():
    text = 'dialect mil\nrule a "d"\n  match %t = tile(x=%x,, reps=%r)\n  rewrite %t -> %x\n' + "".join(
        f'rule r{i} "d"\n  match %t = tile(x=%x, reps=%r)\n  rewrite %t -> %x\n' for i in range(5))
    (diagnostic,) = _errors(text).diagnostics
    assert (diagnostic.span.line, diagnostic.span.column) == (3, 24)


def test_errors_past_the_cap_are_counted_in_a_note():
    from rewrite.language.parser import MAX_REPORTED_ERRORS

    broken = 'rule r{} "d"\n  match %t = tile(x=%x reps=%r)\n  rewrite %t -> %x\n'
    text = "dialect mil\n" + "".join(broken.format(i) for i in range(MAX_REPORTED_ERRORS + 5))
    error = _errors(text)
    *shown, note = error.diagnostics
    assert len(shown) == MAX_REPORTED_ERRORS and all(d.severity == "error" for d in shown)
    assert note.severity == "note" and note.message == "5 more errors in this file not shown"
    assert note.span.line == 3 + 3 * MAX_REPORTED_ERRORS  # where the first one not shown is
    assert error.render().splitlines()[-1] == f"bad.rules:{note.span.line}:24: note: {note.message}"
    assert error.error_count == MAX_REPORTED_ERRORS + 5


@pytest.mark.parametrize(
    ("dialect", "named", "not_named"),
    [
        ("mil", ["'%t -> const(val=as_dtype(0.0, dtype(%t)))'", "fill_like(ref_tensor=%v"], ["Constant("]),
        ("onnx", ["'%t -> Constant(value=as_dtype(0.0, dtype(%t)))'", "ConstantOfShape(input=%s",
                  "'%s = Shape(data=%v)'"], ["const(val"]),
        ("zz", ["in MIL as in '%t -> const(val=", "in ONNX as in '%t -> Constant(value="], []),
    ],
)
def test_a_constant_after_the_arrow_names_the_op_that_builds_one_in_the_dialect(dialect, named, not_named):
    text = f'dialect {dialect}\nrule r "d"\n  match %t = tile(x=%x, reps=%r)\n  rewrite %t -> 0.0\n'
    (diagnostic,) = _errors(text).diagnostics
    assert (diagnostic.span.line, diagnostic.span.column) == (4, 17)
    assert diagnostic.message.startswith("unexpected '0.0'; expected a name, a value such as %x. "
                                         "A replacement is a value or an op, not a constant")
    assert all(words in diagnostic.message for words in named), diagnostic.message
    assert not any(words in diagnostic.message for words in not_named)
    assert '"Replacing a value by a constant"' in diagnostic.message


@pytest.mark.parametrize(("replacement", "written"), [
    ("-1.5", "as_dtype(-1.5,"), ("[0, 1]", "as_dtype([0, 1],"), ("\n      2", "as_dtype(2,"),
    ("zero_of(fp32)", "as_dtype(0.0,"),  # a builtin is no op either
])
def test_other_constants_after_the_arrow_get_the_hint_too(replacement, written):
    text = f'dialect mil\nrule r "d"\n  match %t = tile(x=%x, reps=%r)\n  rewrite %t -> {replacement}\n'
    (diagnostic,) = _errors(text).diagnostics
    assert "A replacement is a value or an op, not a constant" in diagnostic.message
    assert f"const(val={written}" in diagnostic.message


def test_other_syntax_errors_get_no_such_hint():
    text = 'dialect mil\nrule r "d"\n  match %t = tile(x=%x, reps=%r)\n  where rank(%x) == 1.0.0\n  rewrite %t -> %x\n'
    assert "replacement" not in _errors(text).first.message
    text = 'dialect mil\nrule r "d"\n  match %t = tile(x=%x, reps=%r)\n  rewrite %t -> tile(x=%x reps=%r)\n'
    assert "replacement" not in _errors(text).first.message
