"""Why a rule did or did not fire, anchor by anchor.

For every candidate anchor of every rule, `explain` asks the driver for its
decision against the graph as it is (nothing is rewritten) and reports the
first condition that failed, quoted from the rules file with its line, the
path that led there (which use, which axis) and the values it saw. This is
XLA's pattern-matcher explanation turned declarative: because conditions are
data, the failing one can be quoted back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rewrite.engine.driver import Driver
from rewrite.engine.guard import Refusal, ShapeGuard
from rewrite.engine.interfaces import Adapter
from rewrite.engine.logic import UNKNOWN, Symbol, Truth
from rewrite.language import ast


@dataclass(frozen=True)
class Explanation:
    """One rule at one anchor."""

    rule: str
    anchor: str
    fired: bool
    location: str  # file:line of the failing condition (or of the rule)
    reason: str  # "fires", "pattern does not match", or "condition is no/unknown"
    condition: str = ""  # the `where` clause, as written
    failed: str = ""  # the innermost failing part, as written
    truth: str = ""  # no | unknown
    path: tuple[str, ...] = ()  # the use and axis being examined, outermost first
    values: tuple[str, ...] = ()  # what the failing comparison saw

    def as_dict(self) -> dict:
        return asdict(self)


class _Sources:
    """Lines of rules files, read once, for quoting."""

    def __init__(self):
        self._lines: dict[str, list[str]] = {}

    def text(self, span: ast.Span) -> str:
        lines = self._read(span.file)
        if not (1 <= span.line <= len(lines)):
            return ""
        if span.end_line == span.line and span.end_column > span.column:
            return lines[span.line - 1][span.column - 1 : span.end_column - 1]
        if span.end_line > span.line:
            parts = [lines[span.line - 1][span.column - 1 :]]
            parts += [line.strip() for line in lines[span.line : span.end_line - 1]]
            if span.end_line <= len(lines):
                parts.append(lines[span.end_line - 1][: span.end_column - 1].strip())
            return " ".join(part for part in parts if part)
        return lines[span.line - 1][span.column - 1 :].strip()

    def line(self, file: str, number: int) -> str:
        lines = self._read(file)
        return lines[number - 1].strip() if 1 <= number <= len(lines) else ""

    def _read(self, file: str) -> list[str]:
        if file not in self._lines:
            try:
                self._lines[file] = Path(file).read_text(encoding="utf-8").split("\n")
            except OSError:
                self._lines[file] = []
        return self._lines[file]


def describe(value: Any, adapter: Adapter) -> str:
    """A value as a rule author reads it: graph values by name, dims by symbol."""
    if value is None:
        return "none"
    if value is UNKNOWN:
        return "?"
    if isinstance(value, Truth):
        return str(value)
    if isinstance(value, Symbol):
        return value.name
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(describe(v, adapter) for v in value) + "]"
    try:
        if adapter.producer(value) is not None or adapter.shape(value) is not None:
            shape = adapter.shape(value)
            dims = "?" if shape is None else ", ".join(describe(d, adapter) for d in shape)
            return f"%{adapter.value_name(value)}({dims})"
    except Exception:  # an op handle rather than a value
        pass
    try:
        return adapter.op_name(value)
    except Exception:
        return repr(value)


def explain(
    rules: Sequence[ast.Rule],
    adapter: Adapter,
    predicates: dict,
    rule_name: str | None = None,
    op_name: str | None = None,
) -> list[Explanation]:
    """Decisions of `rules` on every candidate anchor of `adapter`'s program."""
    driver = Driver(rules, adapter, predicates)
    driver.evaluator.explaining = True
    sources = _Sources()
    explanations = []
    for rule in rules:
        if rule_name is not None and rule.name != rule_name:
            continue
        for anchor in driver.candidates(rule):
            name = adapter.op_name(anchor)
            if op_name is not None and name != op_name:
                continue
            explanations.append(_explain_one(driver.decide(rule, anchor), name, adapter, sources))
    return explanations


def _explain_one(decision, anchor_name: str, adapter: Adapter, sources: _Sources) -> Explanation:
    rule = decision.rule
    if decision.fires:
        refusal = _guard_refusal(rule, decision.env, adapter)
        if refusal is not None:
            return Explanation(
                rule.name, anchor_name, False, str(rule.span), "the shape guard refuses the rewrite",
                failed=str(refusal), truth="unknown",
                path=(f"consumer = {refusal.consumer}", *(() if refusal.axis is None else (f"axis = {refusal.axis}",))),
            )
        return Explanation(rule.name, anchor_name, True, str(rule.span), "fires")
    if not decision.matched:
        return Explanation(
            rule.name, anchor_name, False, f"{rule.span.file}:{rule.matches[0].span.line}",
            "pattern does not match",
            condition=" / ".join(sources.line(clause.span.file, clause.span.line) for clause in rule.matches),
        )
    failure = decision.failure
    if failure is None:  # pragma: no cover - a non-firing decision always records why
        return Explanation(rule.name, anchor_name, False, str(rule.span), "conditions do not hold")
    span = failure.expr.span
    condition = next(
        (c for c in rule.conditions if c.span.line <= span.line <= max(c.span.end_line, c.span.line)), None
    )
    path = tuple(f"{variable} = {describe(value, adapter)}" for variable, value in failure.bindings)
    values: tuple[str, ...] = ()
    if failure.sides is not None:
        expr = failure.expr
        values = (
            f"{sources.text(expr.left.span)} = {describe(failure.sides[0], adapter)}",
            f"{sources.text(expr.right.span)} = {describe(failure.sides[1], adapter)}",
        )
    return Explanation(
        rule.name,
        anchor_name,
        False,
        f"{span.file}:{span.line}",
        f"condition is {failure.truth}",
        condition=condition.text if condition is not None else "",
        failed=sources.text(span),
        truth=str(failure.truth),
        path=path,
        values=values,
    )


def format_text(explanations: Sequence[Explanation]) -> str:
    """The human-readable report, one block per anchor."""
    lines = []
    for item in explanations:
        verdict = "FIRES" if item.fired else "NOT FIRED"
        lines.append(f"{item.rule} @ {item.anchor}  {verdict}  {item.location}")
        if item.fired:
            continue
        if item.reason == "pattern does not match":
            lines.append(f"  pattern does not match: {item.condition}")
            continue
        if item.reason == "the shape guard refuses the rewrite":
            lines.append(f"  the conditions hold, but the shape guard refuses: {item.failed}")
            continue
        if item.condition and item.condition != item.failed:
            lines.append(f"  where {item.condition}")
        lines.append(f"  failed: {item.failed}  -> {item.truth}")
        if item.path:
            lines.append(f"  at: {', '.join(item.path)}")
        if item.values:
            lines.append(f"  saw: {'; '.join(item.values)}")
    return "\n".join(lines)


def _guard_refusal(rule: ast.Rule, env: dict, adapter: Adapter) -> Refusal | None:
    """What the shape guard would refuse of the rule's replacements by bound values.

    Replacements by ops the rule would build are guarded when it runs; asking
    here would mean building them in a model that explain must not change.
    """
    guard = ShapeGuard(adapter)
    for action in rule.actions:
        if not isinstance(action, ast.ReplaceAction) or not isinstance(action.replacement, ast.ValueRef):
            continue
        old, new = env.get(action.target), env.get(action.replacement.var)
        if old is None or new is None:
            continue
        within = None if action.within is None else [adapter.producer(env[action.within])]
        refusal = guard.check(old, new, within)
        if refusal is not None:
            return refusal
    return None
