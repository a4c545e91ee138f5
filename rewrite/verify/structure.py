"""What a rule's text says about its instances, beyond its `match` lines.

A rule keeps much of its pattern in conditions: `where %v is op(...)`,
`unscaled(%v) is op(...)`, `unscaled(%v) is %x`, and disjunctions of those.
An instance that lacks that structure never fires the rule, so the
generator reads it here:

- `structures`: the op (or the other variable) each variable is, for one
  choice of branch in each disjunction that holds structure;
- `targets`: the constants the conditions compare a variable against
  (`uniform(%e) >= 0`, `close(uniform(%one), 1.0)`), so that an instance
  can hold that value exactly, or one just beside it;
- `scale_equations`: products of `scale_of(...)` the conditions pin to a
  number (`close(scale_of(%a) * scale_of(%b), 0.797...)`), which the
  generator solves for the factor of each scaled variable.

Everything is read from the checked AST; nothing here evaluates a condition.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from rewrite.language import ast

# Calls that read a constant's value from a variable.
_VALUE_READS = frozenset({"uniform", "const"})


@dataclass(frozen=True)
class Structure:
    """A variable's place in the pattern: it is `pattern`'s op, or the variable `alias`.

    `scaled`: said of `unscaled(%v)`, so %v may be that op or value times a
    constant (through the dialect's scalings); `clause` is the text that
    said it, for the verdict when an instance cannot be built for it.
    """

    pattern: ast.OpPattern | None
    alias: str | None
    scaled: bool
    clause: str


@dataclass(frozen=True)
class ScaleEquation:
    """`product of scale_of(v) for v in variables` times `factor` is `value`."""

    variables: tuple[str, ...]
    factor: float
    value: float


def children(node) -> Iterator:
    """The AST nodes directly below `node` (tuples flattened)."""
    if not hasattr(node, "__dataclass_fields__") or isinstance(node, ast.Span):
        return
    for name in node.__dataclass_fields__:
        child = getattr(node, name)
        for item in child if isinstance(child, tuple) else (child,):
            if hasattr(item, "__dataclass_fields__") and not isinstance(item, ast.Span):
                yield item


def _holds_structure(expr) -> bool:
    if isinstance(expr, (ast.Matches, ast.SameValue)) and not expr.negated:
        return True
    if isinstance(expr, (ast.Not, ast.Quantifier, ast.EveryUse, ast.Conditional)):
        return False
    return any(_holds_structure(child) for child in children(expr))


def _subject(expr) -> tuple[str, bool] | None:
    """(variable, scaled) for `%v` or `unscaled(%v)`."""
    if isinstance(expr, ast.ValueRef):
        return expr.var, False
    if (isinstance(expr, ast.Call) and expr.function == "unscaled" and len(expr.arguments) == 1
            and isinstance(expr.arguments[0], ast.ValueRef)):
        return expr.arguments[0].var, True
    return None


def structures(rule: ast.Rule, choose, dropped: list | None = None) -> dict[str, Structure]:
    """The structure of each variable, taking one branch of each disjunction that holds some.

    `choose(options)` picks a branch (the generator's decision, so that
    enumeration tries the first branch of every disjunction, then each other).
    A variable the `match` lines define keeps that op; the first clause that
    says anything of a variable wins. The branches not taken are appended to
    `dropped`, so that what else is read from the conditions skips them too.
    """
    found: dict[str, Structure] = {}
    for clause in rule.matches[1:]:
        found.setdefault(clause.var, Structure(clause.pattern, None, False, f"match {clause.var}"))
    # The anchor is its match line's op, unless that line names no operand
    # (`match %out = mul_or_div(A=_, B=_)`) and a condition says what it is.
    anchor = rule.anchor.var if _binds_any(rule.anchor.pattern) else None

    def visit(expr, text: str) -> None:
        if isinstance(expr, ast.And):
            visit(expr.left, text)
            visit(expr.right, text)
        elif isinstance(expr, ast.Or):
            branches = [b for b in _disjuncts(expr) if _holds_structure(b)]
            if branches:
                taken = choose(branches)
                if dropped is not None:
                    dropped.extend(b for b in _disjuncts(expr) if b is not taken)
                visit(taken, text)
        elif isinstance(expr, ast.Matches) and not expr.negated:
            subject = _subject(expr.subject)
            if subject is not None and subject[0] != anchor:
                found.setdefault(subject[0], Structure(expr.pattern, None, subject[1], text))
        elif isinstance(expr, ast.SameValue) and not expr.negated:
            subject = _subject(expr.left)
            if subject is not None and subject[0] != anchor and subject[0] != expr.var:
                found.setdefault(subject[0], Structure(None, expr.var, subject[1], text))

    for condition in rule.conditions:
        visit(condition.expr, condition.text)
    return found


def _binds_any(pattern: ast.OpPattern) -> bool:
    return any(isinstance(operand.pattern, (ast.Bind, ast.OpPattern)) for operand in pattern.operands)


def uses_targets(rule: ast.Rule) -> bool:
    """Whether a condition asks what the target has (`available(...)`): its instances want the newest opset."""
    def visit(expr) -> bool:
        if isinstance(expr, ast.Call) and expr.function == "available":
            return True
        return any(visit(child) for child in children(expr))

    return any(visit(condition.expr) for condition in rule.conditions)


def _disjuncts(expr) -> list:
    if isinstance(expr, ast.Or):
        return _disjuncts(expr.left) + _disjuncts(expr.right)
    return [expr]


def _literal(expr):
    """The number or bool `expr` spells, or None (`-1` and `1 / 2` included)."""
    if isinstance(expr, ast.Literal) and isinstance(expr.value, (int, float, bool)):
        return expr.value
    if isinstance(expr, ast.Arithmetic):
        left, right = _literal(expr.left), _literal(expr.right)
        if isinstance(left, (int, float)) and isinstance(right, (int, float)) and not isinstance(left, bool):
            try:
                return {"+": left + right, "-": left - right, "*": left * right,
                        "/": left / right if right else None}.get(expr.operator)
            except (OverflowError, TypeError):
                return None
    if isinstance(expr, ast.Call) and expr.function in ("sqrt",) and len(expr.arguments) == 1:
        inner = _literal(expr.arguments[0])
        return math.sqrt(inner) if isinstance(inner, (int, float)) and inner >= 0 else None
    return None


def _read_variable(expr) -> str | None:
    """The variable whose constant `expr` reads: `uniform(%v)`, `const(%v)`, `abs(...)` of one."""
    if isinstance(expr, ast.Call):
        if expr.function in _VALUE_READS and len(expr.arguments) == 1 and isinstance(expr.arguments[0], ast.ValueRef):
            return expr.arguments[0].var
        if expr.function == "abs" and len(expr.arguments) == 1:
            return _read_variable(expr.arguments[0])
    return None


def _comparisons(expr, skipped: frozenset[int] = frozenset()) -> Iterator[tuple]:
    """(left, right) of every comparison and `close(...)` in `expr`, but in the subtrees
    whose ids are in `skipped`."""
    if id(expr) in skipped:
        return
    if isinstance(expr, ast.Compare):
        yield expr.left, expr.right
    if isinstance(expr, ast.Call) and expr.function == "close" and len(expr.arguments) >= 2:
        yield expr.arguments[0], expr.arguments[1]
    for child in children(expr):
        yield from _comparisons(child, skipped)


def targets(rule: ast.Rule) -> dict[str, list]:
    """Per variable, the literals the conditions compare its constant against, in text order."""
    found: dict[str, list] = {}
    for condition in rule.conditions:
        for left, right in _comparisons(condition.expr):
            for side, other in ((left, right), (right, left)):
                var, value = _read_variable(side), _literal(other)
                if var is not None and value is not None and value not in found.setdefault(var, []):
                    found[var].append(value)
    return found


def _attribute_read(expr) -> tuple[str, str] | None:
    """(variable, attribute name) where `expr` is `attribute(%v, "name")`."""
    if isinstance(expr, ast.Call) and expr.function == "attribute" and len(expr.arguments) >= 2:
        var, name = expr.arguments[0], expr.arguments[1]
        if isinstance(var, ast.ValueRef) and isinstance(name, ast.Literal) and isinstance(name.value, str):
            return var.var, name.value
    return None


def attribute_targets(rule: ast.Rule) -> dict[tuple[str, str], list]:
    """Per (variable, attribute name), the literals the conditions compare `attribute(%v, "name")`
    against: in a comparison, or as the items of `contains([...], attribute(...))`."""
    found: dict[tuple[str, str], list] = {}

    def add(read, values) -> None:
        for value in values:
            if value is not None and value not in found.setdefault(read, []):
                found[read].append(value)

    def visit(expr) -> None:
        if isinstance(expr, ast.Call) and expr.function == "contains" and len(expr.arguments) == 2:
            read = _attribute_read(expr.arguments[1])
            if read is not None and isinstance(expr.arguments[0], ast.ListExpr):
                add(read, [_literal(item) for item in expr.arguments[0].items])
        for child in children(expr):
            visit(child)

    for condition in rule.conditions:
        for left, right in _comparisons(condition.expr):
            for side, other in ((left, right), (right, left)):
                read = _attribute_read(side)
                if read is not None:
                    add(read, [_literal(other)])
        visit(condition.expr)
    return found


def shape_targets(rule: ast.Rule) -> tuple[list[int], dict[int, list[int]]]:
    """The ranks and, per axis, the dims the conditions compare a value's against:
    `rank(%x) >= 3` gives rank 3, `dim(%x, -2) == 1` gives axis -2 the size 1."""
    ranks: list[int] = []
    axes: dict[int, list[int]] = {}
    operators = {"==": 0, ">=": 0, ">": 1, "<=": 0, "<": -1}
    for condition in rule.conditions:
        for compare in _compares(condition.expr):
            for side, other, flipped in ((compare.left, compare.right, False), (compare.right, compare.left, True)):
                value = _literal(other)
                if not isinstance(value, int) or isinstance(value, bool) or not isinstance(side, ast.Call):
                    continue
                operator = compare.operator
                if flipped:
                    operator = {">=": "<=", "<=": ">=", ">": "<", "<": ">"}.get(operator, operator)
                if side.function == "rank" and operator in operators and 0 <= value + operators[operator] <= 6:
                    if value + operators[operator] not in ranks:
                        ranks.append(value + operators[operator])
                if side.function == "dim" and operator == "==" and len(side.arguments) == 2 and value >= 0:
                    axis = _literal(side.arguments[1])
                    if isinstance(axis, int) and value not in axes.setdefault(axis, []):
                        axes[axis].append(value)
    return ranks, axes


def keeps_its_shape(rule: ast.Rule) -> bool:
    """Whether a condition asks that the anchor have another value's shape (`shape(%out) == shape(%x)`)."""
    anchor = rule.anchor.var

    def reads_anchor(expr) -> bool:
        return (isinstance(expr, ast.Call) and expr.function == "shape" and len(expr.arguments) == 1
                and isinstance(expr.arguments[0], ast.ValueRef) and expr.arguments[0].var == anchor)

    def reads_shape(expr) -> bool:
        return isinstance(expr, ast.Call) and expr.function == "shape"

    return any(compare.operator == "==" and (reads_anchor(compare.left) and reads_shape(compare.right)
                                             or reads_anchor(compare.right) and reads_shape(compare.left))
               for condition in rule.conditions for compare in _compares(condition.expr))


def _compares(expr) -> Iterator[ast.Compare]:
    if isinstance(expr, ast.Compare):
        yield expr
    for child in children(expr):
        yield from _compares(child)


def _scale_product(expr) -> tuple[tuple[str, ...], float] | None:
    """(variables, factor) when `expr` is a product of `scale_of(%v)` terms and literals."""
    if isinstance(expr, ast.Call) and expr.function == "scale_of" and len(expr.arguments) == 1 \
            and isinstance(expr.arguments[0], ast.ValueRef):
        return (expr.arguments[0].var,), 1.0
    if isinstance(expr, ast.Arithmetic) and expr.operator == "*":
        left, right = _scale_product(expr.left), _scale_product(expr.right)
        if left is None or right is None:
            literal = _literal(expr.right if left is not None else expr.left)
            known = left if left is not None else right
            if known is None or not isinstance(literal, (int, float)) or isinstance(literal, bool):
                return None
            return known[0], known[1] * float(literal)
        return left[0] + right[0], left[1] * right[1]
    return None


def scale_equations(rule: ast.Rule, dropped=()) -> list[ScaleEquation]:
    """Every `product of scale_of(...) == number` (or `close(...)` to one) in the conditions,
    but in the branches `dropped` lists (those `structures` did not take)."""
    found = []
    skipped = frozenset(id(branch) for branch in dropped)
    for condition in rule.conditions:
        for left, right in _comparisons(condition.expr, skipped):
            for side, other in ((left, right), (right, left)):
                product, value = _scale_product(side), _literal(other)
                if product is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
                    found.append(ScaleEquation(product[0], product[1], float(value)))
    return found


def constant_variables(rule: ast.Rule) -> set[str]:
    """Variables the conditions read a constant from: is_const(%v), const(%v), uniform(%v), %v[i]."""
    found: set[str] = set()
    refused: set[str] = set()  # `not is_const(%v)`: a value the rule wants computed

    def visit(expr) -> None:
        if isinstance(expr, ast.Not) and isinstance(expr.operand, ast.Call) and expr.operand.function == "is_const":
            refused.update(a.var for a in expr.operand.arguments if isinstance(a, ast.ValueRef))
            return
        if isinstance(expr, ast.Call) and expr.function in ("is_const", "const", "uniform"):
            for argument in expr.arguments:
                if isinstance(argument, ast.ValueRef):
                    found.add(argument.var)
        if isinstance(expr, ast.Index) and isinstance(expr.base, ast.ValueRef):
            found.add(expr.base.var)
        for child in children(expr):
            visit(child)

    for condition in rule.conditions:
        visit(condition.expr)
    return found - refused


def scaled_variables(rule: ast.Rule) -> set[str]:
    """Variables the conditions look through scalings of: `unscaled(%v)`, `scale_of(%v)`."""
    found: set[str] = set()

    def visit(expr) -> None:
        if isinstance(expr, ast.Call) and expr.function in ("unscaled", "scale_of"):
            found.update(a.var for a in expr.arguments if isinstance(a, ast.ValueRef))
        for child in children(expr):
            visit(child)

    for condition in rule.conditions:
        visit(condition.expr)
    return found


def nearby(value) -> list:
    """Values just beside `value`, which a changed or deleted condition lets through:
    one ulp either way (in fp32), 10% off, the sign flipped, and zero."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return list(dict.fromkeys(v for v in (value + 1, value - 1, -value, 0) if v != value))
    if not math.isfinite(value):
        return [0.0, -value if not math.isnan(value) else 1.0]
    single = np.float32(value)
    options = [float(np.nextafter(single, np.float32(np.inf))), float(np.nextafter(single, np.float32(-np.inf))),
               value * 1.1, value * 0.9, -value, 0.0, -0.0 if value == 0 else 1.0]
    return [v for v in dict.fromkeys(options) if repr(v) != repr(value)]
