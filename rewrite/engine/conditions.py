"""Evaluation of `where` conditions, in three-valued logic.

Numbers at run time are ints, floats, `Symbol`s or `UNKNOWN`; lists are
Python lists (or `UNKNOWN`); booleans are `Truth`. Anything that cannot be
read off the graph is `UNKNOWN`, and arithmetic or comparison with an
unknown stays unknown, so it can never make a rule fire.

A conjunction is evaluated left to right, and an unnegated `%v is op(...)`
in it binds for the conjuncts after it: the conjunction holds if some way
of matching makes the rest hold.

`every use %u of %v: body` walks the uses of %v. Where the body reads
nothing but the use, %v and named constants, through builtins whose answers
a run does not change (`UseVerdicts`), its verdict is kept per value until
the value's uses change (`Adapter.uses_version`): a value feeding every
layer is walked once, not once per anchor that asks about it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rewrite.engine.interfaces import Adapter, use_counter, uses_versioner
from rewrite.engine.logic import UNKNOWN, Symbol, Truth, equal, is_literal, order
from rewrite.engine.matcher import ABSENT, Environment, Matcher
from rewrite.engine.operands import OperandsExcept
from rewrite.language import ast
from rewrite.language.types import BUILTINS, NAMED_CONSTANTS, Type
from rewrite.predicates import Predicate, PredicateContext


@dataclass(frozen=True)
class Failure:
    """Why a condition did not hold: the innermost conjunct that failed."""

    expr: Any
    truth: Truth
    bindings: tuple[tuple[str, Any], ...]  # quantifier variables and uses in force, unformatted
    # Recorded only when explaining: every binding in force, and for a failed
    # comparison the values of its two sides.
    env: dict | None = None
    sides: tuple[Any, Any] | None = None


_BINDS: dict[int, tuple[Any, bool]] = {}


def _binds(expr) -> bool:
    """Whether `expr` has a pattern or an `is %v` that can bind (cached per node)."""
    cached = _BINDS.get(id(expr))
    if cached is not None and cached[0] is expr:
        return cached[1]
    found = _has_binding(expr)
    _BINDS[id(expr)] = (expr, found)
    return found


def _has_binding(expr) -> bool:
    if isinstance(expr, (ast.Matches, ast.SameValue)):
        return not expr.negated
    if isinstance(expr, (ast.And, ast.Or)):
        return _has_binding(expr.left) or _has_binding(expr.right)
    return False


def domain_list(domain) -> list | None:
    """What a quantifier or comprehension ranges over: a list, or the tuple of
    operands a rest operand bound (a tuple, or a view of a wide op's); None when
    it is not known."""
    if isinstance(domain, (tuple, OperandsExcept)):
        return list(domain)
    return domain if isinstance(domain, list) else None


def conjuncts(expr) -> list:
    """`a and b and c` as [a, b, c]."""
    if isinstance(expr, ast.And):
        return conjuncts(expr.left) + conjuncts(expr.right)
    return [expr]


_COSTLY = (ast.EveryUse, ast.Quantifier, ast.Comprehension, ast.Matches)


def _cheap(expr) -> bool:
    """A conjunct that binds nothing and costs about the same at every anchor:
    no pattern, no quantifier, only builtins (a predicate may cost anything)."""
    for node in ast.walk(expr):
        if isinstance(node, _COSTLY) or (type(node) is ast.SameValue and not node.negated):
            return False
        if type(node) is ast.Call and (node.function not in _BUILTINS or node.function == "internal"):
            return False
    return True


def cheap_first(items: list) -> list:
    """The conjuncts of a rule, each one that walks uses moved after the cheap ones
    that follow it (up to the next that binds or costs more).

    Kleene's `and` gives the same verdict in any order, and the conjuncts
    moved past bind nothing, so each reads what it read before; only a
    walk over thousands of uses is no longer made at an anchor that a
    cheap test refuses. Both evaluators use this order, so explain reports
    the failure apply met.
    """
    ordered = list(items)
    position = 0
    while position < len(ordered):
        if any(type(node) is ast.EveryUse for node in ast.walk(ordered[position])):
            end = position + 1
            while end < len(ordered) and _cheap(ordered[end]):
                end += 1
            if end > position + 1:
                ordered[position:end] = [*ordered[position + 1:end], ordered[position]]
                position = end
                continue
        position += 1
    return ordered


# Builtins whose answer for the same arguments a run does not change: they
# read a value's type (which the shape guard keeps), constant, producer or
# that op's attributes, or compute on numbers and lists. Not those reading
# uses (`use_count`, `one_use`, `block_output`, `internal`, the scaling
# chain's) or following producers' operands (`elements`, the bounds).
_STABLE_BUILTINS = frozenset({
    "is_nan", "is_inf", "is_finite", "close", "as_dtype", "uniform", "rank", "dim", "shape", "axes",
    "aligned_dim", "is_const", "absent", "const", "is_symbolic", "is_known", "dtype", "is_input", "same_block",
    "broadcasts", "op_type", "attribute", "contains", "gather", "lowest", "max_finite", "lowest_finite",
    "zero_of", "max_of", "max_abs", "normalized_axes", "represents", "len", "range", "abs", "sqrt",
    "every_row_any", "mod",
})


def _reads_only(node, bound: frozenset[str], constants: set[str]) -> bool:
    """Whether `node` reads no variable but `bound` (and named constants, collected
    in `constants`) and calls only `_STABLE_BUILTINS`; patterns and uses make it no."""
    kind = type(node)
    if kind is ast.Literal:
        return True
    if kind is ast.ValueRef:
        return node.var in bound
    if kind is ast.NameRef:
        if node.name in bound:
            return True
        constants.add(node.name)
        return node.name in NAMED_CONSTANTS
    if kind is ast.Not:
        return _reads_only(node.operand, bound, constants)
    if kind in (ast.And, ast.Or, ast.Compare, ast.Arithmetic):
        return _reads_only(node.left, bound, constants) and _reads_only(node.right, bound, constants)
    if kind is ast.ListExpr:
        return all(_reads_only(item, bound, constants) for item in node.items)
    if kind is ast.Index:
        return _reads_only(node.base, bound, constants) and _reads_only(node.index, bound, constants)
    if kind is ast.Conditional:
        return all(_reads_only(part, bound, constants) for part in (node.condition, node.then, node.otherwise))
    if kind is ast.Call:
        return (node.function in _STABLE_BUILTINS
                and all(_reads_only(argument, bound, constants) for argument in node.arguments)
                and all(_reads_only(argument, bound, constants) for _, argument in node.keywords))
    if kind is ast.SameValue:
        return node.var in bound and _reads_only(node.left, bound, constants)  # compares; binds nothing
    if kind is ast.Quantifier or kind is ast.Comprehension:
        inner = bound | {node.variable}
        parts = [getattr(node, name, None) for name in ("filter", "body", "item", "keep")]
        return _reads_only(node.domain, bound, constants) and all(
            part is None or _reads_only(part, inner, constants) for part in parts)
    return False


class UseTally:
    """A body's verdict at each distinct use of one value, and how many of each verdict.

    `judge(consumer)` is the body's verdict with the use bound to that
    consumer's output: the same for a consumer as long as it exists (the
    body reads nothing else that a run changes), so a use that comes or goes
    moves one count. Added and dropped like `operands.Counts`.
    """

    __slots__ = ("judge", "of", "counts")

    def __init__(self, judge: Callable[[Any], Truth]):
        self.judge = judge
        self.of: dict = {}  # consumer -> its verdict
        self.counts = {Truth.YES: 0, Truth.NO: 0, Truth.UNKNOWN: 0}

    def add(self, consumer, times: int) -> None:
        verdict = self.of[consumer] = self.judge(consumer)
        self.counts[verdict] += 1

    def drop(self, consumer, times: int) -> None:
        self.counts[self.of.pop(consumer)] -= 1

    def verdict(self) -> Truth:
        """Kleene's `and` of the verdicts: what walking the uses gives."""
        if self.counts[Truth.NO]:
            return Truth.NO
        return Truth.UNKNOWN if self.counts[Truth.UNKNOWN] else Truth.YES


class UseVerdicts:
    """What `every use %u of %v: body` reads of the uses of %v, kept per value.

    For a body that reads nothing but %u, %v and named constants, through
    `_STABLE_BUILTINS`, its verdict at each use is a function of that use's
    op alone: a `UseTally` of the uses keeps them, and the quantifier's
    verdict is read off its counts. For a body that compares one feature of
    %u with something of the anchor's (`rank(%u) == rank(%x)`), the
    feature's counts over the uses (`operands.Counts`, keyed by the using
    op) are the same for every anchor (`summary`; compiled.py reads them).

    Either kind is built by listing the uses once and is kept up to date
    with the run's edits, which the rewriter tells (`before` an edit, then
    `after` it, with the uses it added and dropped): a value read by every
    layer is walked once per run, not once per anchor or per edit. Each
    kept summary records `Adapter.uses_version` as of its last update; one
    whose value's uses changed in a way it was not told of (an adapter's own
    bridge, an edit outside the rewriter) is listed afresh. Nothing is kept
    for an adapter without `uses_version`, or where a binding shadows a
    named constant the body reads.
    """

    def __init__(self, adapter: Adapter):
        self.adapter = adapter
        self.version_of = uses_versioner(adapter)
        # id(expr) -> (expr, the named constants its body reads, or None: not kept)
        self._bodies: dict[int, tuple[Any, frozenset[str] | None]] = {}
        # (id(expr) or a summary's key, value) -> [uses version at the last update, tally or counts]
        self._kept: dict[tuple[Any, Any], list] = {}
        # value -> the keys of `_kept` that summarize its uses
        self._of_value: dict[Any, set] = {}

    def keeps(self, expr: ast.EveryUse) -> bool:
        """Whether `expr`'s verdicts can be kept at all."""
        return self._constants(expr) is not None

    def _constants(self, expr: ast.EveryUse) -> frozenset[str] | None:
        found = self._bodies.get(id(expr))
        if found is None or found[0] is not expr:
            constants: set[str] = set()
            reads_only = self.version_of is not None and _reads_only(
                expr.body, frozenset((expr.variable, expr.of)), constants)
            found = self._bodies[id(expr)] = (expr, frozenset(constants) if reads_only else None)
        return found[1]

    def verdict(self, expr: ast.EveryUse, value, env: Environment, judge) -> Truth | None:
        """The quantifier's verdict over `value`'s uses, from its kept tally (made now
        if there is none: `judge(consumer, value)` decides the body at one use);
        None where nothing is kept."""
        constants = self._constants(expr)
        if constants is None or not constants.isdisjoint(env):
            return None
        tally = self._fresh((id(expr), value), value, lambda: UseTally(lambda consumer: judge(consumer, value)))
        return None if tally is None else tally.verdict()

    def summary(self, key, value, make: Callable[[], Any]):
        """The summary named `key` of one feature over the uses of `value`: `make()`,
        to which each using op is added once; kept up to date (see the class
        docstring); None where it cannot be kept or counted."""
        if self.version_of is None:
            return None
        return self._fresh((key, value), value, make)

    def _fresh(self, key, value, make):
        if value is None or value is ABSENT or value is UNKNOWN or isinstance(value, (list, tuple, OperandsExcept)):
            return None
        try:
            found = self._kept.get(key)
        except TypeError:  # a value that is no key
            return None
        version = self.version_of(value)
        if found is not None and found[0] == version:
            return found[1]  # None: a feature that cannot be counted, until the uses change
        summary = make()
        try:
            for consumer in self.adapter.consumers(value):
                summary.add(consumer, 1)
        except TypeError:  # a feature that cannot be counted
            summary = None
        self._kept[key] = [version, summary]
        self._of_value.setdefault(value, set()).add(key)
        return summary

    # ---- the edits of a run, told by the rewriter

    def before(self, values) -> list:
        """Before an edit that may change the uses of `values`: the summaries of them
        that are up to date, to be updated by `after`."""
        if not self._of_value:
            return []
        pending = []
        version_of = self.version_of
        for value in values:
            try:
                keys = self._of_value.get(value)
            except TypeError:
                continue
            if not keys:
                continue
            version = version_of(value)
            for key in keys:
                entry = self._kept[key]
                if entry[0] == version and entry[1] is not None:
                    pending.append((value, entry))
        return pending

    def after(self, pending: list, changes: dict, unknown=()) -> None:
        """After the edit: `changes` maps a value to (the ops that started using it,
        those that stopped); a value in `unknown` may have changed otherwise too
        and is listed afresh when next asked."""
        version_of = self.version_of
        for value, entry in pending:
            if value in unknown:
                entry[0] = -1  # no version: listed afresh
                continue
            added, dropped = changes.get(value, ((), ()))
            summary = entry[1]
            try:
                for consumer in dropped:
                    if consumer in summary.of:
                        summary.drop(consumer, 1)
                for consumer in added:
                    if consumer not in summary.of:
                        summary.add(consumer, 1)
            except TypeError:  # uncountable now: listed afresh once the uses change again
                entry[1] = None
            entry[0] = version_of(value)


class Evaluator:
    """Evaluates condition expressions against one program."""

    def __init__(self, adapter: Adapter, matcher: Matcher, predicates: dict[str, Predicate]):
        self.adapter = adapter
        self.matcher = matcher
        self.predicates = predicates
        self.context = PredicateContext(adapter)
        self.failure: Failure | None = None
        self.explaining = False
        # Quantifier variables in force, kept raw: formatting them is only
        # worth it when a failure is reported, not on every iteration.
        self._scope: list[tuple[str, Any]] = []
        # id(value) -> (value, its constant as a flat list); the value is kept
        # so its id cannot be reused while cached.
        self._constants: dict[int, tuple[Any, list | None]] = {}
        self.use_verdicts = UseVerdicts(adapter)
        self._ordered: dict[int, tuple[list, list]] = {}  # id(exprs) -> (exprs, `cheap_first` of them)

    # ---------------------------------------------------------------- truth

    def holds(self, exprs: list, env: Environment) -> tuple[Truth, Environment | None]:
        """Evaluate a conjunction (in `cheap_first` order). On YES, also return the
        environment that made it hold."""
        self.failure = None
        self._constants.clear()
        ordered = self._ordered.get(id(exprs))
        if ordered is None or ordered[0] is not exprs:
            ordered = self._ordered[id(exprs)] = (exprs, cheap_first([p for e in exprs for p in conjuncts(e)]))
        return self._all(ordered[1], env)

    def _all(self, items: list, env: Environment, start: int = 0) -> tuple[Truth, Environment | None]:
        """The conjunction of items[start:], left to right; a pattern binds for what follows it."""
        result = Truth.YES
        for position in range(start, len(items)):
            head = items[position]
            if type(head) is ast.And:
                # Flatten and go on from here; what held so far still counts.
                flattened = items[:position] + conjuncts(head) + items[position + 1 :]
                truth, final = self._all(flattened, env, position)
                combined = result & truth
                return combined, (final if combined is Truth.YES else None)
            if type(head) is ast.Or and _binds(head):
                # (a or b) and rest is (a and rest) or (b and rest): each side
                # binds for the rest in turn.
                best = Truth.NO
                rest = items[position + 1 :]
                for side in (head.left, head.right):
                    truth, final = self._all([side, *rest], env)
                    if truth is Truth.YES:
                        return result, (final if result is Truth.YES else None)
                    best = best | truth
                return result & best, None
            if type(head) is ast.SameValue and not head.negated and head.var not in env:
                # `expr is %new` names what expr is, for what follows.
                subject = self.value(head.left, env)
                if subject is None or subject is UNKNOWN or subject is ABSENT or isinstance(subject, (list, tuple)):
                    self._fail(head, Truth.UNKNOWN, env)
                    return Truth.UNKNOWN, None
                env = {**env, head.var: subject}
                continue
            if type(head) is ast.Matches and not head.negated:
                # Existential over the ways the pattern matches: the first way
                # that makes the rest hold wins.
                best = Truth.NO
                for extended in self._match(head, env):
                    truth, final = self._all(items, extended, position + 1)
                    if truth is Truth.YES:
                        return result, (final if result is Truth.YES else None)
                    best = best | truth
                if best is Truth.NO and self.failure is None:
                    self._fail(head, Truth.NO, env)
                return result & best, None
            truth = self.truth(head, env)
            if truth is not Truth.YES:
                self._fail(head, truth, env)
                if truth is Truth.NO:
                    return truth, None
                result = Truth.UNKNOWN
        return result, (env if result is Truth.YES else None)

    def _fail(self, expr, truth: Truth, env: Environment, extra: tuple = ()) -> None:
        if self.failure is not None:
            return
        bindings = tuple(self._scope) + extra
        if not self.explaining:
            self.failure = Failure(expr, truth, bindings)
            return
        sides = None
        if isinstance(expr, ast.Compare):
            sides = (self.value(expr.left, env), self.value(expr.right, env))
        self.failure = Failure(expr, truth, bindings, dict(env), sides)

    def truth(self, expr, env: Environment) -> Truth:
        method = self._truth_of.get(type(expr))
        if method is not None:
            return method(self, expr, env)
        value = self.value(expr, env)
        if isinstance(value, Truth):
            return value
        if isinstance(value, bool):
            return Truth.of(value)
        return Truth.UNKNOWN

    def _and(self, expr: ast.And, env: Environment) -> Truth:
        return self._all(conjuncts(expr), env)[0]

    def _or(self, expr: ast.Or, env: Environment) -> Truth:
        left = self.truth(expr.left, env)
        if left is Truth.YES:
            return left
        return left | self.truth(expr.right, env)

    def _not(self, expr: ast.Not, env: Environment) -> Truth:
        return ~self.truth(expr.operand, env)

    def _same_value(self, expr: ast.SameValue, env: Environment) -> Truth:
        if expr.var not in env:  # binding is for conjunctions; under `not` it decides nothing
            return Truth.UNKNOWN
        same = Truth.of(self.value(expr.left, env) == env[expr.var])
        return ~same if expr.negated else same

    def _matches(self, expr: ast.Matches, env: Environment) -> Truth:
        found = Truth.of(any(True for _ in self._match(expr, env)))
        return ~found if expr.negated else found

    def _match(self, expr: ast.Matches, env: Environment):
        subject = self.value(expr.subject, env)
        # An absent optional operand (`reps=%r?`) is produced by no op.
        if subject is None or subject is UNKNOWN or subject is ABSENT or isinstance(subject, (list, tuple)):
            return iter(())
        op = self.adapter.producer(subject)
        if op is None:
            return iter(())
        return self.matcher.match_op(expr.pattern, op, env)

    def _compare(self, expr: ast.Compare, env: Environment) -> Truth:
        left = self.value(expr.left, env)
        right = self.value(expr.right, env)
        if expr.operator in ("==", "!="):
            same = _equal(left, right)
            return same if expr.operator == "==" else ~same
        return order(expr.operator, left, right)

    def _quantifier(self, expr: ast.Quantifier, env: Environment) -> Truth:
        domain = domain_list(self.value(expr.domain, env))
        if domain is None:
            return Truth.UNKNOWN
        forall = expr.kind == "forall"
        result = Truth.YES if forall else Truth.NO
        inner = dict(env)
        for element in domain:
            inner[expr.variable] = element
            self._scope.append((expr.variable, element))
            try:
                selected, scope = Truth.YES, inner
                if expr.filter is not None:
                    # A pattern in the filter binds for the body. A filter that
                    # fails only skips this element; it is no failure to report.
                    failure = self.failure
                    selected, scope = self._all(conjuncts(expr.filter), inner)
                    self.failure = failure
                if selected is Truth.NO:
                    continue
                if scope is None:
                    # An unknown filter binds nothing; the body may still hold
                    # (unknown -> yes is yes). If it needs the filter's
                    # bindings it cannot be decided.
                    try:
                        body = self.truth(expr.body, inner)
                    except KeyError:
                        body = Truth.UNKNOWN
                else:
                    body = self.truth(expr.body, scope)
            finally:
                self._scope.pop()
            if body is not Truth.YES:
                # The first element whose body fails is the one to report.
                self._fail(expr.body, body, scope or inner, ((expr.variable, element),))
            if forall:
                result = result & (~selected | body)
                if result is Truth.NO:
                    return result
            else:
                result = result | (selected & body)
                if result is Truth.YES:
                    return result
        if forall and result is not Truth.YES:
            self._fail(expr, result, env)
        return result

    def _every_use(self, expr: ast.EveryUse, env: Environment) -> Truth:
        value = env[expr.of]
        # A kept yes has no failure to report; any other verdict walks, to name the use.
        if self.use_verdicts.verdict(expr, value, env, self._judge(expr)) is Truth.YES:
            return Truth.YES
        return self._walk_uses(expr, value, env)

    def _judge(self, expr: ast.EveryUse):
        """The body's verdict at one use of a value, recording no failure (`UseVerdicts`)."""

        def judge(consumer, value) -> Truth:
            outputs = self.adapter.outputs(consumer)
            failure = self.failure
            verdict = self.truth(expr.body, {expr.of: value, expr.variable: outputs[0] if outputs else None})
            self.failure = failure
            return verdict

        return judge

    def _walk_uses(self, expr: ast.EveryUse, value, env: Environment) -> Truth:
        result = Truth.YES
        inner = dict(env)
        for consumer in self.adapter.consumers(value):
            outputs = self.adapter.outputs(consumer)
            inner[expr.variable] = outputs[0] if outputs else None
            self._scope.append((expr.variable, consumer))
            try:
                truth = self.truth(expr.body, inner)
            finally:
                self._scope.pop()
            if truth is not Truth.YES:
                self._fail(expr.body, truth, inner, ((expr.variable, consumer),))
            result = result & truth
            if result is Truth.NO:
                return result
        return result

    # ---------------------------------------------------------------- values

    def value(self, expr, env: Environment) -> Any:
        method = self._value_of.get(type(expr))
        if method is None:
            return self.truth(expr, env)
        return method(self, expr, env)

    def _literal(self, expr: ast.Literal, env: Environment):
        return expr.value

    def _value_ref(self, expr: ast.ValueRef, env: Environment):
        return env[expr.var]

    def _name_ref(self, expr: ast.NameRef, env: Environment):
        if expr.name in env:
            return env[expr.name]
        return NAMED_CONSTANTS[expr.name][1]

    def _list(self, expr: ast.ListExpr, env: Environment):
        return [self.value(item, env) for item in expr.items]

    def _conditional(self, expr: ast.Conditional, env: Environment):
        if self.truth(expr.condition, env) is Truth.YES:
            return self.value(expr.then, env)
        return self.value(expr.otherwise, env)

    def _comprehension(self, expr: ast.Comprehension, env: Environment):
        domain = domain_list(self.value(expr.domain, env))
        if domain is None:
            return UNKNOWN
        items = []
        inner = dict(env)
        failure = self.failure  # an element left out is no failure to report
        for element in domain:
            inner[expr.variable] = element
            if expr.keep is None or self.truth(expr.keep, inner) is Truth.YES:
                items.append(self.value(expr.item, inner))
        self.failure = failure
        return items

    def _internal(self, value, env: Environment) -> Truth:
        """Every use of `value` is by an op the rule bound (the anchor, a matched producer)."""
        if value is None or value is UNKNOWN or value is ABSENT or isinstance(value, (list, tuple)):
            return Truth.UNKNOWN
        if self.adapter.is_block_output(value):
            return Truth.NO
        matched = set()
        for bound in env.values():
            if bound is None or bound is ABSENT or isinstance(bound, (list, tuple, str, int, float, OperandsExcept)):
                continue
            try:
                op = self.adapter.producer(bound)
            except (KeyError, TypeError, AttributeError):
                continue
            if op is not None:
                matched.add(op)
        # More consumers than bound ops: some consumer is not one of them, and
        # a value used by every layer is not listed to find that out.
        if use_counter(self.adapter)(value, len(matched) + 1) > len(matched):
            return Truth.NO
        return Truth.of(all(consumer in matched for consumer in self.adapter.consumers(value)))

    def _index_expr(self, expr: ast.Index, env: Environment):
        return self._index(self.value(expr.base, env), self.value(expr.index, env))

    def _arithmetic_expr(self, expr: ast.Arithmetic, env: Environment):
        return _arithmetic(expr.operator, self.value(expr.left, env), self.value(expr.right, env))

    def _index(self, base, position):
        if base is UNKNOWN:
            return UNKNOWN
        if type(position) is not int:  # an int is what `%reps[axis]` gives nearly always
            if not is_literal(position) or position != int(position):
                return UNKNOWN
        if isinstance(base, OperandsExcept):
            base = base.materialize()
        if isinstance(base, tuple):  # the values a rest or variadic operand bound
            position = int(position)
            return base[position] if -len(base) <= position < len(base) else UNKNOWN
        if not isinstance(base, list):
            base = self._constant_list(base)
            if base is None:
                return UNKNOWN
        position = int(position)
        if not -len(base) <= position < len(base):
            return UNKNOWN
        return base[position]

    def _constant_list(self, value) -> list | None:
        # `%reps[axis]` is read once per axis; convert the constant once per
        # evaluation (constants do not change while conditions are evaluated).
        if value is ABSENT:
            return None
        cached = self._constants.get(id(value))
        if cached is None:
            constant = self.adapter.constant(value)
            cached = self._constants[id(value)] = (
                value, None if constant is None else np.asarray(constant).reshape(-1).tolist()
            )
        return cached[1]

    def _call(self, expr: ast.Call, env: Environment):
        arguments = [self.value(a, env) for a in expr.arguments]
        keywords = {name: self.value(a, env) for name, a in expr.keywords}
        if expr.function == "internal":  # needs the bindings, not just the adapter
            return self._internal(arguments[0], env)
        builtin = _BUILTINS.get(expr.function)
        if builtin is not None:
            if expr.function != "absent" and _missing_value(expr.function, arguments, keywords):
                # A graph-value parameter given an absent operand (or nothing known).
                return Truth.UNKNOWN if BUILTINS[expr.function].result is Type.BOOL else UNKNOWN
            return builtin(self.adapter, *arguments, **keywords)
        predicate = self.predicates[expr.function]
        result = predicate.function(self.context, *arguments)
        if isinstance(result, Truth):
            return result
        if result is None:
            return Truth.UNKNOWN
        return Truth.of(bool(result))


Evaluator._truth_of = {
    ast.And: Evaluator._and,
    ast.Or: Evaluator._or,
    ast.Not: Evaluator._not,
    ast.Compare: Evaluator._compare,
    ast.SameValue: Evaluator._same_value,
    ast.Matches: Evaluator._matches,
    ast.Quantifier: Evaluator._quantifier,
    ast.EveryUse: Evaluator._every_use,
}
Evaluator._value_of = {
    ast.ValueRef: Evaluator._value_ref,
    ast.Literal: Evaluator._literal,
    ast.NameRef: Evaluator._name_ref,
    ast.Index: Evaluator._index_expr,
    ast.Call: Evaluator._call,
    ast.ListExpr: Evaluator._list,
    ast.Conditional: Evaluator._conditional,
    ast.Comprehension: Evaluator._comprehension,
    ast.Arithmetic: Evaluator._arithmetic_expr,
}


# -------------------------------------------------------------------- helpers


# builtin -> (positions, keyword names) of its graph-value parameters; computed
# once, since every call of a builtin checks them.
_VALUE_PARAMETERS = {
    name: (
        tuple(i for i, p in enumerate(signature.positional) if p.type is Type.VALUE),
        tuple(n for n, p in signature.keywords.items() if p.type is Type.VALUE),
    )
    for name, signature in BUILTINS.items()
}


def _missing_value(function: str, arguments, keywords) -> bool:
    positions, names = _VALUE_PARAMETERS[function]
    for position in positions:
        if position < len(arguments):
            argument = arguments[position]
            if argument is ABSENT or argument is UNKNOWN or argument is None:
                return True
    for name in names:
        argument = keywords.get(name)
        if argument is ABSENT or argument is UNKNOWN:
            return True
    return False


def _equal(left, right) -> Truth:
    if isinstance(left, list) and isinstance(right, list):
        if len(left) != len(right):
            return Truth.NO
        result = Truth.YES
        for a, b in zip(left, right):
            result = result & _equal(a, b)
        return result
    if isinstance(left, Truth) and isinstance(right, Truth):
        if Truth.UNKNOWN in (left, right):
            return Truth.UNKNOWN
        return Truth.of(left is right)
    if isinstance(left, list) or isinstance(right, list):
        return Truth.UNKNOWN if UNKNOWN in (left, right) else Truth.NO
    return equal(left, right)


def _arithmetic(operator: str, left, right):
    if not (is_literal(left) and is_literal(right)):
        return UNKNOWN
    if operator == "+":
        return left + right
    if operator == "-":
        return left - right
    if operator == "*":
        return left * right
    if right == 0:
        return UNKNOWN
    quotient = left / right
    if isinstance(left, int) and isinstance(right, int) and left % right == 0:
        return left // right
    return quotient


def _shape(adapter: Adapter, value):
    if value is None or value is UNKNOWN or value is ABSENT or isinstance(value, (list, tuple)):
        return None
    return adapter.shape(value)


def _proven(adapter: Adapter, value, shape):
    """`shape`, or where it has a dim that is no literal, what the adapter can
    prove about it by following shape arithmetic (asked only then: it costs more)."""
    prove = getattr(adapter, "proven_shape", None)
    if prove is None or (shape is not None and all(is_literal(d) for d in shape)):
        return shape
    return prove(value)


def _axis(axis, rank: int):
    if type(axis) is int:
        return axis + rank if -rank <= axis < 0 else (axis if 0 <= axis < rank else None)
    if not is_literal(axis) or axis != int(axis):
        return None
    axis = int(axis)
    if axis < 0:
        axis += rank
    return axis if 0 <= axis < rank else None


def _rank(adapter, value):
    shape = _shape(adapter, value)
    if shape is None:
        shape = _proven(adapter, value, shape)
    return UNKNOWN if shape is None else len(shape)


def _dim(adapter, value, axis):
    shape = _shape(adapter, value)
    if shape is None:
        shape = _proven(adapter, value, shape)
        if shape is None:
            return UNKNOWN
    index = _axis(axis, len(shape))
    if index is None:
        return UNKNOWN
    dim = shape[index]
    if type(dim) is int or is_literal(dim):
        return dim
    return _proven(adapter, value, shape)[index]


def _shape_list(adapter, value):
    shape = _shape(adapter, value)
    shape = _proven(adapter, value, shape)
    return UNKNOWN if shape is None else list(shape)


def _axes(adapter, value):
    rank = _rank(adapter, value)
    return UNKNOWN if rank is UNKNOWN else list(range(rank))


def _aligned_dim(adapter, value, axis, of):
    offset = _aligned_offset(adapter, axis, of)
    return UNKNOWN if offset is None else _right_dim(adapter, value, offset)


def _aligned_offset(adapter, axis, of) -> int | None:
    """Where `axis` of `of` is counted from the right (1 for the last axis);
    None when `of`'s rank is unknown or it has no such axis."""
    reference = _shape(adapter, of)
    if reference is None:
        reference = _proven(adapter, of, reference)
    if reference is None:
        return None
    index = _axis(axis, len(reference))
    return None if index is None else len(reference) - index


def _right_dim(adapter, value, offset: int):
    """The dim of `value` `offset` axes from the right (1 beyond its rank): its
    dim aligned, numpy's way, with an axis that far from the right of another value."""
    shape = _shape(adapter, value)
    if shape is None:
        shape = _proven(adapter, value, shape)
    if shape is None:
        return UNKNOWN
    position = len(shape) - offset
    if position < 0:
        return 1
    dim = shape[position]
    if type(dim) is int or is_literal(dim):
        return dim
    return _proven(adapter, value, shape)[position]


def _constant(adapter, value):
    if value is None or value is UNKNOWN or value is ABSENT or isinstance(value, (list, tuple)):
        return None
    return adapter.constant(value)


def _absent(adapter, value):
    return Truth.of(value is ABSENT)


def _is_const(adapter, value):
    return Truth.of(_constant(adapter, value) is not None)


def _const(adapter, value):
    constant = _constant(adapter, value)
    return UNKNOWN if constant is None else np.asarray(constant).tolist()


def _is_symbolic(adapter, dim):
    if dim is UNKNOWN:
        return Truth.UNKNOWN
    return Truth.of(isinstance(dim, Symbol))


def _is_known(adapter, dim):
    return Truth.of(is_literal(dim) and not (isinstance(dim, float) and math.isnan(dim)))


def _dtype(adapter, value):
    if value is None or value is UNKNOWN or value is ABSENT:
        return UNKNOWN
    dtype = adapter.dtype(value)
    return UNKNOWN if dtype is None else dtype


def _use_count(adapter, value):
    return use_counter(adapter)(value)


def _one_use(adapter, value):
    # Counted up to 2: a value every layer reads is not listed to say it has more than one use.
    return Truth.of(use_counter(adapter)(value, 2) == 1 and not adapter.is_block_output(value))


def _block_output(adapter, value):
    return Truth.of(adapter.is_block_output(value))


def _is_input(adapter, value):
    if value is None or value is UNKNOWN or value is ABSENT or isinstance(value, (list, tuple, OperandsExcept)):
        return Truth.UNKNOWN
    return Truth.of(adapter.producer(value) is None)


def _same_block(adapter, value, other):
    if value is None or other is None:
        return Truth.NO
    return Truth.of(adapter.defining_block(value) == adapter.defining_block(other))


def _broadcasts(adapter, value):
    op = adapter.producer(value) if value is not None and value is not UNKNOWN else None
    if op is None:
        return Truth.NO
    broadcast_operands = getattr(adapter, "broadcast_operands", None)
    if broadcast_operands is None:
        return Truth.UNKNOWN
    return Truth.of(broadcast_operands(op) is not None)


def _op_type(adapter, value):
    op = adapter.producer(value) if value is not None else None
    return UNKNOWN if op is None else adapter.op_type(op)


def _attribute(adapter, value, name, default=None):
    # What the op sets; else what its schema says it has unset (the backend's
    # `attribute_default`); else the rule's own `default=`; else unknown.
    op = adapter.producer(value) if value is not None and value is not UNKNOWN else None
    if op is None or not isinstance(name, str):
        return UNKNOWN
    found = adapter.attribute(op, name)
    if found is None:
        schema_default = getattr(adapter, "attribute_default", None)
        if schema_default is not None:
            found = schema_default(op, name)
    if found is None:
        found = default
    return UNKNOWN if found is None else found


def _normalized_axes(adapter, axes, rank):
    if is_literal(axes):
        axes = [axes]
    if not isinstance(axes, list) or not is_literal(rank) or rank != int(rank):
        return UNKNOWN
    rank = int(rank)
    positions = set()
    for axis in axes:
        if not is_literal(axis) or axis != int(axis) or not -rank <= int(axis) < rank:
            return UNKNOWN
        positions.add(int(axis) % rank)
    return sorted(positions)


_NUMPY_TYPES = {
    "bool": np.bool_, "int8": np.int8, "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16,
    "int32": np.int32, "uint32": np.uint32, "int64": np.int64, "uint64": np.uint64,
    "fp16": np.float16, "fp32": np.float32, "fp64": np.float64,
}


def _zero_of(adapter, dtype):
    kind = _NUMPY_TYPES.get(dtype) if isinstance(dtype, str) else None
    return UNKNOWN if kind is None else kind(0)


def _lowest(adapter, dtype):
    if not isinstance(dtype, str):
        return UNKNOWN
    if dtype in ("fp16", "fp32", "fp64", "bf16"):
        return float("-inf")
    if dtype == "bool":
        return 0
    try:
        return int(np.iinfo(np.dtype(dtype)).min)
    except TypeError:
        return UNKNOWN


# bfloat16 has fp32's exponent and 8 bits of precision; numpy has no such type.
_BF16_MAX = float.fromhex("0x1.fep127")


def _finite_range(dtype) -> tuple[int | float, int | float] | None:
    """The most negative and the largest finite value of `dtype`, as Python numbers."""
    if not isinstance(dtype, str):
        return None
    if dtype == "bf16":
        return -_BF16_MAX, _BF16_MAX
    if dtype == "bool":
        return 0, 1
    kind = _NUMPY_TYPES.get(dtype)
    if kind is None:
        return None
    if np.issubdtype(kind, np.floating):
        info = np.finfo(kind)
        return float(info.min), float(info.max)
    info = np.iinfo(kind)
    return int(info.min), int(info.max)


def _max_finite(adapter, dtype):
    found = _finite_range(dtype)
    return UNKNOWN if found is None else found[1]


def _lowest_finite(adapter, dtype):
    found = _finite_range(dtype)
    return UNKNOWN if found is None else found[0]


def _max_of(adapter, items):
    flat = np.asarray(items, dtype=object).reshape(-1).tolist() if isinstance(items, list) else [items]
    if not flat or not all(is_literal(v) for v in flat):
        return UNKNOWN
    if any(isinstance(v, float) and math.isnan(v) for v in flat):
        return UNKNOWN
    return max(flat)


def _max_abs(adapter, items):
    """The largest |element| of a value's constant (read as one array, however big), or of
    a (nested) list or number; unknown with a NaN, an empty one, or no constant."""
    if isinstance(items, (list, int, float)) and not isinstance(items, bool):
        array = np.asarray(items, dtype=object).reshape(-1)
        if array.size == 0 or not all(is_literal(v) for v in array.tolist()):
            return UNKNOWN
        array = array.astype(np.float64)
    else:
        if items is None or items is UNKNOWN or items is ABSENT or isinstance(items, (tuple, OperandsExcept)):
            return UNKNOWN
        constant = adapter.constant(items)
        if constant is None:
            return UNKNOWN
        array = np.asarray(constant)
        if array.size == 0 or array.dtype.kind not in "biuf":
            return UNKNOWN
    if array.dtype.kind == "f" and np.isnan(array).any():
        return UNKNOWN
    return np.abs(array).max().item()


def _contains(adapter, items, item):
    if not isinstance(items, (list, tuple)):
        return Truth.UNKNOWN
    result = Truth.NO
    for element in items:
        result = result | _equal(element, item)
        if result is Truth.YES:
            break
    return result


def _gather(adapter, items, indices):
    if not isinstance(items, list) or not isinstance(indices, list):
        return UNKNOWN
    picked = []
    for index in indices:
        if not is_literal(index) or index != int(index) or not -len(items) <= int(index) < len(items):
            return UNKNOWN
        picked.append(items[int(index)])
    return picked


# dtype -> the dtypes that hold each of its values exactly.
_EXACT_IN = {
    "bool": {"bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
             "fp16", "bf16", "fp32", "fp64"},
    "int8": {"int8", "int16", "int32", "int64", "fp16", "fp32", "fp64"},
    "uint8": {"uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "fp16", "fp32", "fp64"},
    "int16": {"int16", "int32", "int64", "fp32", "fp64"},
    "uint16": {"uint16", "int32", "uint32", "int64", "uint64", "fp32", "fp64"},
    "int32": {"int32", "int64", "fp64"},
    "uint32": {"uint32", "int64", "uint64", "fp64"},
    "int64": {"int64"},
    "uint64": {"uint64"},
    "fp16": {"fp16", "fp32", "fp64"},
    "bf16": {"bf16", "fp32", "fp64"},
    "fp32": {"fp32", "fp64"},
    "fp64": {"fp64"},
}


def _represents(adapter, wide, narrow):
    if not isinstance(wide, str) or not isinstance(narrow, str):
        return Truth.UNKNOWN
    if narrow not in _EXACT_IN:
        return Truth.UNKNOWN
    return Truth.of(wide in _EXACT_IN[narrow])


def _len(adapter, items):
    return len(items) if isinstance(items, (list, tuple, OperandsExcept)) else UNKNOWN


# The longest list `range` makes: a rule reads lists of axes or builds a table
# of positions; one past this (a bound such as int32's maximum) is no list to hold.
RANGE_LIMIT = 1 << 20


def _range(adapter, stop):
    if not is_literal(stop) or stop != int(stop) or stop > RANGE_LIMIT:
        return UNKNOWN
    return list(range(int(stop)))


def _abs(adapter, x):
    return abs(x) if is_literal(x) else UNKNOWN


def _available(adapter, op_type):
    check = getattr(adapter, "op_available", None)
    if check is None or not isinstance(op_type, str):
        return Truth.UNKNOWN
    found = check(op_type)
    return Truth.UNKNOWN if found is None else Truth.of(found)


def _every_row_any(adapter, items):
    if not isinstance(items, list):
        return Truth.UNKNOWN
    rows = np.asarray(items, dtype=object)
    if rows.ndim == 0 or rows.size == 0:
        return Truth.UNKNOWN
    return Truth.of(bool(rows.astype(bool).any(axis=-1).all()))


def _sqrt(adapter, x):
    return math.sqrt(x) if is_literal(x) and x >= 0 else UNKNOWN


def _mod(adapter, x, y):
    if not (is_literal(x) and is_literal(y)) or y == 0:
        return UNKNOWN
    return x % y


def _flat_numbers(items) -> list | None:
    """The elements of a number or (nested) list, as Python numbers; None if any is not one."""
    flat = np.asarray(items, dtype=object).reshape(-1).tolist() if isinstance(items, list) else [items]
    if not all(is_literal(v) or isinstance(v, bool) for v in flat):
        return None
    return [float(v) for v in flat]


def _all_of(items, test) -> Truth:
    flat = _flat_numbers(items)
    if flat is None or not flat:
        return Truth.UNKNOWN
    return Truth.of(all(test(v) for v in flat))


def _is_nan(adapter, items):
    return _all_of(items, math.isnan)


def _is_inf(adapter, items):
    return _all_of(items, math.isinf)


def _is_finite(adapter, items):
    return _all_of(items, math.isfinite)


_FLOAT_TYPES = {"fp16": np.float16, "fp32": np.float32, "fp64": np.float64}


def _close(adapter, x, y, abs=0.0, rel=0.0, ulps=0, dtype=None):  # noqa: A002 - the rule's own names
    """|x - y| within the largest of the tolerances given (exactly equal when none is)."""
    if not (is_literal(x) and is_literal(y)):
        return Truth.UNKNOWN
    tolerances = (abs, rel, ulps)
    if not all(is_literal(t) and t >= 0 for t in tolerances):
        return Truth.UNKNOWN
    if math.isnan(x) or math.isnan(y):
        return Truth.NO
    if math.isinf(x) or math.isinf(y):
        return Truth.of(x == y)
    allowed = max(abs, rel * math.fabs(y))
    if ulps:
        kind = _FLOAT_TYPES.get(dtype) if isinstance(dtype, str) else None
        if kind is None:
            return Truth.UNKNOWN  # an ulp of no known float dtype
        allowed = max(allowed, ulps * float(np.spacing(kind(math.fabs(y)))))
    return Truth.of(math.fabs(x - y) <= allowed)


def _as_dtype(adapter, items, dtype):
    kind = _NUMPY_TYPES.get(dtype) if isinstance(dtype, str) else None
    flat = _flat_numbers(items)
    if kind is None or flat is None:
        return UNKNOWN
    return np.asarray(items, dtype=np.float64).astype(kind)


def _uniform(adapter, value):
    """The one number every element of `value` holds, read from a constant or a fill."""
    constant = _constant(adapter, value)
    if constant is not None:
        flat = np.asarray(constant).reshape(-1)
        if flat.size == 0 or flat.dtype.kind not in "biuf" or not (flat == flat[0]).all():
            return UNKNOWN
        return flat[0].item() if flat.dtype.kind != "b" else int(flat[0])
    fill_value = getattr(adapter, "fill_value", None)
    found = fill_value(value) if fill_value is not None else None
    return UNKNOWN if found is None else found


def _scaling_chain(adapter, value):
    """Walk down constant scalings from `value`: (the value scaled, the product of factors).

    Each step below the top must have no other use, so the chain can fold away.
    """
    scaling = getattr(adapter, "scaling", None)
    count_uses = use_counter(adapter)
    factor = 1.0
    current = value
    while scaling is not None:
        op = adapter.producer(current)
        step = scaling(op) if op is not None else None
        if step is None:
            break
        if current is not value and (count_uses(current, 2) != 1 or adapter.is_block_output(current)):
            break
        current, by = step
        factor *= by
    return current, factor


def _value_bounds(adapter, value) -> tuple:
    """(least, greatest) element of an integer or bool value, each None where unproved.

    The adapter's `value_bounds` follows producers; without one, only a
    constant has bounds. Floats have none: a NaN element is below and above
    every bound, and a proof that ignored it would let a rule fire on one.
    """
    if value is None or value is UNKNOWN or value is ABSENT or isinstance(value, (list, tuple)):
        return None, None
    proved = getattr(adapter, "value_bounds", None)
    if proved is not None:
        return proved(value)
    constant = adapter.constant(value)
    if constant is None:
        return None, None
    array = np.asarray(constant)
    if array.size == 0 or array.dtype.kind not in "biu":
        return None, None
    return int(array.min()), int(array.max())


def _lower_bound(adapter, value):
    least = _value_bounds(adapter, value)[0]
    return UNKNOWN if least is None else least


def _upper_bound(adapter, value):
    greatest = _value_bounds(adapter, value)[1]
    return UNKNOWN if greatest is None else greatest


def _elements(adapter, value):
    """The elements of an integer value, flattened, as proved for run time: a
    constant's, or what a backend's shape-value analysis follows (`shape`,
    slices, gathers, concats and arithmetic of dims: numbers and symbols)."""
    if value is None or value is UNKNOWN or value is ABSENT or isinstance(value, (list, tuple, OperandsExcept)):
        return UNKNOWN
    follow = getattr(adapter, "shape_value", None)
    items = follow(value) if follow is not None else None
    if items is not None:
        return list(items)
    constant = adapter.constant(value)
    if constant is None:
        return UNKNOWN
    array = np.asarray(constant)
    if array.dtype.kind not in "biu":
        return UNKNOWN
    return [int(v) for v in array.reshape(-1)]


def _dim_source(adapter, dim):
    find = getattr(adapter, "dim_source", None)
    if find is None or not isinstance(dim, Symbol):
        return None
    return find(dim)


def _input_of_dim(adapter, dim):
    source = _dim_source(adapter, dim)
    return UNKNOWN if source is None else source[0]


def _axis_of_dim(adapter, dim):
    source = _dim_source(adapter, dim)
    return UNKNOWN if source is None else source[1]


def _unscaled(adapter, value):
    return _scaling_chain(adapter, value)[0]


def _scale_of(adapter, value):
    return _scaling_chain(adapter, value)[1]


_BUILTINS: dict[str, Callable] = {
    "is_nan": _is_nan,
    "is_inf": _is_inf,
    "is_finite": _is_finite,
    "close": _close,
    "as_dtype": _as_dtype,
    "uniform": _uniform,
    "unscaled": _unscaled,
    "scale_of": _scale_of,
    "rank": _rank,
    "dim": _dim,
    "shape": _shape_list,
    "axes": _axes,
    "aligned_dim": _aligned_dim,
    "is_const": _is_const,
    "absent": _absent,
    "const": _const,
    "is_symbolic": _is_symbolic,
    "is_known": _is_known,
    "dtype": _dtype,
    "use_count": _use_count,
    "one_use": _one_use,
    "block_output": _block_output,
    "is_input": _is_input,
    "same_block": _same_block,
    "broadcasts": _broadcasts,
    "op_type": _op_type,
    "attribute": _attribute,
    "contains": _contains,
    "gather": _gather,
    "lowest": _lowest,
    "max_finite": _max_finite,
    "lowest_finite": _lowest_finite,
    "zero_of": _zero_of,
    "max_of": _max_of,
    "max_abs": _max_abs,
    "normalized_axes": _normalized_axes,
    "represents": _represents,
    "len": _len,
    "range": _range,
    "abs": _abs,
    "sqrt": _sqrt,
    "every_row_any": _every_row_any,
    "lower_bound": _lower_bound,
    "upper_bound": _upper_bound,
    "elements": _elements,
    "input_of_dim": _input_of_dim,
    "axis_of_dim": _axis_of_dim,
    "available": _available,
    "mod": _mod,
}
