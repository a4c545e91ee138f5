"""Structural matching of op patterns against a graph.

Matching is a generator of environments: an op pattern whose operands are
`in any order`, or that has a rest operand, can match one op in several
ways, and conditions later pick the first way that satisfies them.
Environments are plain dicts from `%var` to graph values (or tuples of
values for rest operands); a binding step copies before it extends.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from itertools import permutations

from rewrite.engine.interfaces import Adapter, Op, Value
from rewrite.language import ast

Environment = dict


class _Absent:
    """What `name=%v?` binds when the op has no such operand."""

    def __repr__(self) -> str:
        return "absent"


ABSENT = _Absent()


class Matcher:
    """Matches patterns of one dialect through an adapter."""

    def __init__(self, adapter: Adapter):
        self.adapter = adapter
        # id(pattern) -> (pattern, named operands, positional ones, the rest operand):
        # split once, not at every op tried.
        self._parts: dict[int, tuple] = {}

    def _split(self, pattern: ast.OpPattern) -> tuple:
        parts = self._parts.get(id(pattern))
        if parts is None or parts[0] is not pattern:
            operands = pattern.operands
            parts = (
                pattern,
                [o for o in operands if o.name is not None],
                [o for o in operands if o.name is None and not o.rest],
                next((o for o in operands if o.rest), None),
            )
            self._parts[id(pattern)] = parts
        return parts

    def match_op(self, pattern: ast.OpPattern, op: Op, env: Environment) -> Iterator[Environment]:
        """Every way `op` matches `pattern`, extending `env`."""
        if self.adapter.op_type(op) not in pattern.types:
            return
        named = self._split(pattern)[1]
        if named and pattern.any_order:
            # The listed values may sit in the listed slots in any arrangement.
            slots = [o.name for o in named]
            for arrangement in permutations(slots):
                moved = [replace(o, name=slot) for o, slot in zip(named, arrangement)]
                yield from self._match_named(moved, op, env)
            return
        if named:
            yield from self._match_named(named, op, env)
            return
        yield from self._match_positional(pattern, op, env)

    def _match_named(self, operands, op: Op, env: Environment) -> Iterator[Environment]:
        if not operands:
            yield env
            return
        first, rest = operands[0], operands[1:]
        value = self.adapter.operand(op, first.name)
        if value is None:
            if not first.optional:
                return
            value = ABSENT
        for extended in self.match_value(first.pattern, value, env):
            yield from self._match_named(rest, op, extended)

    def _match_positional(self, pattern: ast.OpPattern, op: Op, env: Environment):
        values = list(self.adapter.operands(op))
        _, _, patterns, rest = self._split(pattern)
        if len(patterns) > len(values) or (rest is None and len(patterns) != len(values)):
            return
        if len(patterns) == 1 and _is_bound(patterns[0].pattern, env):
            # `op(%bound, %rest...)`: the common shape (an op that uses a value
            # we hold, and its other operands) needs no permutations, only
            # the positions holding that value.
            bound = env[patterns[0].pattern.var]
            for position in range(len(values)) if pattern.any_order else (0,):
                if not _same(bound, values[position]):
                    continue
                if rest is None:
                    yield env
                else:
                    remaining = tuple(values[:position] + values[position + 1:])
                    yield from self.match_value(rest.pattern, remaining, env)
            return
        if pattern.any_order:
            orders = permutations(range(len(values)), len(patterns))
        else:
            orders = [tuple(range(len(patterns)))]
        for order in orders:
            taken = set(order)
            remaining = tuple(v for i, v in enumerate(values) if i not in taken)
            for extended in self._match_sequence(patterns, [values[i] for i in order], env):
                if rest is None:
                    yield extended
                else:
                    yield from self.match_value(rest.pattern, remaining, extended)

    def _match_sequence(self, operands, values, env: Environment) -> Iterator[Environment]:
        if not operands:
            yield env
            return
        for extended in self.match_value(operands[0].pattern, values[0], env):
            yield from self._match_sequence(operands[1:], values[1:], extended)

    def match_value(self, pattern, value, env: Environment) -> Iterator[Environment]:
        """Every way `value` (a graph value, or a tuple for a rest) matches `pattern`."""
        kind = type(pattern)
        if kind is ast.Wildcard:
            yield env
            return
        if kind is ast.OpPattern:
            yield from self._match_producer(pattern, value, env)
            return
        if pattern.var in env:
            if not _same(env[pattern.var], value):
                return
            extended = env
        else:
            extended = dict(env)
            extended[pattern.var] = value
        if pattern.producer is None:
            yield extended
        else:
            yield from self._match_producer(pattern.producer, value, extended)

    def _match_producer(self, pattern: ast.OpPattern, value: Value, env: Environment):
        if isinstance(value, tuple):
            return
        op = self.adapter.producer(value)
        if op is None:
            return
        yield from self.match_op(pattern, op, env)

    def match_rule(self, rule: ast.Rule, anchor: Op) -> Iterator[Environment]:
        """Every way the rule's `match` clauses fit, with `anchor` as the first."""
        outputs = self.adapter.outputs(anchor)
        if not outputs:
            return
        first = rule.matches[0]
        env = {first.var: outputs[0]}
        yield from self._match_clauses(rule.matches, 0, anchor, env)

    def _match_clauses(self, clauses, index: int, anchor: Op, env: Environment):
        if index == len(clauses):
            yield env
            return
        clause = clauses[index]
        if index == 0:
            candidates = self.match_op(clause.pattern, anchor, env)
        else:
            candidates = self._match_producer(clause.pattern, env[clause.var], env)
        for extended in candidates:
            yield from self._match_clauses(clauses, index + 1, anchor, extended)


def _is_bound(pattern, env: Environment) -> bool:
    """A plain `%v` (no producer pattern) that `env` already binds."""
    return type(pattern) is ast.Bind and pattern.producer is None and pattern.var in env


def _same(left, right) -> bool:
    if isinstance(left, tuple) or isinstance(right, tuple):
        return (
            isinstance(left, tuple)
            and isinstance(right, tuple)
            and len(left) == len(right)
            and all(a == b for a, b in zip(left, right))
        )
    return left == right
