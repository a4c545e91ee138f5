"""Conditions compiled to closures, for the driver's hot path.

`Evaluator` in conditions.py interprets the AST and records why a condition
failed, which `rewrite explain` needs. Deciding whether a rule fires needs
only the verdict and the bindings, and then walking the AST again for every
candidate anchor is most of the cost: dispatching on node types, flattening
the same `and`s, recording failures no one reads. So each rule's conditions
are compiled once into nested closures with the interpreter's semantics
(three-valued, left to right, a pattern binding for what follows it, an
`or` that binds tried side by side) and none of that overhead.

The tests run every condition both ways (tests/engine/test_conditions.py).

While the driver runs, a quantifier over the operands of a wide op (a rest
operand `%others...` bound to an `operands.OperandsExcept` view) whose body
compares one feature of the element (`rank(other)`, `aligned_dim(other, axis,
of=%e)`, `dtype(other)`, ...) with something that does not depend on it, or
asks `other is %v`, is answered from the op's record: how many operands have
each value of that feature, counted once for the op and kept up to date with
every edit. The verdict is the one the loop would reach (Kleene's `and` and
`or` do not depend on order or repetition); only its cost no longer grows
with the op's width.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from operator import itemgetter, methodcaller
from typing import Any

from rewrite.engine.conditions import (
    _BUILTINS,
    _VALUE_PARAMETERS,
    Evaluator,
    _aligned_offset,
    _arithmetic,
    _binds,
    _dim,
    _dtype,
    _equal,
    _is_const,
    _op_type,
    _rank,
    _right_dim,
    cheap_first,
    conjuncts,
    domain_list,
)
from rewrite.engine.logic import UNKNOWN, Symbol, Truth, order
from rewrite.engine.matcher import ABSENT, Environment, Matcher
from rewrite.engine.operands import Counts, OperandsExcept, OperandTable
from rewrite.language import ast
from rewrite.language.types import BUILTINS, NAMED_CONSTANTS, Type

YES, NO, MAYBE = Truth.YES, Truth.NO, Truth.UNKNOWN
Verdict = tuple  # (Truth, Environment | None)
Conjunction = Callable[[Environment], Verdict]
TruthFunction = Callable[[Environment], Truth]
ValueFunction = Callable[[Environment], Any]


def _missing(value) -> bool:
    return value is ABSENT or value is UNKNOWN or value is None


class CompiledConditions:
    """Compiles conditions against one evaluator (its adapter, matcher, predicates, caches).

    With a `table` (the driver's), patterns are matched through it, a rest
    operand in `lazy_rests` binds a view of a wide op's operands, and
    quantifiers over such a view are answered from the op's record.
    """

    def __init__(self, evaluator: Evaluator, table: OperandTable | None = None,
                 lazy_rests: frozenset[int] = frozenset()):
        self.evaluator = evaluator
        self.table = table
        shared = evaluator.matcher
        self.matcher = shared if table is None else Matcher(evaluator.adapter, table, lazy_rests, shared.budget)
        self._conjunctions: dict[int, tuple[list, Conjunction]] = {}

    def holds(self, exprs: list, env: Environment) -> Verdict:
        """What `Evaluator.holds` answers, without recording failures."""
        cached = self._conjunctions.get(id(exprs))
        if cached is None or cached[0] is not exprs:
            flat = cheap_first([part for expr in exprs for part in conjuncts(expr)])
            cached = (exprs, self.conjunction(flat))
            self._conjunctions[id(exprs)] = cached
        self.evaluator._constants.clear()
        return cached[1](env)

    # ---------------------------------------------------------------- conjunctions

    def conjunction(self, items: list) -> Conjunction:
        """items[0] and items[1] and ...; each item's bindings flow to the rest."""
        if not items:
            return lambda env: (YES, env)
        head, rest_items = items[0], items[1:]
        kind = type(head)
        if kind is ast.And:
            return self.conjunction(conjuncts(head) + rest_items)
        if kind is ast.Or and _binds(head):
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
            subject, var, same = self.value(head.left), head.var, self.truth(head)

            def named(env):
                if var not in env:
                    value = subject(env)
                    if _missing(value) or isinstance(value, (list, tuple)):
                        return MAYBE, None
                    return rest({**env, var: value})
                return _then(same(env), rest, env)

            return named
        if kind is ast.Matches and not head.negated:
            match = self._matches(head)

            def matched(env):
                best = NO
                for extended in match(env):
                    truth, final = rest(extended)
                    if truth is YES:
                        return truth, final
                    best = best | truth
                return best, None

            return matched
        test = self.truth(head)
        if not rest_items:
            # The last conjunct: no call for an empty rest.
            def last(env):
                truth = test(env)
                return (truth, env) if truth is YES else (truth, None)

            return last

        def step(env):
            truth = test(env)
            if truth is YES:
                return rest(env)
            if truth is NO:
                return NO, None
            later, _ = rest(env)  # a later *no* still decides after an unknown
            return (NO if later is NO else MAYBE), None

        return step

    def _matches(self, expr: ast.Matches) -> Callable[[Environment], Any]:
        subject = self.value(expr.subject)
        adapter, matcher, pattern = self.evaluator.adapter, self.matcher, expr.pattern

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

    def truth(self, expr) -> TruthFunction:
        kind = type(expr)
        if kind is ast.Compare:
            left, right, operator = self.value(expr.left), self.value(expr.right), expr.operator
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
            left, right = self.truth(expr.left), self.truth(expr.right)

            def either(env):
                first = left(env)
                return first if first is YES else first | right(env)

            return either
        if kind is ast.Not:
            operand = self.truth(expr.operand)
            return lambda env: ~operand(env)
        if kind is ast.SameValue:
            subject, var, negated = self.value(expr.left), expr.var, expr.negated

            def same(env):
                if var not in env:
                    return MAYBE
                truth = Truth.of(subject(env) == env[var])
                return ~truth if negated else truth

            return same
        if kind is ast.Matches:
            ways, negated = self._matches(expr), expr.negated

            def matches(env):
                found = Truth.of(any(True for _ in ways(env)))
                return ~found if negated else found

            return matches
        if kind is ast.Quantifier:
            return self._quantifier(expr)
        if kind is ast.EveryUse:
            return self._every_use(expr)
        value = self.value(expr)

        def as_truth(env):
            result = value(env)
            if isinstance(result, Truth):
                return result
            if isinstance(result, bool):
                return Truth.of(result)
            return MAYBE

        return as_truth

    def _quantifier(self, expr: ast.Quantifier) -> TruthFunction:
        domain_of, variable, forall = self.value(expr.domain), expr.variable, expr.kind == "forall"
        body = self.truth(expr.body)
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
                selected, scope = YES, inner
                if keep is not None:
                    selected, scope = keep(inner)
                if selected is NO:
                    continue
                if scope is None:
                    try:
                        holds = body(inner)
                    except KeyError:  # the body needs what an unknown filter did not bind
                        holds = MAYBE
                else:
                    holds = body(scope)
                if forall:
                    result = result & (~selected | holds)
                    if result is NO:
                        return result
                else:
                    result = result | (selected & holds)
                    if result is YES:
                        return result
            return result

        return quantified

    def _over_operands(self, expr: ast.Quantifier):
        """`forall/exists x in %rest: body` answered from the record of the op whose
        operands `%rest` views, for the bodies that only ask about one feature of x;
        None for any other body. The function returns None when it cannot answer
        (the feature's arguments have no summary), and the loop runs instead."""
        variable, forall, body = expr.variable, expr.kind == "forall", expr.body
        kind = type(body)
        if kind is ast.SameValue and type(body.left) is ast.NameRef and body.left.name == variable:
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
        canonical, adapter = _FEATURES[call.function], self.evaluator.adapter
        arguments = [self.value(argument) for argument in call.arguments[1:]]
        keywords = [(name, self.value(argument)) for name, argument in call.keywords]

        def feature_of(env):
            return canonical(adapter, *[a(env) for a in arguments], **{n: a(env) for n, a in keywords})

        return feature_of, self.value(other), body.operator, _comparison(body.operator, feature_left)

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
        adapter, verdicts = self.evaluator.adapter, self.evaluator.use_verdicts

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
        keep = None if filter_expr is None else self.truth(filter_expr)

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
        adapter, of, variable, body = self.evaluator.adapter, expr.of, expr.variable, self.truth(expr.body)
        verdicts = self.evaluator.use_verdicts

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

        def judge(consumer, value):
            outputs = adapter.outputs(consumer)
            return body({of: value, variable: outputs[0] if outputs else None})

        def every(env):
            value = env[of]
            kept = verdicts.verdict(expr, value, env, judge)
            return walk(value, env) if kept is None else kept

        return every

    # ---------------------------------------------------------------- values

    def value(self, expr) -> ValueFunction:
        kind = type(expr)
        evaluator = self.evaluator
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
            items = [self.value(item) for item in expr.items]
            return lambda env: [item(env) for item in items]
        if kind is ast.Index:
            base, position = self.value(expr.base), self.value(expr.index)
            return lambda env: evaluator._index(base(env), position(env))
        if kind is ast.Arithmetic:
            left, right, operator = self.value(expr.left), self.value(expr.right), expr.operator
            return lambda env: _arithmetic(operator, left(env), right(env))
        if kind is ast.Conditional:
            condition, then, otherwise = self.truth(expr.condition), self.value(expr.then), self.value(expr.otherwise)
            return lambda env: then(env) if condition(env) is YES else otherwise(env)
        if kind is ast.Comprehension:
            return self._comprehension(expr)
        if kind is ast.Call:
            return self._call(expr)
        truth = self.truth(expr)
        return truth

    def _comprehension(self, expr: ast.Comprehension) -> ValueFunction:
        domain_of, variable, item = self.value(expr.domain), expr.variable, self.value(expr.item)
        keep = None if expr.keep is None else self.truth(expr.keep)

        def comprehension(env):
            domain = domain_list(domain_of(env))
            if domain is None:
                return UNKNOWN
            inner = dict(env)
            items = []
            for element in domain:
                inner[variable] = element
                if keep is None or keep(inner) is YES:
                    items.append(item(inner))
            return items

        return comprehension

    def _call(self, expr: ast.Call) -> ValueFunction:
        evaluator = self.evaluator
        arguments = [self.value(a) for a in expr.arguments]
        keywords = [(name, self.value(a)) for name, a in expr.keywords]
        if expr.function == "internal":  # needs the bindings, not just the adapter
            (argument,) = arguments
            return lambda env: evaluator._internal(argument(env), env)
        builtin = _BUILTINS.get(expr.function)
        if builtin is None:
            predicate = evaluator.predicates[expr.function]

            def predicated(env):
                result = predicate.function(evaluator.context, *[a(env) for a in arguments])
                if isinstance(result, Truth):
                    return result
                return MAYBE if result is None else Truth.of(bool(result))

            return predicated
        adapter = evaluator.adapter
        positions, names = _VALUE_PARAMETERS[expr.function]
        if expr.function == "absent":
            positions, names = (), ()
        positions = tuple(p for p in positions if p < len(arguments))
        missing = MAYBE if BUILTINS[expr.function].result is Type.BOOL else UNKNOWN
        if expr.function == "broadcasts" and self.table is not None and len(arguments) == 1 and not keywords:
            return self._broadcasts(arguments[0], _fixed_call(builtin, adapter, arguments, positions, missing))

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


    def _broadcasts(self, argument: ValueFunction, general: ValueFunction) -> ValueFunction:
        """`broadcasts(%u)`, read from the record of a wide op: asked once of the
        adapter, whose answer lists every operand."""
        table, adapter = self.table, self.evaluator.adapter
        if getattr(adapter, "broadcast_operands", None) is None:
            return general  # unknown, the builtin says
        builtin = _BUILTINS["broadcasts"]

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


def _feature_call(expr, variable: str) -> bool:
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
    return kind is float and value == value


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
            if type(rhs) is Symbol:
                yes, maybe, no = hit, total - hit, 0  # another symbol, a number, an unknown: unknown
            else:
                vague = summary.vague - (1 if type(excluded) is Symbol or excluded is UNKNOWN else 0)
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
