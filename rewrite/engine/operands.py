"""Shared, incrementally kept summaries of the operands of wide ops.

A `Sum` of 10,000 `Expand`s is an anchor 10,000 times over, and each anchor
asks about the same consumer: where the Expand sits among its operands, and
whether another operand has at least its rank or carries its dim on an axis.
Answered by walking the operands, each question costs the width, and the
run the width squared. So the first question about an op with more than
`WIDE` operands builds a `Record` of them, once, and every later question
reads it:

* where each value sits (`positions`), so that a rest operand `%others...`
  binds a view (`OperandsExcept`) instead of a copy;
* per feature of an operand that a quantifier compares (`rank(other)`,
  `aligned_dim(other, axis, of=%e)`: the dim at one offset from the right,
  and so on), how many operands have each value of it (`Counts`), so that
  `exists other in %others: rank(other) >= rank(%e)` looks at the distinct
  ranks, and `... aligned_dim(other, axis, of=%e) == dim(%e, axis)` is a
  dictionary lookup;
* for the shape guard, the operands' shapes as one `Shapes` summary: how
  many are of unknown rank, how many of each rank, and per offset from the
  right how many have each dim, so that proving a consumer's output type
  after one operand changes costs its rank, not its width.

A rewrite replaces one operand at a time, and the record follows: the
driver tells the table of every edit it makes (`replacing_all`,
`replacing_operand`, `removing`), and the record moves the replaced
value's positions to the new value and its counts from the one feature
value to the other. Nothing else edits the graph during a run; the table
lives for one run (`Driver.run`) and is empty outside it.

What a summary counts is exactly what the builtin returns for each operand
(the same function computes it), so an answer read from the counts is the
answer the quantifier would reach walking the operands: a dim is proved
equal only by a provably equal dim, and an unknown one never counts. Values
keep their types during a run (the guard's whole point), which is what lets
a value's feature be computed once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import chain, islice
from typing import Any, TypeVar, cast

from rewrite.engine.interfaces import Adapter, Capability, Op, Value, optional
from rewrite.language.logic import UNKNOWN, Term

# Ops with more operands than this get a record; below it, walking the
# operands costs less than keeping one.
WIDE = 32


class Counts:
    """How many operands of one op have each value of one feature (`feature(operand)`).

    `vague` counts those whose value is a symbol or unknown: the ones a
    comparison with a number can only call unknown.
    """

    __slots__ = ("feature", "of", "counts", "vague")

    def __init__(self, feature: Callable[[Value], Any]):
        self.feature = feature
        self.of: dict = {}  # distinct operand -> its feature value, as the key of `counts` holds it
        self.counts: dict = {}
        self.vague = 0

    def add(self, value: Value, times: int) -> None:
        key = self.of.get(value, _NONE)
        if key is _NONE:
            key = self.feature(value)
            hash(key)  # an unhashable feature (a list) cannot be counted: TypeError
            if key != key:
                raise TypeError("NaN is no dictionary key")  # unequal to itself: not countable either
            self.of[value] = key
        self.counts[key] = self.counts.get(key, 0) + times
        if isinstance(key, Term) or key is UNKNOWN:
            self.vague += times

    def drop(self, value: Value, times: int) -> None:
        key = self.of.pop(value)
        left = self.counts[key] - times
        if left:
            self.counts[key] = left
        else:
            del self.counts[key]
        if isinstance(key, Term) or key is UNKNOWN:
            self.vague -= times


class Shapes:
    """The shapes of one op's operands, summed up for the shape guard.

    `unknown` operands have no known rank; `ranks` counts the others by
    rank; `dims[k]` counts them by their dim at offset k from the right
    (k >= 1), for those of rank k or more. The aligned dim of a shorter
    operand there is 1 (numpy's right alignment): `aligned_count` adds them.
    """

    __slots__ = ("feature", "of", "unknown", "ranks", "dims")

    def __init__(self, feature: Callable[[Value], tuple | None]):
        self.feature = feature
        self.of: dict = {}
        self.unknown = 0
        self.ranks: dict[int, int] = {}
        self.dims: dict[int, dict] = {}

    def add(self, value: Value, times: int) -> None:
        shape = self.of.get(value, _NONE)
        if shape is _NONE:
            shape = self.feature(value)
            if shape is not None:
                for dim in shape:
                    hash(dim)  # TypeError for a dim that cannot be counted
            self.of[value] = shape
        if shape is None:
            self.unknown += times
            return
        self.ranks[len(shape)] = self.ranks.get(len(shape), 0) + times
        for offset in range(1, len(shape) + 1):
            at = self.dims.setdefault(offset, {})
            dim = shape[-offset]
            at[dim] = at.get(dim, 0) + times

    def drop(self, value: Value, times: int) -> None:
        shape = self.of.pop(value)
        if shape is None:
            self.unknown -= times
            return
        _take(self.ranks, len(shape), times)
        for offset in range(1, len(shape) + 1):
            _take(self.dims[offset], shape[-offset], times)

    def max_rank(self, without: tuple | None, times: int) -> int | None:
        """The largest rank among the operands but `times` of shape `without`; None if none is left."""
        best = None
        for rank, count in self.ranks.items():
            if without is not None and rank == len(without):
                count -= times
            if count > 0 and (best is None or rank > best):
                best = rank
        return best

    def aligned_count(self, offset: int, dim, without: tuple | None, times: int) -> int:
        """Operands whose dim at `offset` from the right is provably `dim` (a shorter
        operand's is 1 there), leaving out `times` operands of shape `without`.

        Provably: `logic.equal` says yes only for the same literal or the same
        symbol, which is what a dictionary lookup finds; unknown is never equal.
        """
        if dim is UNKNOWN:
            return 0
        found = self.dims.get(offset, {}).get(dim, 0)
        if dim == 1 and not isinstance(dim, Term):
            found += sum(count for rank, count in self.ranks.items() if rank < offset)
        if without is not None:
            theirs = without[-offset] if len(without) >= offset else 1
            if theirs is not UNKNOWN and theirs == dim:
                found -= times
        return found


def _take(counts: dict, key, times: int) -> None:
    left = counts[key] - times
    if left:
        counts[key] = left
    else:
        del counts[key]


_NONE = object()


# The kinds of summary a record keeps.
_Summary = TypeVar("_Summary", "Counts", "Shapes")


class Record:
    """The operands of one wide op: in order, where each value sits, and summaries of them."""

    __slots__ = ("op", "values", "positions", "summaries", "broadcast")

    def __init__(self, op: Op, values: list):
        self.op = op
        self.values = values
        positions: dict[Value, list[int]] = {}
        for position, value in enumerate(values):
            found = positions.get(value)
            if found is None:
                positions[value] = [position]
            else:
                found.append(position)
        self.positions = positions
        self.summaries: dict[Any, Counts | Shapes | None] = {}
        # (whether the op broadcasts, whether every operand does), asked once
        # (`OperandTable.broadcasting`): None until then.
        self.broadcast: tuple[bool, bool] | None = None

    def count(self, value) -> int:
        """At how many positions `value` is an operand."""
        try:
            found = self.positions.get(value)
        except TypeError:  # an unhashable thing is no operand
            return 0
        return 0 if found is None else len(found)

    def summary(self, key, make: Callable[[], _Summary]) -> _Summary | None:
        """The summary named `key`, built by `make()` over the operands at its first use;
        None if its feature cannot be counted (an unhashable value)."""
        summaries = self.summaries
        if key in summaries:
            # What `make` made under this key before: every caller names its own kind.
            return cast("_Summary | None", summaries[key])
        summary = make()
        try:
            for value, found in self.positions.items():
                summary.add(value, len(found))
        except TypeError:
            summaries[key] = None
            return None
        summaries[key] = summary
        return summary

    def replace(self, old: Value, new: Value) -> None:
        """`old` is replaced by `new` at every position it holds (what both edits do)."""
        if old is new:
            return
        found = self.positions.pop(old, None)
        if not found:
            return
        values = self.values
        for position in found:
            values[position] = new
        self.positions.setdefault(new, []).extend(found)
        times = len(found)
        for key, summary in self.summaries.items():
            if summary is None:
                continue
            summary.drop(old, times)
            try:
                summary.add(new, times)
            except TypeError:
                self.summaries[key] = None


class OperandsExcept:
    """The operands of a wide op but the one at `position`: what a rest operand
    `%others...` binds without copying them.

    It reads the record as it is, so it is only bound while conditions are
    decided (nothing edits the op then), and only for a rest variable that the
    rule reads as a quantifier's domain or with `len` (see `lazy_rests`).
    Iterating it, or `materialize`, gives what the tuple would have held.
    """

    __slots__ = ("record", "position")

    def __init__(self, record: Record, position: int):
        self.record = record
        self.position = position

    def __len__(self) -> int:
        return len(self.record.values) - 1

    def __iter__(self) -> Iterator[Value]:
        values, position = self.record.values, self.position
        return chain(islice(values, position), islice(values, position + 1, None))

    def materialize(self) -> tuple:
        values, position = self.record.values, self.position
        return tuple(values[:position]) + tuple(values[position + 1:])

    @property
    def excluded(self) -> Value:
        return self.record.values[self.position]

    def count(self, value) -> int:
        """At how many of its positions `value` is."""
        found = self.record.count(value)
        excluded = self.excluded
        if found and (excluded is value or excluded == value):
            found -= 1
        return found

    def __eq__(self, other) -> bool:
        if isinstance(other, OperandsExcept):
            other = other.materialize()
        return isinstance(other, tuple) and self.materialize() == other

    def __hash__(self) -> int:
        return hash(self.materialize())

    def __repr__(self) -> str:
        return f"OperandsExcept({len(self)} operands)"


class OperandTable:
    """The records of the wide ops one run has asked about, kept up to date with its edits."""

    def __init__(self, adapter: Adapter, wide: int = WIDE):
        self.adapter = adapter
        self.wide = wide
        self.active = False
        self.records: dict[Op, Record] = {}

    def get(self, op: Op) -> Record | None:
        return self.records.get(op) if self.active else None

    def make(self, op: Op, values: list) -> Record | None:
        """The record of `op` from its operands `values`, if it is wide enough for one."""
        if not self.active or len(values) <= self.wide:
            return None
        record = self.records.get(op)
        if record is None:
            record = self.records[op] = Record(op, list(values))
        return record

    def record(self, op: Op) -> Record | None:
        """The record of `op`, built now if it is wide; None for a narrow op."""
        if not self.active:
            return None
        record = self.records.get(op)
        if record is None:
            record = self.make(op, list(self.adapter.operands(op)))
        return record

    def broadcasting(self, record: Record) -> tuple[bool, bool]:
        """Whether the adapter says the op broadcasts operands into its output
        (`broadcast_operands` is not None), and whether it lists every operand;
        asked once per op: which slots broadcast does not change with what is in them."""
        if record.broadcast is None:
            operands = optional(self.adapter, Capability.BROADCASTING)
            listed = operands(record.op) if operands is not None else None
            record.broadcast = (
                listed is not None,
                listed is not None
                and len(listed) == len(record.values)
                and all(a is b or a == b for a, b in zip(listed, record.values)),
            )
        return record.broadcast

    def start(self) -> None:
        self.records.clear()
        self.active = True

    def stop(self) -> None:
        self.active = False
        self.records.clear()

    # ---- the edits of a run, told before they are made

    def replacing_all(self, old: Value, new: Value) -> None:
        """Every use of `old` is about to read `new`."""
        if not self.records:
            return
        adapter = self.adapter
        records = self.records
        bridged = adapter.is_block_output(old)
        for consumer in adapter.consumers(old):
            record = records.get(consumer)
            if record is None:
                continue
            if bridged:
                # An adapter may bridge an output with an op of its own (MIL's
                # identity), which the consumers read instead of `new`: start over.
                del records[consumer]
            else:
                record.replace(old, new)

    def replacing_operand(self, op: Op, old: Value, new: Value) -> None:
        record = self.records.get(op)
        if record is not None:
            record.replace(old, new)

    def removing(self, op: Op) -> None:
        self.records.pop(op, None)
