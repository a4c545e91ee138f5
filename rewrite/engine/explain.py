"""Why a rule did or did not fire, anchor by anchor.

For every candidate anchor of every rule, `explain` asks the driver for its
decision against the graph as it is (nothing is rewritten) and reports what
stopped it, quoted from the rules file with its position, the path that led
there and the values it saw:

* a pattern that does not match: the innermost sub-pattern that failed
  (an op type, a missing operand, a value that must repeat), the operands
  followed from the anchor to reach it, and what the graph has instead;
* a condition that does not hold: the innermost failing part, the use and
  axis being examined, the values compared, and for a dim that is unknown
  (`?`) the op whose shape inference lost it (`Adapter.unknown_dim_origin`);
* a rewrite value that cannot be evaluated, an op to build that the
  program's target lacks, or a rewrite the shape guard refuses: what, and
  why; the rule does not fire (the rewriter's own `preflight`, which a run
  refuses for too);
* a match that took more structural attempts than the match budget allows
  (`in any order` over many operands): the rule is skipped at that anchor.

This is XLA's pattern-matcher explanation turned declarative: because
patterns and conditions are data, the failing part can be quoted back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, is_dataclass, replace
from typing import Any

import numpy as np

from rewrite.engine import builtins
from rewrite.engine.conditions import Conditions
from rewrite.engine.driver import Driver
from rewrite.engine.interfaces import Adapter, Capability, optional
from rewrite.engine.matcher import Mismatch
from rewrite.engine.rewriter import Unavailable, Unevaluable, subexpressions
from rewrite.language import ast
from rewrite.language.assumptions import ASSUMPTIONS, flag
from rewrite.language.errors import Diagnostic, RuleError, SourceText
from rewrite.language.loader import UnreadableRules, read_rules_text
from rewrite.language.logic import UNKNOWN, Term, Truth

PATTERN = "pattern does not match"
GUARD = "the shape guard refuses the rewrite"
UNEVALUABLE = "a rewrite value cannot be evaluated"
BUDGET = "the match budget is exhausted"
UNAVAILABLE = "an op the rewrite builds is not available"
ASSUMED = "the rule assumes what the run does not grant"


@dataclass(frozen=True)
class Explanation:
    """One rule at one anchor."""

    rule: str
    anchor: str
    fired: bool
    location: str  # file:line of the failing condition (or of the rule)
    # "fires", PATTERN, "condition is no/unknown", UNEVALUABLE, UNAVAILABLE, GUARD, BUDGET or ASSUMED
    reason: str
    condition: str = ""  # the `where` clause (the `match` clause, the operand built), as written
    failed: str = ""  # the innermost failing part, as written
    truth: str = ""  # no | unknown
    path: tuple[str, ...] = ()  # the operands followed, or the use and axis examined, outermost first
    values: tuple[str, ...] = ()  # what the failing part saw (for a pattern: what the graph has instead)
    origins: tuple[str, ...] = ()  # for each unknown dim it read, the op whose shape inference lost it
    note: str = ""  # why a rewrite value has none
    # Where the conditions held (it fires, or only the rewrite stopped it): each
    # `where` clause as written with its file:line, and the values it compared;
    # and what the match bound.
    held: tuple[str, ...] = ()
    bound: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return asdict(self)


class _Sources:
    """Lines of rules files, read once, for quoting.

    Read as the loader reads them (`read_rules_text`): a file that has become
    a FIFO, a device, too large or not UTF-8 since it loaded is the same
    one-line error, and lines number as the parser numbered them.
    """

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

    def pattern(self, span: ast.Span) -> str:
        """A pattern as written from `span` on: `exp(x=_)`, `%x = exp(x=_)`, `x=%x`.

        Pattern nodes span only their first token, so the text runs on to
        the end of the brackets the pattern opens (across lines), and stops
        at a `,` or an unopened `)` that ends it otherwise.
        """
        lines = self._read(span.file)
        if not (1 <= span.line <= len(lines)):
            return ""
        pieces, depth, opened = [], 0, False
        line, column = span.line - 1, span.column - 1
        while line < len(lines):
            text = lines[line]
            end = None
            for position in range(column, len(text)):
                character = text[position]
                if character in "([":
                    depth, opened = depth + 1, True
                elif character in ")]":
                    if depth == 0:
                        end = position
                        break
                    depth -= 1
                    if depth == 0 and opened:
                        end = position + 1
                        break
                elif character == "," and depth == 0:
                    end = position
                    break
            pieces.append(text[column:end].strip())
            if end is not None or depth == 0:
                if end is not None and text[end:].startswith(" in any order"):
                    pieces.append("in any order")
                break
            line, column = line + 1, 0
        return " ".join(piece for piece in pieces if piece)

    def line(self, file: str, number: int) -> str:
        lines = self._read(file)
        return lines[number - 1].strip() if 1 <= number <= len(lines) else ""

    def _read(self, file: str) -> list[str]:
        if file not in self._lines:
            if file.startswith("<"):  # a rule made in code: no file to quote from
                self._lines[file] = []
                return self._lines[file]
            try:
                self._lines[file] = SourceText(file, read_rules_text(file)).lines
            except UnreadableRules as error:
                raise RuleError([Diagnostic(ast.Span(file, max(error.line, 1), max(error.column, 1)),
                                            f"cannot read rules file: {error.reason}",
                                            source_line=error.source_line)]) from None
        return self._lines[file]


def describe(value: Any, adapter: Adapter) -> str:
    """A value as a rule author reads it: graph values by name, dims by symbol."""
    if value is None:
        return "none"
    if value is UNKNOWN:
        return "?"
    if isinstance(value, Truth):
        return str(value)
    if isinstance(value, Term):
        return str(value)
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
    assume: frozenset[str] = frozenset(),
) -> list[Explanation]:
    """Decisions of `rules` on every candidate anchor of `adapter`'s program.

    Changes nothing. `assume` is what the run would grant (`RuleSet.apply`'s
    `assume`): a rule assuming more holds but does not fire, and is said so.
    Raises `RuleError` if a rules file can no longer be read to quote from.
    """
    driver = Driver(rules, adapter, predicates, assume=assume)
    explainer = _Explainer(driver, _Sources())
    explanations = []
    for rule in rules:
        if rule_name is not None and rule.name != rule_name:
            continue
        for anchor in driver.candidates(rule):
            name = adapter.op_name(anchor)
            if op_name is not None and name != op_name:
                continue
            explanations.append(explainer.explain(driver.decide(rule, anchor, traced=True), name))
    return explanations


class _Explainer:
    """Turns the driver's decisions into explanations, quoting the rules files."""

    def __init__(self, driver: Driver, sources: _Sources):
        self.driver = driver
        self.adapter = driver.adapter
        self.conditions: Conditions = driver.traced
        self.sources = sources

    def explain(self, decision, anchor_name: str) -> Explanation:
        rule = decision.rule
        if decision.exhausted:
            return self._exhausted(rule, anchor_name)
        if decision.fires:
            return self._would_fire(rule, decision.env, anchor_name)
        if not decision.matched:
            return self._mismatch(rule, decision.anchor, anchor_name)
        failure = decision.failure
        if failure is None:  # pragma: no cover - a non-firing decision always records why
            return Explanation(rule.name, anchor_name, False, str(rule.span), "conditions do not hold")
        return self._condition(rule, failure, anchor_name)

    # ---------------------------------------------------------------- fired, or not quite

    def _would_fire(self, rule: ast.Rule, env: dict, anchor_name: str) -> Explanation:
        held, bound = self._held(rule, env), self._bound(env)
        missing = sorted(self.driver.missing(rule))
        if missing:
            flags = " ".join(f"--assume {flag(name)}" for name in missing)
            return Explanation(
                rule.name, anchor_name, False, str(rule.assumptions[0].span), ASSUMED,
                failed=", ".join(missing), truth="no",
                note=f"every condition holds, but the rule assumes {' and '.join(missing)} "
                     f"({'; '.join(ASSUMPTIONS[name] for name in missing)}); {flags} grants it",
                held=held, bound=bound,
            )
        refusal = self.driver.rewriter.preflight(rule, env)
        if isinstance(refusal, Unevaluable):
            return replace(self._unevaluable(rule, refusal, env, anchor_name), held=held, bound=bound)
        if isinstance(refusal, Unavailable):
            return Explanation(
                rule.name, anchor_name, False, f"{refusal.span.file}:{refusal.span.line}", UNAVAILABLE,
                failed=refusal.op_type, truth="no",
                note=f"the rewrite builds '{refusal.op_type}', which the program's target does not have "
                     "(an ONNX opset before the op, a Core ML deployment target before it); say "
                     f"available(\"{refusal.op_type}\") among the conditions, or convert the model first",
                held=held, bound=bound,
            )
        if refusal is not None:
            return Explanation(
                rule.name, anchor_name, False, str(rule.span), GUARD,
                failed=str(refusal), truth="unknown",
                path=(f"consumer = {refusal.consumer}", *(() if refusal.axis is None else (f"axis = {refusal.axis}",))),
                held=held, bound=bound,
            )
        return Explanation(rule.name, anchor_name, True, str(rule.span), "fires", held=held, bound=bound)

    def _held(self, rule: ast.Rule, env: dict) -> tuple[str, ...]:
        """Each `where` clause, as written with its file:line, and what its comparisons saw."""
        found = []
        for condition in rule.conditions:
            span = condition.span
            line = f"where {condition.text}  ({span.file}:{span.line})"
            seen = []
            for part in _conjuncts(condition.expr):
                if not isinstance(part, ast.Compare):
                    continue
                for side in (part.left, part.right):
                    if isinstance(side, ast.Literal):
                        continue  # `== 1` says its value itself
                    try:
                        value = self.conditions.value(side, env)
                    except Exception:  # a part bound only inside the clause (a quantifier's variable)
                        continue
                    seen.append(f"{self.sources.text(side.span)} = {describe(value, self.adapter)}")
            found.append(line + (f"; saw: {'; '.join(seen)}" if seen else ""))
        return tuple(found)

    def _bound(self, env: dict) -> tuple[str, ...]:
        """What the match bound, `%v = ...`, in binding order (the anchor first)."""
        return tuple(
            f"{name} = {describe(value, self.adapter)}" for name, value in env.items()
            if isinstance(name, str) and name.startswith("%")
        )

    def _unevaluable(self, rule: ast.Rule, found: Unevaluable, env: dict, anchor_name: str) -> Explanation:
        text, adapter = self.sources.text, self.adapter
        expression = found.expression
        # What the part without a value was computed from: where the why shows (NaNs, a symbol).
        values = []
        for part in subexpressions(self.conditions, expression, env):
            try:
                value = self.conditions.value(part, env)
            except (KeyError, TypeError, ValueError, ArithmeticError):
                continue
            values.append(f"{text(part.span)} = {_describe_with_constant(value, adapter)}")
        span = expression.span
        argument = found.argument
        return Explanation(
            rule.name, anchor_name, False, f"{span.file}:{span.line}", UNEVALUABLE,
            condition=f"{argument.name}={text(argument.value.span)}", failed=text(span), truth="unknown",
            values=tuple(values), note=f"{text(span) or 'it'} {_why_no_value(found, env, self.conditions, adapter)}",
        )

    def _exhausted(self, rule: ast.Rule, anchor_name: str) -> Explanation:
        limit = self.driver.budget.limit
        clauses = " / ".join("match " + self.sources.pattern(c.span) for c in rule.matches)
        return Explanation(
            rule.name, anchor_name, False, str(rule.span), BUDGET, condition=clauses, truth="unknown",
            note=(f"rule '{rule.name}' took more than {limit} structural attempts here (operands tried for "
                  "its sub-patterns, and bindings handed to its conditions); it is skipped at this anchor"),
        )

    # ---------------------------------------------------------------- patterns

    def _mismatch(self, rule: ast.Rule, anchor, anchor_name: str) -> Explanation:
        mismatch: Mismatch | None = self.driver.matcher.mismatch(rule, anchor)
        sources = self.sources
        if mismatch is None:  # pragma: no cover - matching is deterministic; it failed a moment ago
            return Explanation(rule.name, anchor_name, False, str(rule.span), PATTERN,
                               condition=" / ".join(sources.line(c.span.file, c.span.line) for c in rule.matches))
        span = mismatch.pattern.span
        clause = mismatch.clause or rule.anchor
        path = tuple(
            f"operand {slot} of {_op_label(op, self.adapter)}" for slot, op in mismatch.path if op is not None
        )
        if mismatch.subject is not None:  # a later clause: say where its value came from
            path = (f"{clause.var} = {describe(mismatch.subject, self.adapter)}", *path)
        return Explanation(
            rule.name, anchor_name, False, str(span), PATTERN,
            condition="match " + sources.pattern(clause.span),
            failed=sources.pattern(span), truth="no", path=path, values=(mismatch.reason,),
        )

    # ---------------------------------------------------------------- conditions

    def _condition(self, rule: ast.Rule, failure, anchor_name: str) -> Explanation:
        adapter, sources = self.adapter, self.sources
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
            origins=self._unknown_dim_origins(failure.expr, failure.env or {}),
        )

    def _unknown_dim_origins(self, expr, env: dict) -> tuple[str, ...]:
        """For each dim read in `expr` that is unknown, the op whose shape inference lost it."""
        origin_of = optional(self.adapter, Capability.UNKNOWN_DIM_ORIGINS)
        if origin_of is None:
            return ()
        found: list[str] = []
        for value, axis in self._unknown_dims(expr, env):
            origin = origin_of(value, axis)
            if origin is None:
                continue
            line = (f"dim {axis} of {describe(value, self.adapter)} was lost by the shape inference of "
                    f"{_op_label(origin, self.adapter)}")
            if line not in found:
                found.append(line)
        return tuple(found)

    def _unknown_dims(self, expr, env: dict):
        """(value, axis) of every `dim`, `aligned_dim` and `shape` read in `expr` that gave `?`."""
        adapter, conditions = self.adapter, self.conditions
        for call in _calls(expr, ("dim", "aligned_dim", "shape")):
            try:
                result = conditions.value(call, env)
                value = conditions.value(call.arguments[0], env)
                shape = adapter.shape(value)
            except Exception:  # a part bound only inside expr (a comprehension's), or no graph value
                continue
            if shape is None:
                continue
            if call.function == "shape":
                if isinstance(result, list):
                    yield from ((value, axis) for axis, dim in enumerate(result) if dim is UNKNOWN)
                continue
            if result is not UNKNOWN:
                continue
            try:
                axis = conditions.value(call.arguments[1], env)
                if call.function == "aligned_dim":
                    of = dict(call.keywords).get("of")
                    reference = adapter.shape(conditions.value(of, env)) if of is not None else None
                    if reference is None:
                        continue
                    axis = int(axis) % len(reference) - len(reference) + len(shape)
            except Exception:
                continue
            if isinstance(axis, int) and -len(shape) <= axis < len(shape) and shape[axis] is UNKNOWN:
                yield value, axis % len(shape)


def format_text(explanations: Sequence[Explanation], held: bool = False) -> str:
    """The human-readable report, one block per anchor; with `held`, also what held
    and what the match bound where the conditions hold (`rewrite test` says why an
    example's rule fired)."""
    lines = []
    for item in explanations:
        verdict = "FIRES" if item.fired else "NOT FIRED"
        lines.append(f"{item.rule} @ {item.anchor}  {verdict}  {item.location}")
        if held:
            lines.extend(f"  held: {line}" for line in item.held)
            if item.bound:
                lines.append(f"  bound: {', '.join(item.bound)}")
        if item.fired:
            continue
        if item.reason == PATTERN:
            if not item.failed:
                lines.append(f"  pattern does not match: {item.condition}")
                continue
            lines.append(f"  pattern does not match at: {item.failed}")
            if item.condition and item.condition != item.failed:
                lines.append(f"  in: {item.condition}")
            if item.path:
                lines.append(f"  at: {' > '.join(item.path)}")
            lines.extend(f"  saw: {value}" for value in item.values)
            continue
        if item.reason == BUDGET:
            lines.append(f"  not decided: {item.note}")
            lines.append(f"  in: {item.condition}")
            continue
        if item.reason == GUARD:
            lines.append(f"  the conditions hold, but the shape guard refuses: {item.failed}")
            continue
        if item.reason == UNAVAILABLE:
            lines.append(f"  the conditions hold, but the rewrite cannot be built: {item.note}")
            continue
        if item.reason == UNEVALUABLE:
            lines.append("  the conditions hold, but a rewrite value cannot be evaluated; the rule does not fire")
            lines.append(f"  in: {item.condition}")
            lines.append(f"  failed: {item.failed}  -> {item.truth}")
            if item.values:
                lines.append(f"  saw: {'; '.join(item.values)}")
            lines.append(f"  why: {item.note}")
            continue
        if item.condition and item.condition != item.failed:
            lines.append(f"  where {item.condition}")
        lines.append(f"  failed: {item.failed}  -> {item.truth}")
        if item.path:
            lines.append(f"  at: {', '.join(item.path)}")
        if item.values:
            lines.append(f"  saw: {'; '.join(item.values)}")
        lines.extend(f"  unknown: {origin}" for origin in item.origins)
    return "\n".join(lines)


def _conjuncts(expr) -> list:
    """The parts of `a and b and c`, in reading order."""
    found, stack = [], [expr]
    while stack:
        item = stack.pop()
        if isinstance(item, ast.And):
            stack += (item.right, item.left)
        else:
            found.append(item)
    return found


def _calls(expr, functions: tuple[str, ...]):
    """Every call of one of `functions` in `expr`, outermost first."""
    if isinstance(expr, ast.Call) and expr.function in functions:
        yield expr
    for part in _nodes(expr):
        yield from _calls(part, functions)


def _nodes(expr) -> list:
    """The AST nodes directly inside `expr` (patterns and spans left out)."""
    found: list = []

    def collect(item):
        if isinstance(item, tuple):
            for element in item:
                collect(element)
        elif is_dataclass(item) and not isinstance(item, (ast.Span, ast.OpPattern)):
            found.append(item)

    if is_dataclass(expr):
        for field in fields(expr):
            if field.name != "span":
                collect(getattr(expr, field.name))
    return found


def _why_no_value(found: Unevaluable, env: dict, conditions: Conditions, adapter: Adapter) -> str:
    """Why the part of a rewrite value has none, in the rule author's terms."""
    expression, value = found.expression, found.value
    if isinstance(value, Term):
        return f"is the symbolic dim {value}: a size known only at run time, not a number to build with"
    if isinstance(expression, ast.Call) and expression.function == "uniform" and expression.arguments:
        try:
            constant = adapter.constant(conditions.value(expression.arguments[0], env))
        except Exception:  # no graph value, or an unreadable tensor
            constant = None
        if constant is not None:
            array = np.asarray(constant)
            if array.dtype.kind in "fc" and np.isnan(array).any():
                return "is unknown: the constant holds NaN, which equals no number, so no one number fills it"
            if array.size == 0:
                return "is unknown: the constant is empty"
            return "is unknown: the constant's elements are not all one number"
        return "is unknown: the value is neither a constant nor a fill of one number"
    if value is UNKNOWN or value is Truth.UNKNOWN:
        if isinstance(expression, ast.Call) and expression.function in builtins.REGISTRY:
            return f"is unknown: {builtins.REGISTRY[expression.function].unknown}"
        return "is unknown: what it reads is not known at compile time"
    return found.reason.removeprefix("it ")


def _op_label(op, adapter: Adapter) -> str:
    return f"'{adapter.op_name(op)}' ({adapter.op_type(op)})"


def _describe_with_constant(value: Any, adapter: Adapter) -> str:
    """`describe`, and for a graph value with a small constant, its elements."""
    text = describe(value, adapter)
    if not text.startswith("%"):
        return text
    try:
        constant = adapter.constant(value)
    except Exception:  # an unreadable tensor: the name says enough here
        return text
    if constant is None:
        return text
    array = np.asarray(constant)
    if array.size > 8:
        return f"{text}, a constant"
    return f"{text} = {np.array2string(array.reshape(-1), separator=', ')}"
