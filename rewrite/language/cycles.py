"""Rules that undo each other: a cycle of rules, each building an op the next one fires on.

`lint_rule` warns about a rule whose replacement rebuilds the op it is
anchored on. Two rules can do the same between them (ONNX Relu to LeakyRelu
in one, LeakyRelu to Relu in another), or three and more in turn, and
`apply` then goes on until its sweep cap. This lint finds such cycles where
the rules' text shows them, and warns once per cycle, at its first rule.

Rule A leads to rule B when B's anchor pattern can match an op A's rewrite
builds, as the rewrite shows it: the op's type is one B is anchored on, and
each operand B's patterns (its match clauses, and the `%v is op(...)` that
always hold) ask a producer of comes from something that can be it. What A
builds there, or matched there with a pattern, is checked in turn; a value
A matched without looking at its producer can be anything, except one A
asks to be a constant (`is_const(%v)`), which is taken for a const; a
constant is only a const; a value no pattern of A places (one a condition
finds, as `unscaled(%v)`) is taken to be nothing in particular, for the
text does not say what makes it. Being conservative there keeps the rules
that merely may fire after each other from being reported.

A cycle of such steps is then followed around three times, each rule
firing on what the one before it built, its variables bound to the parts
of that op: a loop that lives on what the graph held at the start runs out
of it, one that lives on what it builds does not. Of the conditions, only
`is_const` and `not is_const(%v)` are read (the latter is false of a value
built as a constant); the others may rule a step out, as they may for
`lint_rule`'s warning. A cycle whose rules together remove more ops than
they build (matched ops the rewrite does not read again) shrinks the graph
every time around, so it ends; it is not reported, as `lint_rule` does not
report a rule that shrinks the graph.

One module, though long: the cycle lint is one analysis (which op a rewrite
builds, which anchors it can feed, the graph of rules, its cycles) whose steps
share the same small model of a rule's output; no part is used elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from rewrite.language import ast
from rewrite.language.errors import Diagnostic, SourceText
from rewrite.language.schema import OpSchema, OpSignature
from rewrite.language.types import BUILTINS, Type


class _Matched:
    """A value a pattern matched without looking at its producer: whatever the graph has there."""

    def __repr__(self) -> str:
        return "MATCHED"


class _Unseen:
    """A value no pattern places (found by a condition or a builtin): nothing the text shows."""

    def __repr__(self) -> str:
        return "UNSEEN"


class _Constant:
    """An operand given as a constant (a literal, a list, a constant computed from the match)."""

    def __repr__(self) -> str:
        return "CONSTANT"


MATCHED, UNSEEN, CONSTANT = _Matched(), _Unseen(), _Constant()

# The op types a constant operand is made by (MIL builds a const op for one).
_CONSTANT_OPS = frozenset({"const", "Constant"})

# How far the search goes. Patterns nest only so deep; a cycle longer than
# a handful of rules is not one a reader would find by looking at them
# either; and the bounds keep the search a small part of loading (rules of
# one shape are looked at once: a file of 8,000 copies of the library's
# rules takes 0.3 s of the loader's 7).
_LONGEST_NESTING = 12
_LONGEST_CYCLE = 6
_CYCLE_PATHS = 20_000  # paths tried to find cycles in one group of rules that lead to each other
_ROUNDS = 3  # times a cycle is followed around
_ALTERNATIVES = 16  # ways one rule may fire on what the one before built, followed at each step


@dataclass(frozen=True, eq=False)
class _Op:
    """An op a rewrite builds, or one its patterns match: the types it may have and where its operands come from.

    `slots` lists each operand the text speaks of once, as its name (None
    where not known) and its source: `MATCHED`, `UNSEEN`, `CONSTANT` or an
    `_Op` (a variadic operand has a slot for each value it is given). The
    first `exact` slots stand at their schema positions; `other` is the
    source of every operand not listed.
    """

    types: frozenset[str]
    slots: tuple[tuple[str | None, object], ...]
    exact: int
    other: object

    def at(self, position: int) -> tuple[object, ...]:
        """The sources that may be the operand at `position` (schema order)."""
        if position < self.exact:
            return (self.slots[position][1],)
        return (*(source for _, source in self.slots[self.exact:]), self.other)

    def by_name(self, name: str, signature) -> tuple[object, ...]:
        """The sources that may be the operand called `name`."""
        named = tuple(source for slot_name, source in self.slots if slot_name == name)
        if named:
            return named
        position = _position_of(signature, name)
        if position is None:
            return (*(source for slot_name, source in self.slots if slot_name is None), self.other)
        return self.at(position)

    def listed(self) -> tuple[object, ...]:
        """The source of each listed operand (a pattern that takes them in any order picks among them)."""
        return tuple(source for _, source in self.slots)


def _position_of(signature, name: str) -> int | None:
    """The position of input `name` in schema order, if no variadic input comes before it."""
    if signature is None:
        return None
    for index, spec in enumerate(signature.inputs):
        if spec.name == name:
            return index
        if spec.variadic:
            return None
    return None


def lint_cycles(
    rules: Sequence[ast.Rule], sources: dict[str, SourceText], schema_for: Callable[[str], OpSchema | None]
) -> list[Diagnostic]:
    """A warning for each group of rules that can undo each other in a cycle, at the cycle's first rule.

    `schema_for(dialect)` gives a dialect's op schema, whose
    `signature(op_type)` orders an op's operands (positional patterns count
    by it); None for a dialect without one.
    """
    shapes = _Shapes(rules, _Signatures(schema_for))
    warnings = []
    for cycle in shapes.cycles():
        rule = cycle[0][0].rule
        source = sources.get(rule.span.file)
        if source is not None:
            warnings.append(source.diagnostic(rule.span, _message(cycle), "warning"))
    return warnings


def _message(cycle: list[tuple[_Shape, str]]) -> str:
    rules = [shape.rule for shape, _ in cycle]
    named = [f"'{rules[0].name}'", *(f"'{rule.name}' ({rule.span})" for rule in rules[1:])]
    steps = [
        f"'{rule.name}' builds a {built} that '{rules[(i + 1) % len(rules)].name}' is anchored on" if i == 0
        else f"'{rule.name}' a {built} that '{rules[(i + 1) % len(rules)].name}' is"
        for i, (rule, (_, built)) in enumerate(zip(rules, cycle))
    ]
    in_turn = "" if len(cycle) == 2 else " in turn"
    return (f"rules {_and(named)} may undo each other{in_turn}: {_and(steps, comma=True)}, so `apply` may go on "
            "until its sweep cap; make sure a condition rules out one of the steps")


def _and(items: list[str], comma: bool = False) -> str:
    if len(items) == 2:
        return f"{items[0]}{',' if comma else ''} and {items[1]}"
    return ", ".join(items[:-1]) + f", and {items[-1]}"


class _Signatures:
    """The operand order of op types, by dialect; None where a pattern's types do not share one."""

    def __init__(self, schema_for: Callable[[str], OpSchema | None]):
        self.schema_for = schema_for
        self.known: dict[tuple[str, frozenset[str]], OpSignature | None] = {}

    def of(self, dialect: str, types: frozenset[str]) -> OpSignature | None:
        key = (dialect, types)
        if key not in self.known:
            schema = self.schema_for(dialect)
            signatures = [schema.signature(t) for t in sorted(types)] if schema is not None else [None]
            orders = {None if s is None else tuple(s.inputs) for s in signatures}
            self.known[key] = signatures[0] if len(orders) == 1 and None not in orders else None
        return self.known[key]


# ------------------------------------------------------------------ one rule


class _Shape:
    """Rules with the same dialect, patterns and actions: they lead to the same rules, and as far."""

    def __init__(self, rule: ast.Rule, position: int, signatures: _Signatures):
        self.rule, self.position = rule, position
        self.signatures = signatures
        self.patterns = _patterns_by_var(rule)
        self.matched = _matched_vars(rule)
        # A value the rule asks to be a constant is taken for one (a const op),
        # and one it asks not to be is no constant.
        self.constant = _constant_vars(rule, negated=False)
        self.not_constant = _constant_vars(rule, negated=True)
        self.built = self.build({})
        # What a firing adds to the graph if each op it matches and does not read
        # again goes dead (lint_rule's reckoning; one with other uses stays).
        self.growth = len(self.built) - _matched_count(rule)

    def build(self, bound: dict[str, object]) -> list[_Op]:
        """The ops the rewrite builds when the rule's variables are `bound` (the others as its patterns say)."""
        return _build_ops(self, bound)

    def fire_on(self, op: _Op) -> Iterator[dict[str, object]]:
        """Each way the rule's anchor pattern could match `op`, as the variables it binds."""
        anchor = self.rule.anchor
        for bound in _Unifier(self).bind(anchor.pattern, op, {anchor.var: op}, _LONGEST_NESTING):
            if not any(bound.get(var) is CONSTANT for var in self.not_constant):
                yield bound


class _Unifier:
    """Matches one rule's patterns against an op's structure, binding its variables."""

    def __init__(self, shape: _Shape):
        self.shape = shape
        self.dialect = shape.rule.dialect

    def bind(self, pattern: ast.OpPattern, op: _Op, bound: dict, depth: int) -> Iterator[dict]:
        if not pattern.types & op.types:
            return
        if depth == 0:
            yield bound
            return
        signature = self.shape.signatures.of(self.dialect, pattern.types & op.types)
        if pattern.any_order:
            # Each pattern operand takes an operand of its own (any of those not listed, as often as it likes).
            slots = (*enumerate(op.listed()), (None, op.other))
        steps = []
        for position, operand in enumerate(pattern.operands):
            if operand.rest:
                break  # what is left is bound as it is
            if pattern.any_order:
                candidates = slots
            elif operand.name is None:
                candidates = tuple((None, source) for source in op.at(position))
            else:
                candidates = tuple((None, source) for source in op.by_name(operand.name, signature))
            steps.append((operand.pattern, candidates))
        yield from self._operands(steps, 0, bound, depth, frozenset())

    def _operands(self, steps, index: int, bound: dict, depth: int, taken: frozenset) -> Iterator[dict]:
        if index == len(steps):
            yield bound
            return
        inner, candidates = steps[index]
        seen = 0
        tried: set[tuple] = set()
        for slot, candidate in candidates:
            if slot in taken or (slot is None and (None, id(candidate)) in tried):
                continue
            tried.add((slot, id(candidate)))
            now_taken = taken if slot is None else taken | {slot}
            for after in self._value(inner, candidate, bound, depth - 1):
                for complete in self._operands(steps, index + 1, after, depth, now_taken):
                    yield complete
                    seen += 1
                    if seen >= _ALTERNATIVES:
                        return

    def _value(self, inner, source, bound: dict, depth: int) -> Iterator[dict]:
        """Bind a value pattern (`_`, `%v`, `%v = op(...)`, `op(...)`) to `source`."""
        if isinstance(inner, ast.Wildcard):
            yield bound
            return
        var = inner.var if isinstance(inner, ast.Bind) else None
        if var is not None and var in bound:
            if _could_be_same(bound[var], source):
                yield bound
            return
        wanted: ast.OpPattern | None
        if isinstance(inner, ast.OpPattern):
            wanted = inner
        else:
            wanted = inner.producer if inner.producer is not None else self.shape.patterns.get(inner.var)
        if source is MATCHED and var in self.shape.constant:
            source = CONSTANT
        if wanted is None:
            yield {**bound, var: source}
            return
        if source is MATCHED:
            # Whatever the graph has there: the pattern says what it is.
            source = _Terms(self.shape, bound).of_pattern(wanted)
        elif source is UNSEEN:
            return  # nothing in the text says what makes it
        elif source is CONSTANT:
            if wanted.types & _CONSTANT_OPS:
                yield bound if var is None else {**bound, var: source}
            return
        named = bound if var is None else {**bound, var: source}
        yield from self.bind(wanted, source, named, depth)


def _could_be_same(first, second) -> bool:
    """Whether two sources could be one value (a variable a pattern names twice)."""
    return first is second or MATCHED in (first, second) or (first is CONSTANT and second is CONSTANT)


def _build_ops(shape: _Shape, bound: dict[str, object]) -> list[_Op]:
    """Every op `shape`'s rewrite builds, with what it gives each operand (variables `bound`, or as patterns say)."""
    terms = _Terms(shape, bound)
    ops = []
    for action in shape.rule.actions:
        op: _Op | None
        if isinstance(action, ast.BuildAction):
            op = terms.build(action.build)
            terms.built[action.var] = op
        elif isinstance(action.replacement, ast.OpBuild):
            op = terms.build(action.replacement)
        elif isinstance(action.replacement, ast.Rebuild):
            op = terms.rebuild(action.replacement)
        else:
            continue
        if op is not None:
            ops.append(op)
    return ops


class _Terms:
    """What one rule's text says of the ops it builds and matches, its variables `bound` to sources."""

    def __init__(self, shape: _Shape, bound: dict[str, object]):
        self.shape, self.bound = shape, bound
        self.dialect = shape.rule.dialect
        self.built: dict[str, _Op] = {}

    def build(self, build: ast.OpBuild) -> _Op:
        named: dict[str | None, object] = {argument.name: self.source(argument.value) for argument in build.arguments}
        # An operand not given is absent, or a default MIL makes a constant of.
        return self._laid_out(frozenset({build.op}), named, CONSTANT)

    def rebuild(self, rebuild: ast.Rebuild) -> _Op | None:
        base = self.source(ast.ValueRef(rebuild.var, rebuild.span))
        if not isinstance(base, _Op):
            return None
        changed = {argument.name: self.source(argument.value) for argument in rebuild.arguments}
        slots = []
        exact = base.exact
        for index, (name, source) in enumerate(base.slots):
            if name in changed:
                value = changed[name]
                if isinstance(value, tuple) or sum(slot_name == name for slot_name, _ in base.slots) != 1:
                    exact = min(exact, index)  # a variadic given anew: what follows moves
                    continue
                source = value
            slots.append((name, source))
        exact = min(exact, len(slots))
        listed = {name for name, _ in base.slots}
        for name, value in changed.items():
            if name not in listed or isinstance(value, tuple) or sum(n == name for n, _ in base.slots) != 1:
                slots.extend((name, source) for source in (value if isinstance(value, tuple) else (value,)))
        return _Op(base.types, tuple(slots), exact, base.other)

    def _laid_out(self, types: frozenset[str], named: dict[str | None, object], other) -> _Op:
        """An op of `named` operands, in schema order where the schema gives one."""
        signature = self.shape.signatures.of(self.dialect, types)
        slots: list[tuple[str | None, object]] = []
        exact = None
        for spec in signature.inputs if signature is not None else ():
            value = named.get(spec.name, other if other is MATCHED else None)
            if value is None or (spec.variadic and not isinstance(value, tuple)):
                # Absent, a default, or values of unknown number: the later operands may stand anywhere.
                exact = len(slots) if exact is None else exact
                if value is not None:
                    slots.append((spec.name, value))
                continue
            slots.extend((spec.name, source) for source in (value if isinstance(value, tuple) else (value,)))
        if signature is None:
            exact = 0
        placed = {name for name, _ in slots}
        exact = len(slots) if exact is None else exact
        for name, value in named.items():
            if name not in placed:
                slots.extend((name, source) for source in (value if isinstance(value, tuple) else (value,)))
        return _Op(types, tuple(slots), exact, other)

    def of_pattern(self, pattern: ast.OpPattern) -> _Op:
        """An op as a pattern matches it: what the pattern says of each operand, anything of the rest."""
        if pattern.any_order:
            slots = []
            for operand in pattern.operands:
                if operand.rest:
                    break
                slots.append((operand.name, self._of_value_pattern(operand.pattern)))
            return _Op(pattern.types, tuple(slots), 0, MATCHED)
        if any(operand.name is not None for operand in pattern.operands):
            named = {operand.name: self._of_value_pattern(operand.pattern) for operand in pattern.operands}
            return self._laid_out(pattern.types, named, MATCHED)
        signature = self.shape.signatures.of(self.dialect, pattern.types)
        names = []
        for spec in signature.inputs if signature is not None else ():
            if spec.variadic:
                break
            names.append(spec.name)
        slots = []
        for position, operand in enumerate(pattern.operands):
            if operand.rest:
                break
            name = names[position] if position < len(names) else None
            slots.append((name, self._of_value_pattern(operand.pattern)))
        return _Op(pattern.types, tuple(slots), len(slots), MATCHED)

    def _of_value_pattern(self, inner):
        if isinstance(inner, ast.OpPattern):
            return self.of_pattern(inner)
        if isinstance(inner, ast.Bind):
            if inner.var in self.bound:
                return self.bound[inner.var]
            if inner.producer is not None:
                return self.of_pattern(inner.producer)
            if inner.var in self.shape.constant:
                return CONSTANT
        return MATCHED

    def source(self, expr):
        """Where a built operand comes from: an op built or matched, a value matched or unseen, or a constant."""
        if isinstance(expr, ast.ValueRef):
            var = expr.var
            if var in self.built:
                return self.built[var]
            if var in self.bound:
                return self.bound[var]
            if var in self.shape.constant:
                return CONSTANT
            pattern = self.shape.patterns.get(var)
            if pattern is not None:
                return self.of_pattern(pattern)
            return MATCHED if var in self.shape.matched else UNSEEN
        if isinstance(expr, ast.TupleExpr):
            return tuple(self.source(item) for item in expr.items)
        if isinstance(expr, ast.Conditional):
            branches = (self.source(expr.then), self.source(expr.otherwise))
            if all(branch is CONSTANT for branch in branches):
                return CONSTANT
            return UNSEEN if all(branch in (CONSTANT, UNSEEN) for branch in branches) else MATCHED
        if isinstance(expr, (ast.TupleComprehension, ast.Index)):
            return UNSEEN  # values of the graph, or one of them, that no pattern places
        if isinstance(expr, ast.Call):
            signature = BUILTINS.get(expr.function)
            if signature is None or signature.result is Type.VALUE:
                return UNSEEN  # a registered predicate, or a builtin that gives a value of the graph
            return CONSTANT  # a number, a list, or a value's constant (`const(%v)`, `as_dtype(...)`)
        return CONSTANT  # literals, lists, arithmetic, comprehensions, named constants


def _patterns_by_var(rule: ast.Rule) -> dict[str, ast.OpPattern]:
    """The pattern that says what makes each variable of `rule` (a match clause's, or an always-true `is`)."""
    patterns: dict[str, ast.OpPattern] = {}

    def visit(pattern: ast.OpPattern) -> None:
        for operand in pattern.operands:
            inner = operand.pattern
            if isinstance(inner, ast.Bind) and inner.producer is not None:
                patterns.setdefault(inner.var, inner.producer)
                visit(inner.producer)
            elif isinstance(inner, ast.OpPattern):
                visit(inner)

    for clause in rule.matches:
        patterns.setdefault(clause.var, clause.pattern)
        visit(clause.pattern)
    for matches in _condition_patterns(rule):
        if isinstance(matches.subject, ast.ValueRef):
            patterns.setdefault(matches.subject.var, matches.pattern)
        visit(matches.pattern)
    return patterns


def _matched_vars(rule: ast.Rule) -> set[str]:
    """The variables the rule's patterns bind (those of match clauses and of `is` conditions that always hold)."""
    found: set[str] = set()

    def visit(pattern: ast.OpPattern) -> None:
        for operand in pattern.operands:
            inner = operand.pattern
            if isinstance(inner, ast.Bind):
                found.add(inner.var)
                if inner.producer is not None:
                    visit(inner.producer)
            elif isinstance(inner, ast.OpPattern):
                visit(inner)

    for clause in rule.matches:
        found.add(clause.var)
        visit(clause.pattern)
    for matches in _condition_patterns(rule):
        visit(matches.pattern)
    return found


def _condition_patterns(rule: ast.Rule) -> tuple[ast.Matches, ...]:
    """The `%v is op(...)` of `rule`'s conditions that hold whenever it fires (in a chain of `and`s)."""
    return tuple(
        expr for condition in rule.conditions for expr in ast.conjuncts(condition.expr)
        if isinstance(expr, ast.Matches) and not expr.negated
    )


def _constant_vars(rule: ast.Rule, negated: bool) -> set[str]:
    """The variables of the `is_const(%v)` (with `negated`, `not is_const(%v)`) that hold whenever the rule fires."""
    found = set()
    for condition in rule.conditions:
        for expr in ast.conjuncts(condition.expr):
            if negated:
                if not isinstance(expr, ast.Not):
                    continue
                expr = expr.operand
            if (isinstance(expr, ast.Call) and expr.function == "is_const" and len(expr.arguments) == 1
                    and isinstance(expr.arguments[0], ast.ValueRef)):
                found.add(expr.arguments[0].var)
    return found


def _matched_count(rule: ast.Rule) -> int:
    """How many of the ops the rule matches whenever it fires go dead when it does, at most.

    The match clauses' ops, and those of the conditions' `%v is op(...)`
    (both sides of an `and`, the fewer of an `or`'s two), less each op the
    rewrite reads again and every op below it, which stay.
    """
    kept = _read_by_actions(rule)
    return sum(_pattern_size(clause.pattern, clause.var, kept) for clause in rule.matches) + sum(
        _ops_matched_by(condition.expr, kept) for condition in rule.conditions
    )


def _read_by_actions(rule: ast.Rule) -> set[str]:
    """The variables whose values the rewrite's new ops take as operands, or redirects uses to.

    A value read only for a number (`dtype(%v)`, `const(%v)`, `scale_of(%v)`)
    is not among them: the new ops do not read it.
    """
    read: set[str] = set()

    def operand(expr) -> None:
        if isinstance(expr, ast.ValueRef):
            read.add(expr.var)
        elif isinstance(expr, ast.TupleExpr):
            for item in expr.items:
                operand(item)
        elif isinstance(expr, ast.Conditional):
            operand(expr.then)
            operand(expr.otherwise)
        elif isinstance(expr, ast.Index):
            operand(expr.base)

    for action in rule.actions:
        if isinstance(action, ast.BuildAction):
            arguments = action.build.arguments
        elif isinstance(action.replacement, (ast.OpBuild, ast.Rebuild)):
            arguments = action.replacement.arguments
        else:
            operand(action.replacement)
            continue
        for argument in arguments:
            operand(argument.value)
    read.discard(rule.anchor.var)  # replaced, whatever reads it
    return read


def _ops_matched_by(expr, kept: set[str]) -> int:
    if isinstance(expr, ast.And):
        return _ops_matched_by(expr.left, kept) + _ops_matched_by(expr.right, kept)
    if isinstance(expr, ast.Or):
        return min(_ops_matched_by(expr.left, kept), _ops_matched_by(expr.right, kept))
    if isinstance(expr, ast.Matches) and not expr.negated:
        subject = expr.subject.var if isinstance(expr.subject, ast.ValueRef) else None
        return _pattern_size(expr.pattern, subject, kept)
    return 0


def _pattern_size(pattern: ast.OpPattern, var: str | None, kept: set[str]) -> int:
    if var in kept:
        return 0  # read again: it stays, and so does what it reads
    size = 1
    for operand in pattern.operands:
        inner = operand.pattern
        if isinstance(inner, ast.Bind) and inner.producer is not None:
            size += _pattern_size(inner.producer, inner.var, kept)
        elif isinstance(inner, ast.OpPattern):
            size += _pattern_size(inner, None, kept)
    return size


# ------------------------------------------------------------------ rules together


class _Shapes:
    """The rules as shapes, each with the shapes it leads to (and the op type it builds for each)."""

    def __init__(self, rules: Sequence[ast.Rule], signatures: _Signatures):
        by_key: dict[tuple, _Shape] = {}
        for position, rule in enumerate(rules):
            key = (rule.dialect, rule.matches, _condition_patterns(rule), rule.actions)
            if key not in by_key:
                by_key[key] = _Shape(rule, position, signatures)
        self.shapes = list(by_key.values())
        anchored: dict[tuple[str, str], list[_Shape]] = {}
        for shape in self.shapes:
            for op_type in shape.rule.anchor.pattern.types:
                anchored.setdefault((shape.rule.dialect, op_type), []).append(shape)
        self.edges = {shape: self._leads_to(shape, anchored) for shape in self.shapes}

    def _leads_to(self, shape: _Shape, anchored) -> list[tuple[_Shape, str]]:
        found: dict[_Shape, str] = {}
        for op in shape.built:
            for op_type in sorted(op.types):
                for target in anchored.get((shape.rule.dialect, op_type), ()):
                    # A rule that leads to itself is `lint_rule`'s to report,
                    # and so is another rule of the very same shape.
                    if target is shape or target in found:
                        continue
                    if next(target.fire_on(op), None) is not None:
                        found[target] = op_type
        return sorted(found.items(), key=lambda item: item[0].position)

    def cycles(self) -> list[list[tuple[_Shape, str]]]:
        """For each group of rules that lead to each other, its shortest cycle that lasts, first rule first."""
        found = []
        for group in _strongly_connected(self.shapes, self.edges):
            if len(group) > 1:
                cycle = self._lasting_cycle(group)
                if cycle is not None:
                    found.append(cycle)
        return sorted(found, key=lambda cycle: cycle[0][0].position)

    def _lasting_cycle(self, group: list[_Shape]) -> list[tuple[_Shape, str]] | None:
        """The shortest cycle in `group` that does not shrink the graph and lasts `_ROUNDS` times around."""
        members = set(group)
        budget = _CYCLE_PATHS
        ordered = sorted(group, key=lambda shape: shape.position)
        for length in range(2, min(len(group), _LONGEST_CYCLE) + 1):
            for start in ordered:
                # Paths from `start` through rules placed after it: each cycle is found once, from its first rule.
                stack: list[tuple[_Shape, tuple[tuple[_Shape, str], ...]]] = [(start, ())]
                while stack and budget > 0:
                    node, path = stack.pop()
                    budget -= 1
                    if len(path) == length - 1:
                        for successor, built in self.edges[node]:
                            if successor is start:
                                cycle = [*path, (node, built)]
                                if sum(shape.growth for shape, _ in cycle) >= 0 and _lasts(cycle):
                                    return cycle
                        continue
                    on_path = {shape for shape, _ in path} | {node}
                    for successor, built in self.edges[node]:
                        if successor in members and successor not in on_path and successor.position > start.position:
                            stack.append((successor, (*path, (node, built))))
            if budget <= 0:
                break
        return None


def _lasts(cycle: list[tuple[_Shape, str]]) -> bool:
    """Whether each rule of `cycle` can fire on what the one before it built, `_ROUNDS` times around.

    The first rule fires on what its patterns say; each firing's new ops
    are what the next one may fire on, its variables bound to their parts.
    """
    shapes = [shape for shape, _ in cycle]
    alternatives = [shapes[0].built]
    for step in range(1, _ROUNDS * len(shapes) + 1):
        shape = shapes[step % len(shapes)]
        following: list[list[_Op]] = []
        ways: set[tuple] = set()
        for built in alternatives:
            for op in built:
                for bound in shape.fire_on(op):
                    way = tuple(sorted((var, id(source)) for var, source in bound.items()))
                    if way in ways:
                        continue  # the same firing, found again
                    ways.add(way)
                    following.append(shape.build(bound))
                    if len(following) >= _ALTERNATIVES:
                        break
                if len(following) >= _ALTERNATIVES:
                    break
            if len(following) >= _ALTERNATIVES:
                break
        if not following:
            return False
        alternatives = following
    return True


def _strongly_connected(nodes: list, edges: dict) -> list[list]:
    """Tarjan's strongly connected components, without recursion (groups can be long chains)."""
    index: dict = {}
    low: dict = {}
    on_stack: set = set()
    stack: list = []
    groups: list[list] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            advanced = False
            for successor, _ in successors:
                if successor not in index:
                    index[successor] = low[successor] = counter
                    counter += 1
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(edges[successor])))
                    advanced = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member is node:
                        break
                groups.append(group)
    return groups
