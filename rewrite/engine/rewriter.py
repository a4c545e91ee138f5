"""Carrying out a rule's `rewrite` clause, and cleaning up after it."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from rewrite.engine.conditions import Conditions, UseVerdicts
from rewrite.engine.guard import Refusal, ShapeGuard
from rewrite.engine.interfaces import Adapter, Capability, Op, Value, optional, uses_checker
from rewrite.engine.matcher import ABSENT, Environment
from rewrite.engine.operands import OperandTable
from rewrite.language import ast
from rewrite.language.logic import UNKNOWN, Term, Truth


@dataclass(frozen=True)
class Unevaluable:
    """A rewrite value with nothing to build with: the rule does not fire.

    `argument` is the operand being built (`name=expr`), `expression` the
    innermost part of it that has no value (all its own parts have one), and
    `value` what that part evaluated to.
    """

    argument: ast.Argument
    expression: Any
    value: Any
    reason: str

    def __str__(self) -> str:
        return (f"the value of operand '{self.argument.name}' ({self.expression.span}) cannot be "
                f"evaluated: {self.reason}")


@dataclass(frozen=True)
class Unavailable:
    """A rewrite that would build an op the program's target does not have
    (Core ML's `fill_like` before iOS 16, an ONNX op newer than the model's
    opset): the rule does not fire."""

    op_type: str
    span: ast.Span

    def __str__(self) -> str:
        return f"'{self.op_type}' ({self.span}) is not available at the program's target"


@dataclass(frozen=True)
class BuildFailed:
    """A rewrite whose op the backend refused to build (say, Core ML's attention
    op on rank-2 operands): nothing is replaced. For the shipped rules their
    conditions rule this out; a rule of one's own hears of it in checked mode."""

    op_type: str
    span: ast.Span
    message: str

    def __str__(self) -> str:
        return f"the backend could not build '{self.op_type}' ({self.span}): {self.message}"


class RewriteRefused(Exception):
    """A rewrite was not carried out; nothing was replaced.

    `refusal` says why: a `Refusal` when the shape guard could not prove a
    replacement keeps its consumers' types, an `Unevaluable` when an operand
    to build has no value, an `Unavailable` when the target lacks an op to
    build, a `BuildFailed` when the backend could not build one. `built` are
    the ops the rewrite had already built; no value uses them yet.
    """

    def __init__(self, refusal: Refusal | Unevaluable | Unavailable | BuildFailed, built: list[Op]):
        super().__init__(str(refusal))
        self.refusal = refusal
        self.built = built


class _Unbuildable(Exception):
    def __init__(self, failure: BuildFailed):
        self.failure = failure


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


class _NoValue(Exception):
    def __init__(self, unevaluable: Unevaluable):
        self.unevaluable = unevaluable


def why_no_value(value: Any) -> str | None:
    """Why `value` cannot be an operand of an op being built; None if it can.

    Unknown stands for "not read off the graph": building it would put a
    made-up constant into the program. A symbolic dim is a size only known
    at run time, and an absent operand is nothing to build with.
    """
    if value is UNKNOWN or value is Truth.UNKNOWN:
        return "it is unknown"
    if isinstance(value, Term):
        return f"it is the symbolic dim {value}, not a number"
    if value is ABSENT:
        return "it is an absent operand"
    if isinstance(value, (list, tuple)):
        for position, item in enumerate(value):
            reason = why_no_value(item)
            if reason is not None:
                return f"element {position} {reason.removeprefix('it ')}"
    return None


def find_unevaluable(conditions: Conditions, arguments: Sequence[ast.Argument], env: Environment) -> Unevaluable | None:
    """The first of `arguments` that has no value to build with, narrowed to the
    innermost part of it that has none; None when every one has a value."""
    for argument in arguments:
        value = evaluate_argument(conditions, argument.value, env)
        reason = why_no_value(value)
        if reason is not None:
            expression, value = _innermost(conditions, argument.value, value, env)
            return Unevaluable(argument, expression, value, why_no_value(value) or reason)
    return None


def evaluate_argument(conditions: Conditions, expr, env: Environment) -> Any:
    """The value of an operand of an op being built (a tuple for a variadic one)."""
    if isinstance(expr, ast.TupleExpr):
        return tuple(_as_bool(conditions.value(item, env)) for item in expr.items)
    if isinstance(expr, ast.TupleComprehension):
        items = conditions.value(expr.comprehension, env)
        return UNKNOWN if items is UNKNOWN else tuple(_as_bool(item) for item in items)
    return _as_bool(conditions.value(expr, env))


def _as_bool(value: Any) -> Any:
    """A proved truth (`a != b` in `end_mask=[...]`) as the bool a backend builds with;
    an unknown one stays unknown, which nothing is built with."""
    if value is Truth.YES or value is Truth.NO:
        return value is Truth.YES
    if isinstance(value, list) and any(isinstance(item, (Truth, list)) for item in value):
        return [_as_bool(item) for item in value]
    return value


def _innermost(conditions: Conditions, expr, value, env: Environment) -> tuple[Any, Any]:
    """Follow the parts without a value down to one whose own parts all have one."""
    while True:
        for part in subexpressions(conditions, expr, env):
            try:
                part_value = evaluate_argument(conditions, part, env)
            except (KeyError, TypeError, ValueError, ArithmeticError):
                continue  # a part that reads a variable bound inside expr (a comprehension's)
            if why_no_value(part_value) is not None:
                expr, value = part, part_value
                break
        else:
            return expr, value


def subexpressions(conditions: Conditions, expr, env: Environment) -> list:
    """The subexpressions `expr`'s value is computed from (of a conditional, the branch taken)."""
    if isinstance(expr, ast.Conditional):
        # Only the branch taken made the value.
        taken = expr.then if conditions.truth(expr.condition, env) is Truth.YES else expr.otherwise
        return [taken]
    parts: list = []
    for field in fields(expr):
        if field.name == "span":
            continue
        _collect(getattr(expr, field.name), parts)
    return parts


def _references(expr) -> set[str]:
    """The `%v` an expression reads."""
    if isinstance(expr, ast.ValueRef):
        return {expr.var}
    found: set[str] = set()
    parts: list = []
    if is_dataclass(expr):
        for field in fields(expr):
            if field.name != "span":
                _collect(getattr(expr, field.name), parts)
    for part in parts:
        found |= _references(part)
    return found


def _collect(item, parts: list) -> None:
    if isinstance(item, tuple):
        for element in item:
            _collect(element, parts)
    elif is_dataclass(item) and not isinstance(item, (ast.Span, ast.OpPattern)):
        parts.append(item)


class Rewriter:
    """Applies actions through an adapter; names new ops after their rule.

    A rule's actions are carried out in three steps: build every new op,
    let the shape guard check every replacement against the graph as it was
    matched, then replace. A refusal therefore leaves no use changed, and so
    does an operand with no value to build with (say `uniform(%c)` of a
    constant holding NaN): that rewrite does not happen either.
    """

    def __init__(self, adapter: Adapter, conditions: Conditions, table: OperandTable | None = None):
        self.adapter = adapter
        self.conditions = conditions
        # The records of wide ops, told of every edit before it is made; and
        # the summaries of values' uses, told before and after.
        self.table = table
        self.uses = conditions.use_verdicts
        self.guard = ShapeGuard(adapter, table)
        self._serial = itertools.count()
        self._op_available = optional(adapter, Capability.TARGETS)
        self._available: dict[str, bool] = {}  # by op type: the target does not change during a run

    def apply(self, rule: ast.Rule, env: Environment, anchor: Op) -> list[Op]:
        """Run every action of `rule`; return the ops that may now be dead.

        Raises `RewriteRefused` if the guard cannot prove every replacement,
        or if an operand to build cannot be evaluated.
        """
        missing = self._unavailable(rule)
        if missing is not None:
            raise RewriteRefused(missing, [])
        env = dict(env)
        built: list[Op] = []
        try:
            replacements = self._build_all(rule, env, anchor, built)
        except _NoValue as no_value:
            raise RewriteRefused(no_value.unevaluable, built) from None
        except _Unbuildable as failed:
            raise RewriteRefused(failed.failure, built) from None
        for old, new, within in replacements:
            refusal = self.guard.check(old, new, None if within is None else [within])
            if refusal is not None:
                raise RewriteRefused(refusal, built)
        return self._replace(replacements, anchor, built)

    def preflight(self, rule: ast.Rule, env: Environment) -> Refusal | Unevaluable | Unavailable | None:
        """What would stop `rule`'s rewrite in `env`, as far as it can be told without building:
        an op the target lacks, an operand with no value (of the ops built from bound values
        alone), or a replacement by a bound value the shape guard refuses. `apply` refuses
        for each of these reasons too (and for what only building shows); `explain` asks
        this, so that what it says is what a run does.
        """
        missing = self._unavailable(rule)
        if missing is not None:
            return missing
        built: set[str] = set()
        for action in rule.actions:
            build = action.build if isinstance(action, ast.BuildAction) else action.replacement
            if isinstance(build, (ast.OpBuild, ast.Rebuild)):
                # Operands that read an op the rule builds first cannot be told without building it.
                ready = [a for a in build.arguments if not (_references(a.value) & built)]
                found = find_unevaluable(self.conditions, ready, env)
                if found is not None:
                    return found
            if isinstance(action, ast.BuildAction):
                built.add(action.var)
        adapter = self.adapter
        for action in rule.actions:
            if not isinstance(action, ast.ReplaceAction) or not isinstance(action.replacement, ast.ValueRef):
                continue
            old, new = env.get(action.target), env.get(action.replacement.var)
            if old is None or new is None:
                continue
            within = None if action.within is None else [adapter.producer(env[action.within])]
            refusal = self.guard.check(old, new, within)
            if refusal is not None:
                return refusal
        return None

    def _unavailable(self, rule: ast.Rule) -> Unavailable | None:
        """The first op `rule` builds that the program's target provably lacks."""
        if self._op_available is None:
            return None
        for action in rule.actions:
            build = action.build if isinstance(action, ast.BuildAction) else getattr(action, "replacement", None)
            if not isinstance(build, ast.OpBuild):
                continue
            available = self._available.get(build.op)
            if available is None:
                # Unknown (an op type the backend cannot look up) is left to
                # the build, which names it; only a proved absence refuses.
                available = self._available[build.op] = self._op_available(build.op) is not False
            if not available:
                return Unavailable(build.op, build.span)
        return None

    def _build_all(self, rule: ast.Rule, env: Environment, anchor: Op, built: list[Op]) -> list:
        """Build every new op (into `built`, as it goes); return the replacements to make."""
        adapter = self.adapter
        replacements: list[tuple[Value, Value, Op | None]] = []
        for action in rule.actions:
            if isinstance(action, ast.BuildAction):
                env[action.var] = self._build(rule, action.build, env, anchor)
                built.append(adapter.producer(env[action.var]))
                continue
            old = env[action.target]
            replacement = action.replacement
            if action.within is not None:
                assert isinstance(replacement, ast.ValueRef)  # the parser reads `in %op` after a `%new` only
                # Only one consumer's operands change; `old` keeps its other uses.
                replacements.append((old, env[replacement.var], adapter.producer(env[action.within])))
                continue
            if isinstance(replacement, ast.ValueRef):
                new = env[replacement.var]
            elif isinstance(replacement, ast.Index):  # `%old -> %items[i]`: one of a bound tuple
                new = self.conditions.value(replacement, env)
                reason = why_no_value(new)
                if reason is None and isinstance(new, (bool, int, float, str, list, tuple, Truth)):
                    reason = "it is a constant, not a value of the graph"
                if reason is not None:
                    argument = ast.Argument(action.target, replacement, replacement.span)
                    raise _NoValue(Unevaluable(argument, replacement, new, reason))
            else:
                if isinstance(replacement, ast.OpBuild):
                    new = self._build(rule, replacement, env, anchor)
                else:
                    new = self._rebuild(rule, replacement, env, anchor)
                if new is not None and adapter.producer(new) is not None:
                    built.append(adapter.producer(new))
            replacements.append((old, new, None))
        return replacements

    def _replace(self, replacements: list, anchor: Op, built: list[Op]) -> list[Op]:
        adapter, table = self.adapter, self.table
        touched: list[Op] = [anchor, *built]
        uses = self.uses
        for old, new, within in replacements:
            producer = adapter.producer(old)
            pending = uses.before((old, new))
            if within is not None:
                if table is not None and table.records:
                    table.replacing_operand(within, old, new)
                adapter.replace_operand(within, old, new)
                if pending:
                    uses.after(pending, {old: ((), (within,)), new: ((within,), ())})
                if producer is not None:
                    touched.append(producer)  # dead now if `within` was its last use
                continue
            if table is not None and table.records:
                table.replacing_all(old, new)
            moved = adapter.consumers(old) if pending else ()
            # An output replaced may be bridged by an op of the adapter's own, which reads `new`.
            bridged = (new,) if pending and adapter.is_block_output(old) else ()
            adapter.replace_all_uses(old, new)
            if pending:
                uses.after(pending, {old: ((), moved), new: (moved, ())}, bridged)
            if producer is not None:
                touched.append(producer)
        return touched

    def _name(self, rule: ast.Rule) -> str:
        return f"{rule.name}_{next(self._serial)}"

    def _arguments(self, arguments: Sequence[ast.Argument], env: Environment) -> dict:
        conditions = self.conditions
        operands = {a.name: evaluate_argument(conditions, a.value, env) for a in arguments}
        for value in operands.values():
            if why_no_value(value) is not None:
                # Found again, narrowed, only on this rare path.
                unevaluable = find_unevaluable(conditions, arguments, env)
                assert unevaluable is not None  # `value` is one
                raise _NoValue(unevaluable)
        return operands

    def _build(self, rule, build: ast.OpBuild, env, anchor):
        operands = self._arguments(build.arguments, env)
        pending = self.uses.before(_values_in(operands.values()))
        try:
            built = self.adapter.build(build.op, operands, anchor, self._name(rule))
            self._built(pending, built)
            return built
        except Exception as error:
            # A builder's own type checks (coremltools raises ValueError and
            # friends): the op cannot exist with these operands.
            raise _Unbuildable(BuildFailed(build.op, build.span, _first_line(error))) from None

    def _rebuild(self, rule, rebuild: ast.Rebuild, env, anchor):
        op = self.adapter.producer(env[rebuild.var])
        copy = optional(self.adapter, Capability.REBUILD)
        changes = self._arguments(rebuild.arguments, env)
        try:
            if copy is not None:
                # An IR whose ops carry attributes besides operands copies the op itself.
                pending = self.uses.before([*self.adapter.operands(op), *_values_in(changes.values())])
                built = copy(op, changes, anchor, self._name(rule))
            else:
                operands = {name: self.adapter.operand(op, name) for name in self.adapter.operand_names(op)}
                operands.update(changes)
                pending = self.uses.before(_values_in(operands.values()))
                built = self.adapter.build(self.adapter.op_type(op), operands, anchor, self._name(rule))
            self._built(pending, built)
            return built
        except Exception as error:
            raise _Unbuildable(BuildFailed(self.adapter.op_type(op), rebuild.span, _first_line(error))) from None


    def _built(self, pending: list, built) -> None:
        """Tell the summaries of uses that the op making `built` reads its operands."""
        if not pending:
            return
        op = self.adapter.producer(built)
        if op is None:  # no op made: whatever happened is listed afresh
            self.uses.after(pending, {}, tuple(value for value, _ in pending))
            return
        # Each value the op reads starts being used by it; the constants a
        # builder makes for literal operands read nothing.
        read = set(self.adapter.operands(op))
        self.uses.after(pending, {value: ((op,), ()) for value, _ in pending if value in read})


def _values_in(items) -> list:
    """Build operands, tuples flattened: the values whose uses a build may change
    (a constant among them has no summary to update)."""
    found: list = []
    for item in items:
        found.extend(item if isinstance(item, tuple) else (item,))
    return found


def remove_dead(adapter: Adapter, candidates: Sequence[Op], table: OperandTable | None = None,
                uses: UseVerdicts | None = None, *, discarded: Sequence[Op] = ()) -> int:
    """Remove each candidate no longer used, then its producers in turn.

    Only ops reachable backwards from what a rewrite touched are visited, so
    the cost is proportional to what the rewrite made dead, not to the graph.
    Whether an op is dead is asked of its outputs in O(1) (`has_uses`), never
    by listing their consumers: a value shared by every layer (one mask, one
    `Shape`) is visited once per removed consumer, and listing its thousands
    of uses each time made a run quadratic. Returns the ops removed, those of
    a removed op's nested blocks included. `table`, the run's records of wide
    ops, is told of each removal.

    An op with side effects stays, unless it is one of `discarded`: the ops
    a refused rewrite built, which were never meant to run (a state update
    left behind by one would write the state where the program did not).
    """
    has_uses = uses_checker(adapter)
    is_live, has_side_effects, outputs = adapter.is_live, adapter.has_side_effects, adapter.outputs
    never_ran = {id(op) for op in discarded if op is not None}
    removed = 0
    worklist = [op for op in candidates if op is not None]
    while worklist:
        op = worklist.pop()
        if not is_live(op) or (has_side_effects(op) and id(op) not in never_ran):
            continue
        # Most ops visited are a removed op's producers that are still used.
        for value in outputs(op):
            if has_uses(value):
                break
        else:
            removed += _remove(adapter, op, table, worklist, uses)
    return removed


def _remove(adapter: Adapter, op: Op, table: OperandTable | None, worklist: list,
            uses: UseVerdicts | None = None) -> int:
    """Remove `op`, found unused, and queue its operands' producers; how many ops
    went (its nested blocks' included), 0 if a body that writes state keeps it."""
    operands = list(adapter.operands(op))
    nested = adapter.nested_blocks(op)
    inner: Sequence[Op] = ()
    if nested:
        inner = _nested_ops(adapter, nested)
        if any(adapter.has_side_effects(inner_op) for inner_op in inner):
            return 0  # a body that writes state keeps its op, used or not
        for inner_op in inner:
            # A body reads values of the enclosing scopes by name (ONNX) or
            # as operands (MIL): their producers may be dead with it.
            operands.extend(adapter.operands(inner_op))
        for block in nested:
            operands.extend(adapter.block_outputs(block))
    if table is not None and table.records:
        table.removing(op)
        for inner_op in inner:
            table.removing(inner_op)
    pending = uses.before(operands) if uses is not None else ()
    adapter.remove_op(op)
    if uses is not None and pending:
        gone = (op, *inner)
        uses.after(pending, {value: ((), gone) for value, _ in pending})
    producer_of = adapter.producer
    for value in operands:
        producer = producer_of(value)
        if producer is not None:
            worklist.append(producer)
    return 1 + len(inner)


def _nested_ops(adapter: Adapter, blocks: Sequence) -> list[Op]:
    """Every op of `blocks` and of the blocks nested in them, without recursion."""
    found: list[Op] = []
    pending = list(blocks)
    while pending:
        block = pending.pop()
        for op in adapter.operations(block):
            found.append(op)
            pending.extend(adapter.nested_blocks(op))
    return found
