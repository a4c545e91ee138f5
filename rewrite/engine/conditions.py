"""`where` conditions: one compiler from the checked AST to closures, in three-valued logic.

Numbers at run time are ints, floats, symbolic dims (`Term`s) or `UNKNOWN`; lists are
Python lists (or `UNKNOWN`); booleans are `Truth`. Anything that cannot be
read off the graph is `UNKNOWN`, and arithmetic or comparison with an
unknown stays unknown, so it can never make a rule fire.

A conjunction is evaluated left to right, and an unnegated `%v is op(...)`
in it binds for the conjuncts after it: the conjunction holds if some way
of matching makes the rest hold.

Each rule's conditions are compiled once (`Conditions`) into nested
closures; the driver, the rewriter, `explain`, `rewrite test` and `verify`
all decide with them. `explain` compiles them with a `Tracer`, which is
told of every verdict that is not yes where it is reached and changes none
(as the matcher's own trace does for patterns): there is no second
evaluator whose answers could drift from these.

`every use %u of %v: body` walks the uses of %v. Where the body reads
nothing but the use, %v and named constants, through builtins whose answers
a run does not change (`UseVerdicts`), its verdict is kept per value until
the value's uses change (`Adapter.uses_version`): a value feeding every
layer is walked once, not once per anchor that asks about it. Where it
compares one feature of the use with something of the anchor's, the
feature's counts over the uses are kept instead. Likewise, while the driver
runs, a quantifier over the operands of a wide op (a rest operand
`%others...` bound to an `operands.OperandsExcept` view) whose body compares
one feature of the element with something that does not depend on it, or
asks `other is %v`, is answered from the op's record: how many operands
have each value of that feature, counted once for the op and kept up to
date with every edit. The verdict is the one the loop would reach (Kleene's
`and` and `or` do not depend on order or repetition); only its cost no
longer grows with the op's width.

One module, though long: it is one compiler, a recursive set of `compile_*`
methods over one AST whose every node kind meets every other (a quantifier in a
comparison in a disjunction), with the tracer threaded through each; split by
node kind, each half would import the other's entry point.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter, methodcaller
from typing import Any, TypeGuard

import numpy as np

from rewrite.engine import builtins
from rewrite.engine.builtins import (
    _VALUE_PARAMETERS,
    _aligned_offset,
    _arithmetic,
    _dim,
    _dtype,
    _equal,
    _is_const,
    _op_type,
    _rank,
    _right_dim,
)
from rewrite.engine.interfaces import Adapter, Capability, has, use_counter, uses_versioner
from rewrite.engine.matcher import ABSENT, Environment, Matcher
from rewrite.engine.operands import Counts, OperandsExcept, OperandTable
from rewrite.language import ast
from rewrite.language.logic import UNKNOWN, Symbol, Term, Truth, is_literal, order
from rewrite.language.types import NAMED_CONSTANTS
from rewrite.predicates import Predicate, PredicateContext

YES, NO, MAYBE = Truth.YES, Truth.NO, Truth.UNKNOWN
Verdict = tuple  # (Truth, Environment | None)
Conjunction = Callable[[Environment], Verdict]
TruthFunction = Callable[[Environment], Truth]
ValueFunction = Callable[[Environment], Any]


def _missing(value) -> bool:
    return value is ABSENT or value is UNKNOWN or value is None


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
        if type(node) is ast.Call and (node.function not in builtins.REGISTRY or node.function == "internal"):
            return False
    return True


def cheap_first(items: list) -> list:
    """The conjuncts of a rule, each one that walks uses moved after the cheap ones
    that follow it (up to the next that binds or costs more).

    Kleene's `and` gives the same verdict in any order, and the conjuncts
    moved past bind nothing, so each reads what it read before; only a
    walk over thousands of uses is no longer made at an anchor that a
    cheap test refuses. Traced or not, conditions are decided in this
    order, so explain reports the failure apply met.
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


_STABLE_BUILTINS = builtins.STABLE  # a use's verdict is kept only over these (`UseVerdicts`)


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
    op) are the same for every anchor (`summary`, which
    `Conditions._over_uses` reads).

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
        constants, version_of = self._constants(expr), self.version_of
        # `constants` is None already where there is no `version_of`; checking both says so to the type checker.
        if constants is None or version_of is None or not constants.isdisjoint(env):
            return None
        tally = self._fresh((id(expr), value), value, lambda: UseTally(lambda consumer: judge(consumer, value)),
                            version_of)
        return None if tally is None else tally.verdict()

    def summary(self, key, value, make: Callable[[], Any]):
        """The summary named `key` of one feature over the uses of `value`: `make()`,
        to which each using op is added once; kept up to date (see the class
        docstring); None where it cannot be kept or counted."""
        if self.version_of is None:
            return None
        return self._fresh((key, value), value, make, self.version_of)

    def _fresh(self, key, value, make, version_of: Callable[[Any], int]):
        if value is None or value is ABSENT or value is UNKNOWN or isinstance(value, (list, tuple, OperandsExcept)):
            return None
        try:
            found = self._kept.get(key)
        except TypeError:  # a value that is no key
            return None
        version = version_of(value)
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
        version_of = self.version_of
        # Nothing is kept without `version_of`.
        if not self._of_value or version_of is None:
            return []
        pending = []
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
        if version_of is None:  # then `before` kept nothing pending
            return
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


class Tracer:
    """What `explain` wants to know of a failed decision: the innermost part that failed first.

    Passed to `Conditions` when the conditions are compiled, it makes the
    compiled closures report, at the points where a verdict that is not yes
    is reached, the failing part, its truth, the bindings in force (the
    quantifier variables and uses being examined) and, for a comparison,
    the values of its two sides. The closures decide exactly as without it:
    the tracer only listens. What fails inside a quantifier's filter, a
    comprehension's condition or a kept verdict's judgement is no failure to
    report (an element left out is not one), so the tracer is paused there.
    """

    def __init__(self):
        self.failure: Failure | None = None
        self.scope: list[tuple[str, Any]] = []  # quantifier variables and uses in force, innermost last
        self.paused = 0

    def reset(self) -> None:
        self.failure = None
        self.scope.clear()
        self.paused = 0

    def fail(self, expr, truth: Truth, env: Environment, extra: tuple = (), sides=None) -> None:
        """`expr` had `truth` (not yes) in `env`; the first such report of a decision is kept.
        `sides(env)`, for a comparison, gives the values of its two sides."""
        if self.failure is not None or self.paused:
            return
        self.failure = Failure(expr, truth, tuple(self.scope) + extra, dict(env), None if sides is None else sides(env))


class Conditions:
    """`where` conditions compiled once into closures, for one program: the engine's one semantics.

    Every caller decides with these closures: the driver (`holds`), the
    rewriter and explain (`value` of an expression), examples and verify
    through them. `explain` compiles the same conditions with a `Tracer`,
    which adds reports and changes no verdict (tests/engine run every
    condition of the shipped rules both ways). Builtins are those of
    `rewrite.engine.builtins`; the user's predicates come from `predicates`.

    With a `table` (the driver's records of wide ops), patterns are matched
    through it, a rest operand in `lazy_rests` binds a view of a wide op's
    operands, and quantifiers over such a view, or over a value's uses, are
    answered from kept summaries (the same verdicts as walking them).
    A traced compilation walks instead, to name the element that failed.
    """

    def __init__(self, adapter: Adapter, matcher: Matcher, predicates: dict[str, Predicate], *,
                 table: OperandTable | None = None, lazy_rests: frozenset[int] = frozenset(),
                 tracer: Tracer | None = None, use_verdicts: UseVerdicts | None = None):
        self.adapter = adapter
        self.predicates = predicates
        self.context = PredicateContext(adapter)
        self.table = table
        self.tracer = tracer
        if table is not None:
            matcher = Matcher(adapter, table, lazy_rests, matcher.budget)
        self.matcher = matcher
        self.use_verdicts = use_verdicts if use_verdicts is not None else UseVerdicts(adapter)
        # What closures read of the graph beyond builtins. They hold it, never this object:
        # these caches hold the closures, and a cycle would outlive the run.
        self._reader = _Reader(adapter)
        self._conjunctions: dict[int, tuple[list, Conjunction]] = {}
        self._values: dict[int, tuple[Any, ValueFunction]] = {}
        self._truths: dict[int, tuple[Any, TruthFunction]] = {}

    # ---------------------------------------------------------------- entry points

    def holds(self, exprs: list, env: Environment) -> Verdict:
        """Whether the conjunction of `exprs` (in `cheap_first` order) holds in `env`:
        (its truth, and on yes the environment that made it hold)."""
        cached = self._conjunctions.get(id(exprs))
        if cached is None or cached[0] is not exprs:
            flat = cheap_first([part for expr in exprs for part in conjuncts(expr)])
            cached = (exprs, self.conjunction(flat))
            self._conjunctions[id(exprs)] = cached
        self._reader.constants.clear()
        if self.tracer is not None:
            self.tracer.reset()
        return cached[1](env)

    @property
    def failure(self) -> Failure | None:
        """Why the last `holds` did not hold (traced compilations only)."""
        return None if self.tracer is None else self.tracer.failure

    def value(self, expr, env: Environment) -> Any:
        """The value of `expr` in `env` (compiled on first use)."""
        cached = self._values.get(id(expr))
        if cached is None or cached[0] is not expr:
            cached = self._values[id(expr)] = (expr, self.compile_value(expr))
        return cached[1](env)

    def truth(self, expr, env: Environment) -> Truth:
        """The truth of `expr` in `env` (compiled on first use)."""
        cached = self._truths.get(id(expr))
        if cached is None or cached[0] is not expr:
            cached = self._truths[id(expr)] = (expr, self.compile_truth(expr))
        return cached[1](env)

    # ---------------------------------------------------------------- conjunctions

    def conjunction(self, items: list) -> Conjunction:
        """items[0] and items[1] and ...; each item's bindings flow to the rest."""
        if not items:
            return lambda env: (YES, env)
        head, rest_items = items[0], items[1:]
        kind = type(head)
        tracer = self.tracer
        if kind is ast.And:
            return self.conjunction(conjuncts(head) + rest_items)
        if kind is ast.Or and _binds(head):
            # (a or b) and rest is (a and rest) or (b and rest): each side binds for the rest in turn.
            left = self.conjunction(conjuncts(head.left) + rest_items)
            right = self.conjunction(conjuncts(head.right) + rest_items)

            def either(env):
                truth, final = left(env)
                if truth is YES:
                    return truth, final
                other, final = right(env)
                if other is YES:
                    return other, final
                return truth | other, None

            return either
        rest = self.conjunction(rest_items)
        if kind is ast.SameValue and not head.negated:
            # `expr is %new` names what expr is, for what follows.
            subject, var, same = self.compile_value(head.left), head.var, self.compile_truth(head)

            def named(env):
                if var not in env:
                    value = subject(env)
                    if _missing(value) or isinstance(value, (list, tuple)):
                        if tracer is not None:
                            tracer.fail(head, MAYBE, env)
                        return MAYBE, None
                    return rest({**env, var: value})
                truth = same(env)
                if truth is not YES and tracer is not None:
                    tracer.fail(head, truth, env)
                return _then(truth, rest, env)

            return named
        if kind is ast.Matches and not head.negated:
            # Existential over the ways the pattern matches: the first way that makes the rest hold wins.
            match = self._ways(head)

            def matched(env):
                best = NO
                for extended in match(env):
                    truth, final = rest(extended)
                    if truth is YES:
                        return truth, final
                    best = best | truth
                if best is NO and tracer is not None:
                    tracer.fail(head, NO, env)
                return best, None

            return matched
        test = self.compile_truth(head)
        sides = self._sides(head)
        if not rest_items:
            # The last conjunct: no call for an empty rest.
            def last(env):
                truth = test(env)
                if truth is YES:
                    return truth, env
                if tracer is not None:
                    tracer.fail(head, truth, env, sides=sides)
                return truth, None

            return last

        def step(env):
            truth = test(env)
            if truth is YES:
                return rest(env)
            if tracer is not None:
                tracer.fail(head, truth, env, sides=sides)
            if truth is NO:
                return NO, None
            later, _ = rest(env)  # a later *no* still decides after an unknown
            return (NO if later is NO else MAYBE), None

        return step

    def _sides(self, expr):
        """For a traced comparison, the function of an environment to the values of its two sides."""
        if self.tracer is None or type(expr) is not ast.Compare:
            return None
        left, right = self.compile_value(expr.left), self.compile_value(expr.right)
        return lambda env: (left(env), right(env))

    def _ways(self, expr: ast.Matches) -> Callable[[Environment], Any]:
        """The environments in which `expr`'s subject is produced by an op its pattern matches."""
        subject = self.compile_value(expr.subject)
        adapter, matcher, pattern = self.adapter, self.matcher, expr.pattern

        def ways(env):
            value = subject(env)
            if (value is None or value is UNKNOWN or value is ABSENT
                    or isinstance(value, (list, tuple, OperandsExcept))):
                return ()  # an absent optional operand is produced by no op
            op = adapter.producer(value)
            if op is None:
                return ()
            return matcher.match_op(pattern, op, env)

        return ways

    # ---------------------------------------------------------------- truth

    def compile_truth(self, expr) -> TruthFunction:
        """`expr` as a function of an environment to its `Truth`."""
        kind = type(expr)
        if kind is ast.Compare:
            left, right, operator = self.compile_value(expr.left), self.compile_value(expr.right), expr.operator
            if operator == "==":
                def equals(env):
                    a, b = left(env), right(env)
                    if type(a) is int and type(b) is int:  # most dims: no three-valued detour
                        return YES if a == b else NO
                    return _equal(a, b)

                return equals
            if operator == "!=":
                return lambda env: ~_equal(left(env), right(env))
            return lambda env: order(operator, left(env), right(env))
        if kind is ast.And:
            conjunction = self.conjunction(conjuncts(expr))
            return lambda env: conjunction(env)[0]
        if kind is ast.Or:
            left, right = self.compile_truth(expr.left), self.compile_truth(expr.right)

            def either(env):
                first = left(env)
                return first if first is YES else first | right(env)

            return either
        if kind is ast.Not:
            operand = self.compile_truth(expr.operand)
            return lambda env: ~operand(env)
        if kind is ast.SameValue:
            subject, var, negated = self.compile_value(expr.left), expr.var, expr.negated

            def same(env):
                if var not in env:  # binding is for conjunctions; under `not` it decides nothing
                    return MAYBE
                truth = Truth.of(subject(env) == env[var])
                return ~truth if negated else truth

            return same
        if kind is ast.Matches:
            ways, negated = self._ways(expr), expr.negated

            def matches(env):
                found = Truth.of(any(True for _ in ways(env)))
                return ~found if negated else found

            return matches
        if kind is ast.Quantifier:
            return self._quantifier(expr)
        if kind is ast.EveryUse:
            return self._every_use(expr)
        value = self.compile_value(expr)

        def as_truth(env):
            result = value(env)
            if isinstance(result, Truth):
                return result
            if isinstance(result, bool):
                return Truth.of(result)
            return MAYBE

        return as_truth

    def _quantifier(self, expr: ast.Quantifier) -> TruthFunction:
        domain_of, variable, forall = self.compile_value(expr.domain), expr.variable, expr.kind == "forall"
        body = self.compile_truth(expr.body)
        if self.tracer is not None:
            return self._traced_quantifier(expr, domain_of, body, self.tracer)
        summarized = self._over_operands(expr) if self.table is not None and expr.filter is None else None
        if summarized is not None:
            general = self._plain_quantifier(None, variable, forall, None, body)

            def over_operands(env):
                domain = domain_of(env)
                if type(domain) is OperandsExcept:
                    found = summarized(domain, env)
                    if found is not None:
                        return found
                return general(env, domain)

            return over_operands
        if expr.filter is None or not _binds(expr.filter):
            return self._plain_quantifier(domain_of, variable, forall, expr.filter, body)
        keep = self.conjunction(conjuncts(expr.filter))

        def quantified(env):
            domain = domain_list(domain_of(env))
            if domain is None:
                return MAYBE
            result = YES if forall else NO
            inner = dict(env)
            for element in domain:
                inner[variable] = element
                selected, scope = keep(inner)
                if selected is NO:
                    continue
                result = _with_element(forall, result, selected, _filtered_body(body, inner, scope))
                if result is (NO if forall else YES):
                    return result
            return result

        return quantified

    def _traced_quantifier(self, expr: ast.Quantifier, domain_of, body, tracer: Tracer) -> TruthFunction:
        """The general quantifier, reporting to `tracer` the first element whose body fails."""
        variable, forall = expr.variable, expr.kind == "forall"
        keep = None if expr.filter is None else self.conjunction(conjuncts(expr.filter))
        sides = self._sides(expr.body)

        def quantified(env):
            domain = domain_list(domain_of(env))
            if domain is None:
                return MAYBE
            result = YES if forall else NO
            inner = dict(env)
            for element in domain:
                inner[variable] = element
                tracer.scope.append((variable, element))
                try:
                    selected, scope = YES, inner
                    if keep is not None:
                        # A filter that fails only skips this element; it is no failure to report.
                        tracer.paused += 1
                        try:
                            selected, scope = keep(inner)
                        finally:
                            tracer.paused -= 1
                    if selected is NO:
                        continue
                    holds = _filtered_body(body, inner, scope)
                finally:
                    tracer.scope.pop()
                if holds is not YES:
                    tracer.fail(expr.body, holds, scope or inner, ((variable, element),), sides)
                result = _with_element(forall, result, selected, holds)
                if result is (NO if forall else YES):
                    return result
            if forall and result is not YES:
                tracer.fail(expr, result, env)
            return result

        return quantified

    def _over_operands(self, expr: ast.Quantifier):
        """`forall/exists x in %rest: body` answered from the record of the op whose
        operands `%rest` views, for the bodies that only ask about one feature of x;
        None for any other body. The function returns None when it cannot answer
        (the feature's arguments have no summary), and the loop runs instead."""
        variable, forall, body = expr.variable, expr.kind == "forall", expr.body
        if type(body) is ast.SameValue and type(body.left) is ast.NameRef and body.left.name == variable:
            var, negated = body.var, body.negated

            def same(view: OperandsExcept, env):
                total = len(view)
                if var not in env:
                    return _verdict(forall, 0, total, 0)
                found = view.count(env[var])
                if negated:
                    return _verdict(forall, total - found, 0, found)
                return _verdict(forall, found, 0, total - found)

            return same
        compiled = self._feature_comparison(body, variable)
        if compiled is None:
            return None
        feature_of, other_of, operator, compare = compiled

        def compared(view: OperandsExcept, env):
            feature = feature_of(env)
            if feature is None:
                return None
            rhs = other_of(env)
            total = len(view)
            key, function = feature
            if key is _CONSTANT:  # the same for every operand
                return (YES if forall else NO) if not total else compare(function, rhs)
            try:
                summary = view.record.summary(key, lambda: Counts(function))
            except TypeError:  # an argument that cannot name a summary
                return None
            if summary is None:
                return None
            return _verdict(forall, *_tally(summary, summary.of[view.excluded], total, rhs, operator, compare))

        return compared

    def _feature_comparison(self, body, variable: str):
        """For a body `feature(x, ...) <op> other` (either way round), x the quantified
        variable and nothing else reading it: (the feature's summary key and function
        for an environment, the other side, the operator, the comparison with the
        feature on its side); None for any other body."""
        if type(body) is not ast.Compare:
            return None
        if _feature_call(body.left, variable) and not _mentions(body.right, variable):
            call, other, feature_left = body.left, body.right, True
        elif _feature_call(body.right, variable) and not _mentions(body.left, variable):
            call, other, feature_left = body.right, body.left, False
        else:
            return None
        canonical, adapter = _FEATURES[call.function], self.adapter
        arguments = [self.compile_value(argument) for argument in call.arguments[1:]]
        keywords = [(name, self.compile_value(argument)) for name, argument in call.keywords]

        def feature_of(env):
            return canonical(adapter, *[a(env) for a in arguments], **{n: a(env) for n, a in keywords})

        return feature_of, self.compile_value(other), body.operator, _comparison(body.operator, feature_left)

    def _over_uses(self, expr: ast.EveryUse):
        """`every use %u of %v: feature(%u, ...) <op> other`, `other` and the
        feature's arguments not reading %u, answered from the feature's counts
        over the uses of %v (`UseVerdicts.summary`), which every anchor asking
        about %v shares; None for any other body. The function returns None
        when it cannot answer, and the uses are walked instead."""
        compiled = self._feature_comparison(expr.body, expr.variable)
        if compiled is None:
            return None
        feature_of, other_of, operator, compare = compiled
        adapter, verdicts = self.adapter, self.use_verdicts

        def of_use(function):
            # A use without an output reads as the call of a missing value: unknown.
            def feature(consumer):
                outputs = adapter.outputs(consumer)
                return function(outputs[0]) if outputs else UNKNOWN

            return feature

        def counted(value, env):
            feature = feature_of(env)
            if feature is None:
                return None
            key, function = feature
            if key is _CONSTANT:
                return None  # the same for every use: the walk costs one comparison a use
            summary = verdicts.summary(key, value, lambda: Counts(of_use(function)))
            if summary is None:
                return None
            total = sum(summary.counts.values())
            return _verdict(True, *_tally(summary, _NOTHING, total, other_of(env), operator, compare))

        return counted

    def _plain_quantifier(self, domain_of, variable, forall, filter_expr, body):
        """A quantifier whose filter binds nothing: the same verdicts as the
        general one, with the filter a plain truth and the connectives unrolled.
        Without `domain_of`, the function takes the domain after the environment."""
        keep = None if filter_expr is None else self.compile_truth(filter_expr)

        def over(env, domain):
            domain = domain_list(domain)
            if domain is None:
                return MAYBE
            unsure = False
            inner = dict(env)
            for element in domain:
                inner[variable] = element
                selected = YES if keep is None else keep(inner)
                if selected is NO:
                    continue
                if selected is YES:
                    holds = body(inner)
                else:
                    try:
                        holds = body(inner)
                    except KeyError:  # as in the general form: unknown
                        holds = MAYBE
                    # An element that may not be in the domain counts as
                    # forall's (~selected | holds) or exists' (selected & holds).
                    if forall:
                        holds = YES if holds is YES else MAYBE
                    else:
                        holds = NO if holds is NO else MAYBE
                if holds is YES:
                    if not forall:
                        return YES
                elif holds is NO:
                    if forall:
                        return NO
                else:
                    unsure = True
            if unsure:
                return MAYBE
            return YES if forall else NO

        if domain_of is None:
            return over
        return lambda env: over(env, domain_of(env))

    def _every_use(self, expr: ast.EveryUse) -> TruthFunction:
        adapter, of, variable, body = self.adapter, expr.of, expr.variable, self.compile_truth(expr.body)
        verdicts, tracer = self.use_verdicts, self.tracer

        def judge(consumer, value):
            """The body at one use of `value`: what a kept tally records."""
            outputs = adapter.outputs(consumer)
            if tracer is not None:
                tracer.paused += 1
            try:
                return body({of: value, variable: outputs[0] if outputs else None})
            finally:
                if tracer is not None:
                    tracer.paused -= 1

        if tracer is not None:
            sides = self._sides(expr.body)

            def walk_traced(value, env):
                result = YES
                inner = dict(env)
                for consumer in adapter.consumers(value):
                    outputs = adapter.outputs(consumer)
                    inner[variable] = outputs[0] if outputs else None
                    tracer.scope.append((variable, consumer))
                    try:
                        truth = body(inner)
                    finally:
                        tracer.scope.pop()
                    if truth is not YES:
                        tracer.fail(expr.body, truth, inner, ((variable, consumer),), sides)
                    result = result & truth
                    if result is NO:
                        return result
                return result

            def traced(env):
                value = env[of]
                # A kept yes has no failure to report; any other verdict walks, to name the use.
                if verdicts.keeps(expr) and verdicts.verdict(expr, value, env, judge) is YES:
                    return YES
                return walk_traced(value, env)

            return traced

        def walk(value, env):
            result = YES
            inner = dict(env)
            for consumer in adapter.consumers(value):
                outputs = adapter.outputs(consumer)
                inner[variable] = outputs[0] if outputs else None
                result = result & body(inner)
                if result is NO:
                    return result
            return result

        if not verdicts.keeps(expr):
            summarized = self._over_uses(expr)
            if summarized is None:
                return lambda env: walk(env[of], env)

            def counted(env):
                value = env[of]
                found = summarized(value, env)
                return walk(value, env) if found is None else found

            return counted

        def every(env):
            value = env[of]
            kept = verdicts.verdict(expr, value, env, judge)
            return walk(value, env) if kept is None else kept

        return every

    # ---------------------------------------------------------------- values

    def compile_value(self, expr) -> ValueFunction:
        """`expr` as a function of an environment to its value."""
        kind = type(expr)
        if kind is ast.Literal:
            constant = expr.value
            return lambda env: constant
        # Bindings are read at nearly every step: by callables that run in C,
        # not a Python frame each.
        if kind is ast.ValueRef:
            return itemgetter(expr.var)  # env[var]
        if kind is ast.NameRef:
            named = NAMED_CONSTANTS.get(expr.name, (None, None))[1]
            return methodcaller("get", expr.name, named)  # env[name] if bound, else the constant
        if kind is ast.ListExpr:
            items = [self.compile_value(item) for item in expr.items]
            return lambda env: [item(env) for item in items]
        if kind is ast.Index:
            base, position, index = self.compile_value(expr.base), self.compile_value(expr.index), self._reader.index
            return lambda env: index(base(env), position(env))
        if kind is ast.Arithmetic:
            left, right, operator = self.compile_value(expr.left), self.compile_value(expr.right), expr.operator
            return lambda env: _arithmetic(operator, left(env), right(env))
        if kind is ast.Conditional:
            condition = self.compile_truth(expr.condition)
            then, otherwise = self.compile_value(expr.then), self.compile_value(expr.otherwise)
            return lambda env: then(env) if condition(env) is YES else otherwise(env)
        if kind is ast.Comprehension:
            return self._comprehension(expr)
        if kind is ast.Call:
            return self._call(expr)
        return self.compile_truth(expr)

    def _comprehension(self, expr: ast.Comprehension) -> ValueFunction:
        domain_of, variable, item = self.compile_value(expr.domain), expr.variable, self.compile_value(expr.item)
        keep = None if expr.keep is None else self.compile_truth(expr.keep)
        tracer = self.tracer

        def comprehension(env):
            domain = domain_list(domain_of(env))
            if domain is None:
                return UNKNOWN
            inner = dict(env)
            items = []
            if tracer is not None:
                tracer.paused += 1  # an element left out is no failure to report
            try:
                for element in domain:
                    inner[variable] = element
                    if keep is None or keep(inner) is YES:
                        items.append(item(inner))
            finally:
                if tracer is not None:
                    tracer.paused -= 1
            return items

        return comprehension

    def _call(self, expr: ast.Call) -> ValueFunction:
        arguments = [self.compile_value(a) for a in expr.arguments]
        keywords = [(name, self.compile_value(a)) for name, a in expr.keywords]
        if expr.function == "internal":  # needs the bindings, not just the adapter
            (argument,) = arguments
            internal = self._reader.internal
            return lambda env: internal(argument(env), env)
        found = builtins.REGISTRY.get(expr.function)
        if found is None:
            predicate, context = self.predicates[expr.function], self.context

            def predicated(env):
                result = predicate.function(context, *[a(env) for a in arguments])
                if isinstance(result, Truth):
                    return result
                return MAYBE if result is None else Truth.of(bool(result))

            return predicated
        builtin, adapter = found.function, self.adapter
        positions, names = _VALUE_PARAMETERS[expr.function]
        if expr.function == "absent":
            positions, names = (), ()
        positions = tuple(p for p in positions if p < len(arguments))
        missing = builtins.missing_result(expr.function)
        if expr.function == "broadcasts" and self.table is not None and len(arguments) == 1 and not keywords:
            return self._broadcasts(arguments[0], _fixed_call(builtin, adapter, arguments, positions, missing),
                                    self.table)
        if not keywords and len(arguments) <= 3:
            return _fixed_call(builtin, adapter, arguments, positions, missing)
        if len(keywords) == 1 and len(arguments) == 2:
            return _fixed_keyword_call(builtin, adapter, arguments, positions, keywords[0], names, missing)

        def call(env):
            values = [argument(env) for argument in arguments]
            for position in positions:
                if _missing(values[position]):
                    return missing
            if not keywords:
                return builtin(adapter, *values)
            given = {name: argument(env) for name, argument in keywords}
            for name in names:
                value = given.get(name)
                if value is ABSENT or value is UNKNOWN:
                    return missing
            return builtin(adapter, *values, **given)

        return call

    def _broadcasts(self, argument: ValueFunction, general: ValueFunction, table: OperandTable) -> ValueFunction:
        """`broadcasts(%u)`, read from the record of a wide op (in `table`): asked once
        of the adapter, whose answer lists every operand."""
        adapter = self.adapter
        if not has(adapter, Capability.BROADCASTING):
            return general  # unknown, the builtin says
        builtin = builtins.function_of("broadcasts")

        def broadcasts(env):
            value = argument(env)
            if value is None or value is UNKNOWN or value is ABSENT or isinstance(value, (list, tuple, OperandsExcept)):
                return general(env)
            if table.active:
                op = adapter.producer(value)
                record = table.records.get(op)
                if record is not None:
                    return Truth.of(table.broadcasting(record)[0])
            return builtin(adapter, value)

        return broadcasts

class _Reader:
    """What compiled conditions read of the graph besides builtins: indexing, `internal`."""

    __slots__ = ("adapter", "constants")

    def __init__(self, adapter: Adapter):
        self.adapter = adapter
        # id(value) -> (value, its constant as a flat list), for one decision (constants
        # do not change while conditions are decided); the value is kept so its id stays its own.
        self.constants: dict[int, tuple[Any, list | None]] = {}

    def internal(self, value, env: Environment) -> Truth:
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

    def index(self, base, position):
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
            base = self.constant_list(base)
            if base is None:
                return UNKNOWN
        position = int(position)
        if not -len(base) <= position < len(base):
            return UNKNOWN
        return base[position]

    def constant_list(self, value) -> list | None:
        # `%reps[axis]` is read once per axis; convert the constant once per decision.
        if value is ABSENT:
            return None
        cached = self.constants.get(id(value))
        if cached is None:
            constant = self.adapter.constant(value)
            cached = self.constants[id(value)] = (
                value, None if constant is None else np.asarray(constant).reshape(-1).tolist()
            )
        return cached[1]




def _with_element(forall: bool, result: Truth, selected: Truth, holds: Truth) -> Truth:
    """A quantifier's verdict so far, with one more element the filter `selected` and the body `holds` for:
    forall's `and` of (~selected | holds), exists' `or` of (selected & holds)."""
    return result & (~selected | holds) if forall else result | (selected & holds)


def _filtered_body(body: TruthFunction, inner: Environment, scope: Environment | None) -> Truth:
    """The body for an element a binding filter selected: in the filter's bindings; where the
    filter was unknown it bound nothing, and a body needing its bindings is unknown too."""
    if scope is not None:
        return body(scope)
    try:
        return body(inner)
    except KeyError:
        return MAYBE


# ---------------------------------------------------------------- quantifiers over a wide op's operands

_CONSTANT = object()


def _feature_rank(adapter, *arguments, **keywords):
    return None if arguments or keywords else (("rank",), lambda value: _rank(adapter, value))


def _feature_dim(adapter, *arguments, **keywords):
    if len(arguments) != 1 or keywords:
        return None
    axis = arguments[0]
    # Keyed by the axis's type too: True == 1 as a key, but `dim(x, true)` is unknown.
    return ("dim", type(axis), axis), lambda value: _dim(adapter, value, axis)


def _feature_aligned_dim(adapter, *arguments, **keywords):
    if len(arguments) != 1 or set(keywords) != {"of"}:
        return None
    of = keywords["of"]
    if of is ABSENT or of is UNKNOWN:
        return _CONSTANT, UNKNOWN  # what the call gives for a missing value
    if of is None or isinstance(of, (list, tuple, OperandsExcept)):
        return None
    offset = _aligned_offset(adapter, arguments[0], of)
    if offset is None:
        return _CONSTANT, UNKNOWN
    # Only where the axis sits from the right matters: every anchor asking
    # about that offset shares one summary.
    return ("right_dim", offset), lambda value: _right_dim(adapter, value, offset)


def _feature_of(name: str, function):
    def feature(adapter, *arguments, **keywords):
        if arguments or keywords:
            return None
        return (name,), lambda value: function(adapter, value)

    return feature


# builtin -> (adapter, the call's other arguments) -> (summary key, the feature of
# an operand), or (_CONSTANT, the value every operand gets), or None (no
# summary: loop). Only builtins that read a value's own type or producer,
# which do not change during a run: a use count would.
_FEATURES = {
    "rank": _feature_rank,
    "dim": _feature_dim,
    "aligned_dim": _feature_aligned_dim,
    "dtype": _feature_of("dtype", _dtype),
    "is_const": _feature_of("is_const", _is_const),
    "op_type": _feature_of("op_type", _op_type),
}


def _feature_call(expr, variable: str) -> TypeGuard[ast.Call]:
    """`f(x, ...)` of a summarized builtin, x the quantified variable (a name, or
    a `%u` of every use), and nothing else reading x."""
    return (
        type(expr) is ast.Call
        and expr.function in _FEATURES
        and bool(expr.arguments)
        and _names(expr.arguments[0], variable)
        and not any(_mentions(argument, variable) for argument in expr.arguments[1:])
        and not any(_mentions(argument, variable) for _, argument in expr.keywords)
    )


def _names(node, variable: str) -> bool:
    kind = type(node)
    return (kind is ast.NameRef and node.name == variable) or (kind is ast.ValueRef and node.var == variable)


def _mentions(expr, name: str) -> bool:
    return any(_names(node, name) for node in ast.walk(expr))


_NOTHING = object()  # the operand a summary over uses leaves out: none



def _comparison(operator: str, feature_left: bool):
    """The compiled comparison's verdict, the feature on its side."""
    if operator == "==":
        return lambda feature, other: _equal(feature, other)
    if operator == "!=":
        return lambda feature, other: ~_equal(feature, other)
    if feature_left:
        return lambda feature, other: order(operator, feature, other)
    return lambda feature, other: order(operator, other, feature)


def _looked_up(value) -> bool:
    """Whether `==` with `value` is YES exactly for the dictionary keys equal to it."""
    kind = type(value)
    if kind is int or kind is bool or kind is str or kind is Symbol:
        return True
    return isinstance(value, Term) or (kind is float and value == value)


def _tally(summary: Counts, excluded, total: int, rhs, operator: str, compare) -> tuple[int, int, int]:
    """How many of the view's operands make the comparison yes, unknown and no."""
    counts = summary.counts
    if operator in ("==", "!=") and (rhs is UNKNOWN or _looked_up(rhs)):
        if rhs is UNKNOWN:
            yes, maybe, no = 0, total, 0  # equal to nothing known
        else:
            hit = counts.get(rhs, 0)
            if hit and (excluded is rhs or excluded == rhs):
                hit -= 1
            if isinstance(rhs, Term):
                yes, maybe, no = hit, total - hit, 0  # another symbol, a number, an unknown: unknown
            else:
                vague = summary.vague - (1 if isinstance(excluded, Term) or excluded is UNKNOWN else 0)
                yes, maybe, no = hit, vague, total - hit - vague
        return (no, maybe, yes) if operator == "!=" else (yes, maybe, no)
    # Any other comparison: once per distinct value of the feature.
    yes = maybe = no = 0
    skipped = False
    for key, count in counts.items():
        if not skipped and (key is excluded or key == excluded):
            count -= 1
            skipped = True
        if count <= 0:
            continue
        truth = compare(key, rhs)
        if truth is YES:
            yes += count
        elif truth is NO:
            no += count
        else:
            maybe += count
    return yes, maybe, no


def _verdict(forall: bool, yes: int, maybe: int, no: int) -> Truth:
    """Kleene's `and` (forall) or `or` (exists) of that many yes, unknown and no."""
    if forall:
        return NO if no else (MAYBE if maybe else YES)
    return YES if yes else (MAYBE if maybe else NO)


def lazy_rests(rules) -> frozenset[int]:
    """The rest operands (by id of their pattern) that may bind a view of a wide op's operands.

    Those of `where` patterns whose variable the rule binds once and reads
    only as a quantifier's or comprehension's domain, or with `len`: what
    reads a view as it reads the tuple. A rest the rewrite builds with, or
    compares, or binds twice, keeps its tuple.
    """
    found: set[int] = set()
    for rule in rules:
        rests: dict[str, list] = {}
        binds: dict[str, int] = {}
        for pattern in _patterns(rule):
            for operand, node in _operands(pattern):
                if type(node) is ast.Bind:
                    binds[node.var] = binds.get(node.var, 0) + 1
                    if operand.rest and node.producer is None:
                        rests.setdefault(node.var, []).append(node)
        if not rests:
            continue
        unsafe: set[str] = set()
        for condition in rule.conditions:
            _reads(condition.expr, unsafe, safe=False)
        for action in rule.actions:
            # A rewrite reads a rest after conditions are decided, once ops
            # may be edited: it keeps its tuple, even as a domain.
            _reads(action, unsafe, safe=False)
            unsafe.update(node.var for node in ast.walk(action) if type(node) is ast.ValueRef)
        for clause in rule.matches:
            unsafe.add(clause.var)
        for var, nodes in rests.items():
            if binds.get(var) == 1 and var not in unsafe:
                found.update(id(node) for node in nodes)
    return frozenset(found)


def _patterns(rule):
    """Every op pattern of a rule: its match clauses' and those of its conditions."""
    pending = [clause.pattern for clause in rule.matches]
    pending += [node.pattern for condition in rule.conditions for node in ast.walk(condition.expr)
                if type(node) is ast.Matches]
    while pending:
        pattern = pending.pop()
        yield pattern
        for operand in pattern.operands:
            node = operand.pattern
            inner = node if type(node) is ast.OpPattern else getattr(node, "producer", None)
            if inner is not None:
                pending.append(inner)


def _operands(pattern: ast.OpPattern):
    for operand in pattern.operands:
        yield operand, operand.pattern


def _reads(node, unsafe: set[str], safe: bool) -> None:
    """Add to `unsafe` every variable `node` reads other than as a domain (or `len`'s argument)."""
    kind = type(node)
    if kind is ast.ValueRef:
        if not safe:
            unsafe.add(node.var)
        return
    if kind is ast.Quantifier or kind is ast.Comprehension:
        _reads(node.domain, unsafe, safe=True)
        for name in ("filter", "body", "item", "keep"):
            if hasattr(node, name):
                _reads(getattr(node, name), unsafe, safe=False)
        return
    if kind is ast.Call and node.function == "len" and len(node.arguments) == 1 and not node.keywords:
        _reads(node.arguments[0], unsafe, safe=True)
        return
    if isinstance(node, tuple):
        for item in node:
            _reads(item, unsafe, safe=False)
        return
    if not hasattr(node, "__dataclass_fields__") or isinstance(node, (ast.Span, ast.OpPattern)):
        return
    for name in node.__dataclass_fields__:
        item = getattr(node, name)
        if name in ("var", "of", "target", "within") and isinstance(item, str) and kind is not ast.Bind:
            unsafe.add(item)  # `is %v`, `every use of %v`, `%v -> ...`, `in %v`, a rebuild of %v
        elif name != "span":
            _reads(item, unsafe, safe=False)


def _fixed_call(builtin, adapter, arguments: list, positions: tuple, missing) -> ValueFunction:
    """A builtin call of one to three positional arguments, unrolled: the
    same checks as the general form without its lists and loops."""
    checked = [position in positions for position in range(3)]
    if len(arguments) == 1:
        (first,) = arguments
        check = checked[0]

        def call1(env):
            a = first(env)
            if check and (a is ABSENT or a is UNKNOWN or a is None):
                return missing
            return builtin(adapter, a)

        return call1
    if len(arguments) == 2:
        first, second = arguments
        check_first, check_second = checked[0], checked[1]

        def call2(env):
            a, b = first(env), second(env)
            if check_first and (a is ABSENT or a is UNKNOWN or a is None):
                return missing
            if check_second and (b is ABSENT or b is UNKNOWN or b is None):
                return missing
            return builtin(adapter, a, b)

        return call2
    if len(arguments) == 3:
        first, second, third = arguments

        def call3(env):
            values = (first(env), second(env), third(env))
            for position in positions:
                if _missing(values[position]):
                    return missing
            return builtin(adapter, *values)

        return call3

    def call0(env):
        return builtin(adapter)

    return call0


def _fixed_keyword_call(builtin, adapter, arguments, positions, keyword, names, missing) -> ValueFunction:
    """`f(a, b, name=c)`, unrolled like `_fixed_call`."""
    first, second = arguments
    check_first, check_second = 0 in positions, 1 in positions
    name, third = keyword
    check_third = name in names
    # `aligned_dim(x, axis, of=%e)`: where the keyword is the builtin's next
    # parameter it is passed as one, without a dict of keywords per call.
    parameters = list(inspect.signature(builtin).parameters)
    positional = len(parameters) >= 4 and parameters[3] == name

    def call(env):
        a, b, c = first(env), second(env), third(env)
        if check_first and (a is ABSENT or a is UNKNOWN or a is None):
            return missing
        if check_second and (b is ABSENT or b is UNKNOWN or b is None):
            return missing
        if check_third and (c is ABSENT or c is UNKNOWN):  # None is a keyword's "not given"
            return missing
        if positional:
            return builtin(adapter, a, b, c)
        return builtin(adapter, a, b, **{name: c})

    return call


def _then(truth: Truth, rest: Conjunction, env: Environment) -> Verdict:
    """`truth and rest`, evaluated on: a later *no* still decides after an unknown."""
    if truth is YES:
        return rest(env)
    if truth is NO:
        return NO, None
    later, _ = rest(env)
    return (NO if later is NO else MAYBE), None
