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
        return lambda env: _then(test(env), rest, env)

    def _matches(self, expr: ast.Matches) -> Callable[[Environment], Any]:
        subject = self.value(expr.subject)
        adapter, matcher, pattern = self.evaluator.adapter, self.evaluator.matcher, expr.pattern

        def ways(env):
            value = subject(env)
            if value is None or value is UNKNOWN or isinstance(value, (list, tuple)):
                return ()
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
                return lambda env: _equal(left(env), right(env))
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
        keep = None if expr.filter is None else self.conjunction(conjuncts(expr.filter))
        body = self.truth(expr.body)

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


def _then(truth: Truth, rest: Conjunction, env: Environment) -> Verdict:
    """`truth and rest`, evaluated on: a later *no* still decides after an unknown."""
    if truth is YES:
        return rest(env)
    if truth is NO:
        return NO, None
    later, _ = rest(env)
    return (NO if later is NO else MAYBE), None
