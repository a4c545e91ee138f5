"""Structural matching of op patterns against a graph.

Matching is a generator of environments: an op pattern whose operands are
`in any order`, or that has a rest operand, can match one op in several
ways, and conditions later pick the first way that satisfies them.
Environments are plain dicts from `%var` to graph values (or tuples of
values for rest operands); a binding step copies before it extends.

`Matcher.mismatch` says why a rule does not match: it matches again with a
trace that keeps the failure that got furthest (the innermost sub-pattern,
and the ops on the way to it). The trace costs a test of one attribute at
a few places when off, so deciding pays nearly nothing for it.

Positional operands are assigned one sub-pattern at a time, each to an
operand not yet taken, backtracking on failure: an order whose first
sub-pattern fails is never completed, a sub-pattern that reads no earlier
binding and matches no operand ends the search, and the ways a sub-pattern
matches one operand are kept for the other orders that ask again. What is
still left to try is bounded: with a `Budget`, each operand tried for a
sub-pattern (and each arrangement of named operands) is one attempt, and
past `MATCH_BUDGET` attempts for one anchor `MatchBudgetExceeded` ends the
match. Not firing is always sound; the driver counts and reports it.

One module, though long: matching and the explanation of a mismatch are the
same walk (the trace is a flag on it), so that `explain` can never describe a
different matcher than the one `apply` runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from itertools import permutations
from typing import Any

from rewrite.engine.interfaces import Adapter, Op, Value
from rewrite.engine.operands import OperandsExcept, OperandTable
from rewrite.language import ast

Environment = dict


class _Absent:
    """What `name=%v?` binds when the op has no such operand."""

    def __repr__(self) -> str:
        return "absent"


ABSENT = _Absent()

# Structural attempts one rule may make at one anchor: each operand tried
# for a positional sub-pattern, each arrangement of named operands in any
# order, each environment handed to the conditions. Three plain sub-patterns
# over 32 operands in any order are 29,760 orders; shipped rules stay far
# below this at every anchor of the test models.
MATCH_BUDGET = 4096


class MatchBudgetExceeded(Exception):
    """Matching one rule at one anchor took more than its budget of attempts."""

    def __init__(self, limit: int):
        self.limit = limit
        super().__init__(f"more than {limit} structural attempts")


class Budget:
    """The attempts one rule has made at the anchor being decided (see `MATCH_BUDGET`).

    Shared by the matchers a driver decides with. It counts only between
    `start` and `stop`: a rewrite, once decided, is never cut short.
    """

    __slots__ = ("limit", "spent", "running")

    def __init__(self, limit: int = MATCH_BUDGET):
        if limit < 1:
            raise ValueError(f"a match budget must be at least 1, not {limit}")
        self.limit = limit
        self.spent = 0
        self.running = False

    def start(self) -> None:
        self.spent = 0
        self.running = True

    def stop(self) -> None:
        self.running = False

    def spend(self) -> None:
        """One more attempt; raises `MatchBudgetExceeded` past the limit."""
        if self.running:
            self.spent += 1
            if self.spent > self.limit:
                raise MatchBudgetExceeded(self.limit)


_UNBOUND = object()  # a memo key's slot for a variable not bound yet


@dataclass(frozen=True)
class Mismatch:
    """Where matching a rule got furthest before it failed.

    `pattern` is the sub-pattern that failed (an `OpPattern`, `Bind` or
    `Operand`, each with its span); `reason` says what the graph has there
    instead. `path` leads from the clause's op down to it, as (operand, op)
    steps: the operand's name (or position) and the op it belongs to. For a
    `match` clause after the first, `subject` is the value its name had.
    """

    clause: ast.MatchClause | None
    pattern: Any
    reason: str
    path: tuple[tuple[str, Op], ...]
    subject: Any = None


class _Trace:
    """What `Matcher.mismatch` records while matching one rule."""

    def __init__(self, rule: ast.Rule):
        # id(node) -> (the op pattern it is an operand of, the value pattern
        # whose slot leads to it); and id(node) -> depth from its clause's op.
        self.parents: dict[int, tuple[ast.OpPattern, Any]] = {}
        self.depth: dict[int, int] = {}
        self.clauses: dict[int, ast.MatchClause] = {}
        self.anchor = rule.anchor
        for clause in rule.matches:
            self.clauses[id(clause.pattern)] = clause
            self._walk(clause.pattern, 0)
        # Where matching is now: the op each op pattern is being matched
        # against, and the operand each value pattern stands at. A pattern
        # node has one place in its tree, so the latest entry is the one
        # being matched when a failure below it is recorded.
        self.ops: dict[int, Op] = {}
        self.slots: dict[int, str] = {}
        self.best: Mismatch | None = None
        self._score: tuple[int, int] = (-1, -1)

    def _walk(self, pattern: ast.OpPattern, depth: int) -> None:
        self.depth[id(pattern)] = depth
        for operand in pattern.operands:
            node = operand.pattern
            self.parents[id(node)] = (pattern, node)
            self.depth[id(node)] = depth + 1
            inner = node if type(node) is ast.OpPattern else getattr(node, "producer", None)
            if inner is not None:
                if inner is not node:
                    self.parents[id(inner)] = (pattern, node)
                self._walk(inner, depth + 1)

    def fail(self, node, reason: str, env: Environment, at=None) -> None:
        """Keep this failure if it got further than any so far: more bindings, then deeper.

        `at` is the pattern node whose place the path leads to (default: `node`).
        """
        at = node if at is None else at
        score = (len(env), self.depth.get(id(at), 0))
        if score <= self._score:
            return
        self._score = score
        path = []
        current = at
        while id(current) in self.parents:
            parent, slot_node = self.parents[id(current)]
            path.append((self.slots.get(id(slot_node), "?"), self.ops.get(id(parent))))
            current = parent
        path.reverse()
        clause = self.clauses.get(id(current))
        subject = env.get(clause.var) if clause is not None and clause is not self.anchor else None
        self.best = Mismatch(clause, node, reason, tuple(path), subject)


class Matcher:
    """Matches patterns of one dialect through an adapter.

    With an `OperandTable` (the driver's, while it runs), an op with more
    operands than `operands.WIDE` is matched through its record: the positions
    of a bound value are looked up, not searched for, and a rest operand whose
    pattern is in `lazy_rests` (by id) binds an `OperandsExcept` view instead
    of a copy of the other operands. Either way the bindings mean the same.
    """

    def __init__(self, adapter: Adapter, table: OperandTable | None = None, lazy_rests: frozenset[int] = frozenset(),
                 budget: Budget | None = None):
        self.adapter = adapter
        self.table = table
        self.lazy_rests = lazy_rests
        self.budget = budget
        # id(pattern) -> (pattern, named operands, positional ones, the rest operand,
        # `_plain_names` of the positional ones): split once, not at every op tried.
        self._parts: dict[int, tuple] = {}
        # id(pattern) -> (pattern, `_flat_operands` of it), for the anchor's clause.
        self._flat: dict[int, tuple] = {}
        # id(pattern) -> (pattern, the variables each positional operand pattern reads or binds).
        self._variables: dict[int, tuple] = {}
        self._trace: _Trace | None = None  # only while `mismatch` runs

    def _split(self, pattern: ast.OpPattern) -> tuple:
        parts = self._parts.get(id(pattern))
        if parts is None or parts[0] is not pattern:
            operands = pattern.operands
            positional = [o for o in operands if o.name is None and not o.rest]
            parts = (
                pattern,
                [o for o in operands if o.name is not None],
                positional,
                next((o for o in operands if o.rest), None),
                _plain_names(positional),
            )
            self._parts[id(pattern)] = parts
        return parts

    def mismatch(self, rule: ast.Rule, anchor: Op) -> Mismatch | None:
        """Why `rule` does not match at `anchor`: the failure that got furthest.

        None if it does match. Tries every way, so it costs what a full
        failed match costs; meant for explaining, not for deciding.
        """
        self._trace = trace = _Trace(rule)
        budget = self.budget
        if budget is not None:
            budget.start()
        try:
            for _ in self.match_rule(rule, anchor):
                return None
        except MatchBudgetExceeded:
            pass  # the furthest failure found within the budget
        finally:
            self._trace = None
            if budget is not None:
                budget.stop()
        return trace.best

    def match_op(self, pattern: ast.OpPattern, op: Op, env: Environment) -> Iterator[Environment]:
        """Every way `op` matches `pattern`, extending `env`."""
        trace = self._trace
        if trace is not None:
            trace.ops[id(pattern)] = op
        if self.adapter.op_type(op) not in pattern.types:
            if trace is not None:
                trace.fail(pattern, f"it is {self._op(op)}, not {_expected(pattern)}", env)
            return
        named = self._split(pattern)[1]
        if named and pattern.any_order:
            # The listed values may sit in the listed slots in any arrangement.
            slots = [o.name for o in named]
            budget = self.budget
            for arrangement in permutations(slots):
                if budget is not None:
                    budget.spend()
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
        trace = self._trace
        if value is None:
            if not first.optional:
                if trace is not None:
                    parent = trace.parents.get(id(first.pattern), (None,))[0]
                    trace.fail(first, f"{self._op(op)} has no operand '{first.name}'", env, at=parent)
                return
            value = ABSENT
        if trace is not None:
            trace.slots[id(first.pattern)] = first.name
        for extended in self.match_value(first.pattern, value, env):
            yield from self._match_named(rest, op, extended)

    def _match_positional(self, pattern: ast.OpPattern, op: Op, env: Environment):
        _, _, patterns, rest, plain = self._split(pattern)
        trace = self._trace
        table = self.table
        if table is not None and trace is None and table.active:
            record = table.records.get(op)
            if record is None:
                values = list(self.adapter.operands(op))
                if len(values) > table.wide:
                    record = table.make(op, values)
            if record is not None:
                yield from self._match_wide(pattern, record, patterns, rest, env)
                return
        else:
            values = list(self.adapter.operands(op))
        if len(patterns) > len(values) or (rest is None and len(patterns) != len(values)):
            if trace is not None:
                wanted = f"{'at least ' if rest is not None else ''}{len(patterns)}"
                trace.fail(pattern, f"{self._op(op)} has {len(values)} operand(s), the pattern {wanted}", env)
            return
        if len(patterns) == 1 and _is_bound(patterns[0].pattern, env):
            # `op(%bound, %rest...)`: the common shape (an op that uses a value
            # we hold, and its other operands) needs no permutations, only
            # the positions holding that value.
            bound = env[patterns[0].pattern.var]
            if trace is not None and not any(
                _same(bound, values[position]) for position in (range(len(values)) if pattern.any_order else (0,))
            ):
                where = "any operand" if pattern.any_order else "its first operand"
                trace.fail(patterns[0], f"{self._value(bound)} is not {where} of {self._op(op)}", env, at=pattern)
            for position in range(len(values)) if pattern.any_order else (0,):
                if not _same(bound, values[position]):
                    continue
                if trace is not None and rest is not None:
                    trace.slots[id(rest.pattern)] = "rest"
                if rest is None:
                    yield env
                else:
                    remaining = tuple(values[:position] + values[position + 1:])
                    yield from self.match_value(rest.pattern, remaining, env)
            return
        yield from self._match_orders(pattern, values, patterns, rest, env, trace)

    def _match_orders(self, pattern: ast.OpPattern, values: list, patterns, rest, env: Environment, trace=None):
        """The operand patterns against the values in order, or for `in any order`
        each against a distinct value: every way, in the order of the positions
        the sub-patterns take (first sub-pattern's position first), then of the
        ways each matches.

        Assigned one sub-pattern at a time with backtracking (see the module
        docstring). Without a trace, the ways a sub-pattern matches an operand
        are kept per the values of the variables it reads, and a sub-pattern
        after the first that reads no earlier binding is tried against every
        operand once, up front: if it matches none, nothing does.
        """
        count = len(patterns)
        nodes = [operand.pattern for operand in patterns]
        plain = self._split(pattern)[4]
        variables = self._operand_variables(pattern)
        budget = self.budget
        width = len(values)
        used = [False] * width
        any_order = pattern.any_order
        memo: dict | None = {} if trace is None and plain is None else None
        # A sub-pattern after the first that reads nothing bound before it: its
        # operands are the same for every order (None until first asked).
        bound = set(env)
        independent = []
        for level in range(count):
            independent.append(memo is not None and any_order and level > 0 and bound.isdisjoint(variables[level]))
            bound.update(variables[level])
        candidates: list[list[int] | None] = [None] * count

        def ways(level: int, position: int, env: Environment):
            value = values[position]
            if plain is not None:
                var = plain[level]
                if var is None:
                    return (env,)
                if var in env:
                    return (env,) if _same(env[var], value) else ()
                extended = dict(env)
                extended[var] = value
                return (extended,)
            node = nodes[level]
            if memo is None:
                if trace is not None:
                    trace.slots[id(node)] = f"#{position}"
                return self.match_value(node, value, env)
            names = variables[level]
            try:
                key = (level, position, *[env.get(name, _UNBOUND) for name in names])
                found = memo.get(key)
            except TypeError:  # a binding that cannot be a key: match it afresh
                return self.match_value(node, value, env)
            if found is None:
                new = [name for name in names if name not in env]
                found = memo[key] = [
                    {name: extended[name] for name in new if name in extended}
                    for extended in self.match_value(node, value, env)
                ]
            return [{**env, **added} if added else env for added in found]

        def positions(level: int, env: Environment):
            if not any_order:
                return (level,)
            if not independent[level]:
                return range(width)
            found = candidates[level]
            if found is None:
                found = []
                for position in range(width):
                    if budget is not None:
                        budget.spend()
                    if any(True for _ in ways(level, position, env)):
                        found.append(position)
                candidates[level] = found
            return found

        dead = False  # a sub-pattern matches no operand: no order can

        def search(level: int, env: Environment):
            nonlocal dead
            if level == count:
                if rest is None:
                    yield env
                    return
                if trace is not None:
                    trace.slots[id(rest.pattern)] = "rest"
                remaining = tuple(value for value, taken in zip(values, used) if not taken)
                yield from self.match_value(rest.pattern, remaining, env)
                return
            open_positions = positions(level, env)
            if not open_positions:
                dead = True
                return
            for position in open_positions:
                if dead:
                    return
                if used[position]:
                    continue
                if budget is not None:
                    budget.spend()
                for extended in ways(level, position, env):
                    used[position] = True
                    yield from search(level + 1, extended)
                    used[position] = False

        return search(0, env)

    def _operand_variables(self, pattern: ast.OpPattern) -> list[tuple[str, ...]]:
        """The variables each positional operand pattern of `pattern` binds or reads
        (nested ones included), sorted: a memo key lists their values in that order."""
        found = self._variables.get(id(pattern))
        if found is None or found[0] is not pattern:
            found = self._variables[id(pattern)] = (
                pattern, [tuple(sorted(_variables(operand.pattern))) for operand in self._split(pattern)[2]],
            )
        return found[1]

    def _match_wide(self, pattern: ast.OpPattern, record, patterns, rest, env: Environment):
        """`_match_positional` over a wide op's record: the same environments, in the same order."""
        values = record.values
        if len(patterns) > len(values) or (rest is None and len(patterns) != len(values)):
            return
        if len(patterns) == 1 and _is_bound(patterns[0].pattern, env):
            bound = env[patterns[0].pattern.var]
            if isinstance(bound, (tuple, OperandsExcept)) or bound is ABSENT:
                return  # no operand is a tuple or absent
            if pattern.any_order:
                try:
                    positions = sorted(record.positions.get(bound, ()))
                except TypeError:  # unhashable: no operand
                    positions = []
            else:
                positions = [0] if _same(bound, values[0]) else []
            lazy = rest is not None and id(rest.pattern) in self.lazy_rests
            for position in positions:
                if rest is None:
                    yield env
                elif lazy:
                    yield from self.match_value(rest.pattern, OperandsExcept(record, position), env)
                else:
                    remaining = tuple(values[:position]) + tuple(values[position + 1:])
                    yield from self.match_value(rest.pattern, remaining, env)
            return
        # Other shapes of pattern take the general way, over a copy.
        yield from self._match_orders(pattern, list(values), patterns, rest, env)

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
                if self._trace is not None:
                    self._trace.fail(pattern, f"it is {self._value(value)}, but {pattern.var} is already "
                                              f"{self._value(env[pattern.var])}", env)
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
        if isinstance(value, tuple) or value is ABSENT:
            if self._trace is not None:
                self._trace.fail(pattern, f"it is {self._value(value)}, which no op produces", env)
            return
        op = self.adapter.producer(value)
        if op is None:
            if self._trace is not None:
                self._trace.fail(pattern, f"{self._value(value)} is an input: no op produces it", env)
            return
        yield from self.match_op(pattern, op, env)

    def _op(self, op: Op) -> str:
        return f"'{self.adapter.op_name(op)}' ({self.adapter.op_type(op)})"

    def _value(self, value) -> str:
        if value is ABSENT:
            return "absent"
        if isinstance(value, tuple):
            return f"a rest of {len(value)} operand(s)"
        return f"%{self.adapter.value_name(value)}"

    def match_rule(self, rule: ast.Rule, anchor: Op) -> Iterable[Environment]:
        """Every way the rule's `match` clauses fit, with `anchor` as the first."""
        adapter = self.adapter
        outputs = adapter.outputs(anchor)
        if not outputs:
            return ()
        clauses = rule.matches
        first = clauses[0]
        env = {first.var: outputs[0]}
        if len(clauses) == 1 and self._trace is None:
            flat = self._flat.get(id(first.pattern))
            if flat is None or flat[0] is not first.pattern:
                flat = self._flat[id(first.pattern)] = (first.pattern, _flat_operands(first.pattern))
            operands = flat[1]
            if operands is not None:
                # `%e = Expand(input=%x, shape=_)`: every rule is tried on
                # every op of its type, and a pattern of named operands that
                # are plain variables matches one way or none.
                if adapter.op_type(anchor) not in first.pattern.types:
                    return ()
                for name, var, optional in operands:
                    value = adapter.operand(anchor, name)
                    if value is None:
                        if not optional:
                            return ()
                        value = ABSENT
                    if var is None:
                        continue
                    if var in env:
                        if not _same(env[var], value):
                            return ()
                    else:
                        env[var] = value
                return (env,)
        return self._match_clauses(clauses, 0, anchor, env)

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


def _expected(pattern: ast.OpPattern) -> str:
    """What an op pattern asks for: its op, or its class with the members."""
    if pattern.types == frozenset((pattern.op,)):
        return pattern.op
    members = sorted(pattern.types)
    shown = ", ".join(members[:6]) + (", ..." if len(members) > 6 else "")
    return f"{pattern.op} ({shown})"


def _flat_operands(pattern: ast.OpPattern) -> tuple | None:
    """(name, variable or None for `_`, optional) of each operand of a pattern whose
    operands are all named, in a fixed order, and plain `%v` or `_`; else None."""
    if pattern.any_order or not pattern.operands:
        return None  # no named operand: the positional way, which counts the op's operands
    found: list[tuple[str, str | None, bool]] = []
    for operand in pattern.operands:
        node = operand.pattern
        if operand.name is None or operand.rest:
            return None
        if type(node) is ast.Wildcard:
            found.append((operand.name, None, operand.optional))
        elif type(node) is ast.Bind and node.producer is None:
            found.append((operand.name, node.var, operand.optional))
        else:
            return None
    return tuple(found)


def _plain_names(operands) -> tuple | None:
    """The variables of operand patterns that are each a plain `%v` (None for a `_`),
    or None if any has a producer pattern or is an op pattern."""
    names: list[str | None] = []
    for operand in operands:
        node = operand.pattern
        if type(node) is ast.Wildcard:
            names.append(None)
        elif type(node) is ast.Bind and node.producer is None:
            names.append(node.var)
        else:
            return None
    return tuple(names)


def _variables(node) -> set[str]:
    """The variables a value pattern binds or reads, in its nested op patterns too."""
    found: set[str] = set()
    pending = [node]
    while pending:
        item = pending.pop()
        if type(item) is ast.Bind:
            found.add(item.var)
            item = item.producer
        if type(item) is ast.OpPattern:
            pending.extend(operand.pattern for operand in item.operands)
    return found


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
