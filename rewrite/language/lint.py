"""Warnings about rules that load but are probably not what their author meant.

The checker rejects what cannot run; the lints here flag what runs but is
suspicious: a binding nobody reads, a condition that folds to false, a rule
another rule always pre-empts, a replacement that rebuilds the op it matched
(and may fire again on its own result). Rules that undo each other, two or
more in a cycle, are `rewrite.language.cycles`' to find.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from rewrite.language import ast
from rewrite.language.errors import Diagnostic, SourceText
from rewrite.language.logic import Truth, equal, is_literal, order


def lint_rule(rule: ast.Rule, source: SourceText) -> list[Diagnostic]:
    """Warnings about one checked rule."""
    warnings = []
    binds: Counter[str] = Counter()
    uses: Counter[str] = Counter()
    spans: dict[str, ast.Span] = {}
    for var, kind, span in _occurrences(rule):
        (binds if kind == "bind" else uses)[var] += 1
        spans.setdefault(var, span)
    for var in binds:
        if binds[var] == 1 and uses[var] == 0 and not var.startswith("%_"):
            warnings.append(source.diagnostic(
                spans[var], f"'{var}' is bound but never used; write '_' where any operand will do", "warning"
            ))
    for condition in rule.conditions:
        if _fold(condition.expr) is Truth.NO:
            warnings.append(source.diagnostic(
                condition.span, "this condition is never true, so the rule never fires", "warning"
            ))
    anchor_types = rule.anchor.pattern.types
    matched_types = _matched_types(rule)
    # A rewrite that replaces more ops than it builds shrinks the graph at
    # every firing, so it cannot go on forever; only the others are at risk.
    if _built(rule) < len(matched_types):
        return warnings
    for action in rule.actions:
        build = action.build if isinstance(action, ast.BuildAction) else action.replacement
        if isinstance(build, ast.OpBuild):
            rebuilt = build.op in anchor_types
        elif isinstance(build, ast.Rebuild):
            rebuilt = bool(matched_types.get(build.var, frozenset()) & anchor_types)
        else:
            rebuilt = False
        if rebuilt:
            warnings.append(source.diagnostic(
                action.span,
                f"this builds an op the rule is anchored on ({', '.join(sorted(anchor_types))}): it may fire "
                "again on its own result; make sure a condition rules the new op out",
                "warning",
            ))
    return warnings


def lint_shadowing(rules: Sequence[ast.Rule], sources: dict[str, SourceText]) -> list[Diagnostic]:
    """A rule tried after another with the same pattern and a superset of its conditions never fires."""
    warnings = []
    ordered = [rule for _, rule in sorted(enumerate(rules), key=lambda item: (-item[1].benefit, item[0]))]
    for position, later in enumerate(ordered):
        for earlier in ordered[:position]:
            if earlier.dialect != later.dialect or earlier.matches != later.matches:
                continue
            if {c.expr for c in earlier.conditions} <= {c.expr for c in later.conditions}:
                source = sources.get(later.span.file)
                if source is not None:
                    warnings.append(source.diagnostic(
                        later.span,
                        f"rule '{later.name}' never fires: '{earlier.name}' ({earlier.span}) has the same "
                        "pattern, no condition it lacks, and is tried first",
                        "warning",
                    ))
                break
    return warnings


# ------------------------------------------------------------------ helpers


def _occurrences(rule: ast.Rule):
    for index, clause in enumerate(rule.matches):
        if clause.named:  # an unnamed anchor is meant to go unused
            yield clause.var, "bind" if index == 0 else "use", clause.span
        yield from _pattern(clause.pattern)
    for condition in rule.conditions:
        yield from _expr(condition.expr)
    for action in rule.actions:
        if isinstance(action, ast.BuildAction):
            yield action.var, "bind", action.span
            yield from _arguments(action.build.arguments)
            continue
        yield action.target, "use", action.span
        replacement = action.replacement
        if isinstance(replacement, ast.ValueRef):
            yield replacement.var, "use", replacement.span
        elif isinstance(replacement, ast.Index):
            yield from _expr(replacement)
        elif isinstance(replacement, ast.OpBuild):
            yield from _arguments(replacement.arguments)
        else:
            yield replacement.var, "use", replacement.span
            yield from _arguments(replacement.arguments)


def _arguments(arguments):
    for argument in arguments:
        yield from _expr(argument.value)


def _pattern(pattern: ast.OpPattern):
    for operand in pattern.operands:
        inner = operand.pattern
        if isinstance(inner, ast.Bind):
            yield inner.var, "bind", inner.span
            if inner.producer is not None:
                yield from _pattern(inner.producer)
        elif isinstance(inner, ast.OpPattern):
            yield from _pattern(inner)


def _expr(expr):
    if isinstance(expr, ast.ValueRef):
        yield expr.var, "use", expr.span
    elif isinstance(expr, ast.SameValue):
        yield expr.var, "use", expr.span
        yield from _expr(expr.left)
    elif isinstance(expr, ast.Matches):
        yield from _expr(expr.subject)
        yield from _pattern(expr.pattern)
    elif isinstance(expr, ast.EveryUse):
        yield expr.variable, "bind", expr.span
        yield expr.of, "use", expr.span
        yield from _expr(expr.body)
    elif isinstance(expr, tuple):
        for item in expr:
            yield from _expr(item)
    elif hasattr(expr, "__dataclass_fields__") and not isinstance(expr, ast.Span):
        for field in expr.__dataclass_fields__:
            yield from _expr(getattr(expr, field))


def _built(rule: ast.Rule) -> int:
    """How many ops the rewrite creates."""
    count = 0
    for action in rule.actions:
        build = action.build if isinstance(action, ast.BuildAction) else action.replacement
        count += isinstance(build, (ast.OpBuild, ast.Rebuild))
    return count


def _matched_types(rule: ast.Rule) -> dict[str, frozenset[str]]:
    types: dict[str, frozenset[str]] = {}

    def visit(pattern: ast.OpPattern) -> None:
        for operand in pattern.operands:
            inner = operand.pattern
            if isinstance(inner, ast.Bind) and inner.producer is not None:
                types[inner.var] = inner.producer.types
                visit(inner.producer)
            elif isinstance(inner, ast.OpPattern):
                visit(inner)

    for clause in rule.matches:
        types[clause.var] = clause.pattern.types
        visit(clause.pattern)
    # Ops matched in conditions (`%v is op(...)`) are part of the match too.
    for condition in rule.conditions:
        for expr in ast.walk(condition.expr):
            if isinstance(expr, ast.Matches) and not expr.negated:
                types[f"is@{expr.span.line}:{expr.span.column}"] = expr.pattern.types
                visit(expr.pattern)
    return types


def _fold(expr):
    """The value of an expression made of literals only; None if it depends on the graph."""
    if isinstance(expr, ast.Literal):
        return Truth.of(expr.value) if isinstance(expr.value, bool) else expr.value
    if isinstance(expr, ast.Not):
        inner = _fold(expr.operand)
        return ~inner if isinstance(inner, Truth) else None
    if isinstance(expr, (ast.And, ast.Or)):
        left, right = _fold(expr.left), _fold(expr.right)
        if isinstance(expr, ast.And):
            if Truth.NO in (left, right):
                return Truth.NO
            return left & right if isinstance(left, Truth) and isinstance(right, Truth) else None
        if Truth.YES in (left, right):
            return Truth.YES
        return left | right if isinstance(left, Truth) and isinstance(right, Truth) else None
    if isinstance(expr, ast.Compare):
        left, right = _fold(expr.left), _fold(expr.right)
        if left is None or right is None or isinstance(left, Truth) or isinstance(right, Truth):
            return None
        if expr.operator in ("==", "!="):
            same = equal(left, right)
            return same if expr.operator == "==" else ~same
        if is_literal(left) and is_literal(right):
            return order(expr.operator, left, right)
        return None
    if isinstance(expr, ast.Arithmetic):
        left, right = _fold(expr.left), _fold(expr.right)
        if not (is_literal(left) and is_literal(right)):
            return None
        if expr.operator == "+":
            return left + right
        if expr.operator == "-":
            return left - right
        if expr.operator == "*":
            return left * right
        return left / right if right else None
    return None
