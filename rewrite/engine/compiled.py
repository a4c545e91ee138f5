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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rewrite.engine.conditions import (
    _BUILTINS,
    _VALUE_PARAMETERS,
    Evaluator,
    _arithmetic,
    _binds,
    _equal,
    conjuncts,
    domain_list,
)
from rewrite.engine.logic import UNKNOWN, Truth, order
from rewrite.engine.matcher import ABSENT, Environment
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
    """Compiles conditions against one evaluator (its adapter, matcher, predicates, caches)."""

    def __init__(self, evaluator: Evaluator):
        self.evaluator = evaluator
        self._conjunctions: dict[int, tuple[list, Conjunction]] = {}

    def holds(self, exprs: list, env: Environment) -> Verdict:
        """What `Evaluator.holds` answers, without recording failures."""
        cached = self._conjunctions.get(id(exprs))
        if cached is None or cached[0] is not exprs:
            flat = [part for expr in exprs for part in conjuncts(expr)]
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
        adapter, matcher, pattern = self.evaluator.adapter, self.evaluator.matcher, expr.pattern

        def ways(env):
            value = subject(env)
            if value is None or value is UNKNOWN or value is ABSENT or isinstance(value, (list, tuple)):
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

    def _plain_quantifier(self, domain_of, variable, forall, filter_expr, body) -> TruthFunction:
        """A quantifier whose filter binds nothing: the same verdicts as the
        general one, with the filter a plain truth and the connectives unrolled."""
        keep = None if filter_expr is None else self.truth(filter_expr)

        def quantified(env):
            domain = domain_list(domain_of(env))
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

        return quantified

    def _every_use(self, expr: ast.EveryUse) -> TruthFunction:
        adapter, of, variable, body = self.evaluator.adapter, expr.of, expr.variable, self.truth(expr.body)

        def every(env):
            result = YES
            inner = dict(env)
            for consumer in adapter.consumers(env[of]):
                outputs = adapter.outputs(consumer)
                inner[variable] = outputs[0] if outputs else None
                result = result & body(inner)
                if result is NO:
                    return result
            return result

        return every

    # ---------------------------------------------------------------- values

    def value(self, expr) -> ValueFunction:
        kind = type(expr)
        evaluator = self.evaluator
        if kind is ast.Literal:
            constant = expr.value
            return lambda env: constant
        if kind is ast.ValueRef:
            var = expr.var
            return lambda env: env[var]
        if kind is ast.NameRef:
            name = expr.name
            named = NAMED_CONSTANTS.get(name, (None, None))[1]
            return lambda env: env[name] if name in env else named
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

    def call(env):
        a, b, c = first(env), second(env), third(env)
        if check_first and (a is ABSENT or a is UNKNOWN or a is None):
            return missing
        if check_second and (b is ABSENT or b is UNKNOWN or b is None):
            return missing
        if check_third and (c is ABSENT or c is UNKNOWN):  # None is a keyword's "not given"
            return missing
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
