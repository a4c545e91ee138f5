"""The shape guard: a rewrite is committed only if no consumer's type can change.

A rule's conditions are its author's proof; the guard is the engine's own,
independent of any rule. Before a replacement `old -> new` is carried out,
every op that reads `old` must provably produce outputs of the same type:
the same dtype, the same rank, and each dim proved equal under the
three-valued algebra (`logic.equal`). Unknown is a refusal.

Three ways to prove it, cheapest first:

1. `new` has provably the type of `old`: nothing downstream can tell them apart.
2. The consumer broadcasts the operand (the adapter says which operands
   broadcast together into its output). Its output dim at an axis stays the
   same when the new operand's dim there is provably the old one's or the
   output's, or is a literal 1 while another operand provably carries the
   old dim or the output dim. (In the original graph every operand is 1 or
   the output dim at each axis, which is what makes this enough.) A dim
   that was a literal 1 may also become what another operand has there.
   The output's rank must stay the largest operand rank.
3. The adapter re-infers the consumer's output types with the new operand
   (`output_types_with`), and they are provably the old ones.

A refusal says what it could not prove: the consumer, and the rank, dim or
dtype that would change, or else which operand's new value leaves its type
unknown, and why. An adapter whose type inference is no proof (ONNX's is
written for valid graphs) may still offer it for that message
(`inferred_output_types`).

Only the ops a rewrite touches are looked at: the cost is that of the
rewrite, never of the graph. For a consumer with thousands of operands (one
`Sum` of every layer's output) the second proof reads the operands' shapes
summed up in the consumer's record (`operands.Shapes`: the ranks, and per
axis from the right how many operands have each dim), built once per run and
kept up to date with each edit, so that one operand changed costs the
consumer's rank, not its width.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from rewrite.engine.interfaces import Adapter, Capability, Op, OperandRejected, TypesUnknown, Value, optional
from rewrite.engine.operands import OperandTable, Record, Shapes
from rewrite.language.logic import UNKNOWN, Truth, equal, proved_equal

Shape = tuple | None


@dataclass(frozen=True)
class Refusal:
    """Why the guard refused a replacement: which consumer, and what it could not prove."""

    consumer: str
    reason: str
    axis: int | None = None

    def __str__(self) -> str:
        where = f" at axis {self.axis}" if self.axis is not None else ""
        return f"consumer '{self.consumer}'{where}: {self.reason}"


class ShapeGuard:
    """Proves, before a rewrite, that the types its consumers produce are unchanged."""

    def __init__(self, adapter: Adapter, table: OperandTable | None = None):
        self.adapter = adapter
        self.table = table
        self._broadcast_operands = optional(adapter, Capability.BROADCASTING)
        self._output_types_with = optional(adapter, Capability.TYPE_INFERENCE)
        self._inferred_output_types = optional(adapter, Capability.INFERRED_TYPES)
        self._proven = optional(adapter, Capability.SHAPE_PROOFS)
        self._stated = optional(adapter, Capability.STATED_SHAPES)
        self._proving = False

    def check(self, old: Value, new: Value, consumers: Sequence[Op] | None = None) -> Refusal | None:
        """None if replacing `old` by `new` (in `consumers`, default: every use) keeps every type.

        The shapes as the IR states them settle almost every sound rewrite;
        only when they do not are the adapter's proofs asked for (an IR that
        mints fresh symbols may state one dim under two names), which costs more.
        """
        refusal = self._check(old, new, consumers)
        if refusal is None or self._proven is None:
            return refusal
        self._proving = True
        try:
            return self._check(old, new, consumers)
        finally:
            self._proving = False

    def _check(self, old: Value, new: Value, consumers: Sequence[Op] | None) -> Refusal | None:
        adapter = self.adapter
        if consumers is None:
            consumers = adapter.consumers(old)
            if adapter.is_block_output(old):
                refusal = self._same_type(old, new, "the block's outputs")
                if refusal is not None:
                    return refusal
        if not consumers:
            return None
        if self._same_types(old, new):
            if self._output_types_with is not None and (self._proving or self._stated_apart(old, new)):
                # Proved the same type, though the IR states the two apart
                # (fresh symbols, or a type the adapter knows to be wrong, as
                # coremltools' select typed without its cond): the consumers'
                # own type inference, which the IR's later passes run, must
                # still take the new operand.
                for consumer in consumers:
                    refusal = self._rejects(consumer, old, new, self._output_types_with)
                    if refusal is not None:
                        return refusal
            return None
        for consumer in consumers:
            refusal = self._consumer_keeps_its_types(consumer, old, new)
            if refusal is not None:
                return refusal
        return None

    def _stated_apart(self, old: Value, new: Value) -> bool:
        if self._stated is None:
            return False
        return self._stated(old) != self._stated(new)

    # ------------------------------------------------------------ the three proofs

    def _same_type(self, old: Value, new: Value, where: str) -> Refusal | None:
        adapter = self.adapter
        return _compare(where, "", (adapter.dtype(old), self._shape(old)), (adapter.dtype(new), self._shape(new)))

    def _same_types(self, old: Value, new: Value) -> bool:
        """`_same_type(old, new) is None`, without the refusal: asked of every
        rewrite first, and most widen or narrow their operand, so the answer
        is usually no, which needs no message."""
        adapter = self.adapter
        dtype = adapter.dtype(old)
        if dtype is None or dtype != adapter.dtype(new):
            return False
        old_shape, new_shape = self._shape(old), self._shape(new)
        if old_shape is None or new_shape is None or len(old_shape) != len(new_shape):
            return False
        for old_dim, new_dim in zip(old_shape, new_shape):
            if not proved_equal(old_dim, new_dim):
                return False
        return True

    def _consumer_keeps_its_types(self, consumer: Op, old: Value, new: Value) -> Refusal | None:
        adapter = self.adapter
        # The consumer's name is looked up for a refusal only (an ONNX node
        # without one is named by its outputs, which costs a join).
        old_dtype = adapter.dtype(old)
        if old_dtype is None or old_dtype != adapter.dtype(new):
            return Refusal(adapter.op_name(consumer),
                           f"dtype {_name(old_dtype)} would become {_name(adapter.dtype(new))}")
        first_refusal = None
        record, broadcasting = self._wide(consumer)
        if record is not None:
            if record.count(old):
                first_refusal = self._wide_keeps_output(consumer, record, old, new)
                if first_refusal is None:
                    return None
        elif broadcasting is not None and any(operand == old for operand in broadcasting):
            first_refusal = self._broadcast_keeps_output(consumer, broadcasting, old, new)
            if first_refusal is None:
                return None
        why = "the backend has no type inference to ask"
        if self._output_types_with is None and self._inferred_output_types is not None:
            return first_refusal or self._what_would_change(consumer, old, new, self._inferred_output_types)
        if self._output_types_with is not None:
            try:
                inferred = self._output_types_with(consumer, old, new)
            except OperandRejected as error:
                # What the broadcast proof found, if it looked, says more about this rewrite.
                return first_refusal or Refusal(
                    adapter.op_name(consumer), f"its type inference rejects the new operand ({error})")
            except TypesUnknown as error:
                inferred, why = None, str(error)
            else:
                why = "its type inference gives none"
            if inferred is not None:
                refusal = self._outputs_equal(consumer, inferred)
                if refusal is None:
                    return None
                first_refusal = first_refusal or refusal
        return first_refusal or Refusal(adapter.op_name(consumer), self._unknown(consumer, old, new, why))

    def _what_would_change(self, consumer: Op, old: Value, new: Value, inferred_output_types: Callable) -> Refusal:
        """The refusal of a consumer no proof covers, from the backend's shape inference
        (`inferred_output_types`), which is quoted but not trusted: the rank, dim or dtype of
        an output that it says would change; or, where it says none would, or cannot say,
        why it is not known."""
        name = self.adapter.op_name(consumer)
        try:
            inferred = inferred_output_types(consumer, old, new)
        except OperandRejected as error:
            return Refusal(name, f"its shape inference rejects the new operand ({error})")
        except TypesUnknown as error:
            return Refusal(name, self._unknown(consumer, old, new, str(error)))
        refusal = self._outputs_equal(consumer, inferred)
        if refusal is not None:
            return refusal
        return Refusal(name, self._unknown(
            consumer, old, new, "the shape inference gives the same types, but it is written for valid graphs "
                                "and does not check the new operand, so it proves nothing"))

    def _unknown(self, consumer: Op, old: Value, new: Value, why: str) -> str:
        """What is not known where no proof says: the consumer's op, the operand, its new value, and why."""
        adapter = self.adapter
        slots = [name for name in adapter.operand_names(consumer) if _holds(adapter.operand(consumer, name), old)]
        where = f"operand {'/'.join(slots)}" if slots else "the operand"
        return (f"its output types with {where} '{adapter.value_name(old)}' replaced by "
                f"'{adapter.value_name(new)}' are not known ({adapter.op_type(consumer)}): {why}")

    def _rejects(self, consumer: Op, old: Value, new: Value, output_types_with: Callable) -> Refusal | None:
        try:
            output_types_with(consumer, old, new)
        except OperandRejected as error:
            name = self.adapter.op_name(consumer)
            return Refusal(name, f"its type inference rejects the new operand ({error})")
        except TypesUnknown:
            pass  # nothing to reject it by: the types were proved the same
        return None

    def _broadcast_keeps_output(
        self, consumer: Op, operands: Sequence[Value], old: Value, new: Value
    ) -> Refusal | None:
        adapter = self.adapter
        outputs = adapter.outputs(consumer)
        result = self._shape(outputs[0]) if outputs else None
        old_shape, new_shape = self._shape(old), self._shape(new)
        shapes = [self._shape(operand) for operand in operands if operand != old]
        if result is None or old_shape is None or new_shape is None or None in shapes:
            return Refusal(adapter.op_name(consumer), "a rank is unknown")
        others = cast("list[tuple]", shapes)  # none is None: that was refused
        rank = len(result)
        new_rank = len(new_shape)
        for shape in others:
            if len(shape) > new_rank:
                new_rank = len(shape)
        if new_rank != rank:
            return Refusal(adapter.op_name(consumer), f"its output rank {rank} would become {new_rank}")
        for axis in range(rank):
            out_dim = result[axis]
            old_dim, new_dim = _aligned(old_shape, axis, rank), _aligned(new_shape, axis, rank)
            if proved_equal(new_dim, old_dim) or proved_equal(new_dim, out_dim):
                continue
            if proved_equal(new_dim, 1) and any(
                proved_equal(_aligned(shape, axis, rank), old_dim) or proved_equal(_aligned(shape, axis, rank), out_dim)
                for shape in others
            ):
                continue
            if proved_equal(old_dim, 1) and any(
                proved_equal(_aligned(shape, axis, rank), new_dim) for shape in others
            ):
                continue  # widened to what another operand already has there, which is 1 or the output's
            return Refusal(adapter.op_name(consumer), f"its output dim {out_dim} is not proved to stay (operand dim "
                                                      f"{old_dim} would become {new_dim})", axis)
        return None

    def _wide(self, consumer: Op) -> tuple[Record | None, Sequence[Value] | None]:
        """The record of a wide consumer every operand of which broadcasts; else
        (None, the operands that broadcast, or None if none does)."""
        listing = self._broadcast_operands
        if listing is None:
            return None, None
        table = self.table
        if table is None or not table.active:
            return None, listing(consumer)
        record = table.records.get(consumer)
        broadcasting = None
        if record is None:
            broadcasting = listing(consumer)
            if broadcasting is None or len(broadcasting) <= table.wide:
                return None, broadcasting
            record = table.record(consumer)
            if record is None:
                return None, broadcasting
        if table.broadcasting(record)[1]:
            return record, None
        return None, broadcasting if broadcasting is not None else listing(consumer)

    def _wide_keeps_output(self, consumer: Op, record: Record, old: Value, new: Value) -> Refusal | None:
        """`_broadcast_keeps_output` from the consumer's summary of its operands' shapes:
        the same verdict, at the cost of its rank and its number of distinct ranks."""
        proving = self._proving
        summary = record.summary(("shapes", proving), lambda: Shapes(lambda value: self._shape_as(value, proving)))
        if summary is None:  # a dim that cannot be counted: the general way
            listing = self._broadcast_operands
            assert listing is not None  # a record is read only of an op the adapter says broadcasts
            return self._broadcast_keeps_output(consumer, listing(consumer), old, new)
        adapter = self.adapter
        outputs = adapter.outputs(consumer)
        result = self._shape(outputs[0]) if outputs else None
        times = record.count(old)
        old_shape, new_shape = summary.of[old], self._shape(new)
        if result is None or old_shape is None or new_shape is None or summary.unknown:
            return Refusal(adapter.op_name(consumer), "a rank is unknown")
        rank = len(result)
        other_rank = summary.max_rank(old_shape, times)
        new_rank = len(new_shape) if other_rank is None else max(len(new_shape), other_rank)
        if new_rank != rank:
            return Refusal(adapter.op_name(consumer), f"its output rank {rank} would become {new_rank}")
        for axis in range(rank):
            out_dim, offset = result[axis], rank - axis
            old_dim, new_dim = _aligned(old_shape, axis, rank), _aligned(new_shape, axis, rank)
            if proved_equal(new_dim, old_dim) or proved_equal(new_dim, out_dim):
                continue
            if proved_equal(new_dim, 1) and (
                summary.aligned_count(offset, old_dim, old_shape, times)
                or summary.aligned_count(offset, out_dim, old_shape, times)
            ):
                continue
            if proved_equal(old_dim, 1) and summary.aligned_count(offset, new_dim, old_shape, times):
                continue
            return Refusal(adapter.op_name(consumer), f"its output dim {out_dim} is not proved to stay (operand dim "
                                                      f"{old_dim} would become {new_dim})", axis)
        return None

    def _outputs_equal(self, consumer: Op, inferred) -> Refusal | None:
        adapter = self.adapter
        name = adapter.op_name(consumer)
        outputs = adapter.outputs(consumer)
        if len(inferred) != len(outputs):
            return Refusal(name, "its number of outputs would change")
        for output, after in zip(outputs, inferred):
            refusal = _compare(name, "output ", (adapter.dtype(output), self._shape(output)), after)
            if refusal is not None:
                return refusal
        return None

    def _shape(self, value: Value) -> Shape:
        shape = self.adapter.shape(value)
        if shape is None:
            return None
        if self._proving and any(not isinstance(d, int) for d in shape):
            shape = self._prove(value)
            if shape is None:
                return None
        return shape if type(shape) is tuple else tuple(shape)

    def _shape_as(self, value: Value, proving: bool) -> Shape:
        """`_shape` as it reads with `_proving` set to `proving`."""
        shape = self.adapter.shape(value)
        if proving and shape is not None and any(not isinstance(d, int) for d in shape):
            shape = self._prove(value)
        return None if shape is None else tuple(shape)

    def _prove(self, value: Value) -> Shape:
        proven = self._proven
        assert proven is not None  # `check` proves only with an adapter that has the proofs
        return proven(value)


def _compare(where: str, what: str, before: tuple, after: tuple) -> Refusal | None:
    """None if the (dtype, dims) `after` is provably the type `before`; else what differs."""
    (old_dtype, old_shape), (new_dtype, new_shape) = before, after
    if old_dtype is None or old_dtype != new_dtype:
        return Refusal(where, f"{what}dtype {_name(old_dtype)} would become {_name(new_dtype)}")
    if old_shape is None or new_shape is None:
        return Refusal(where, f"the {what}rank is unknown")
    if len(old_shape) != len(new_shape):
        return Refusal(where, f"{what}rank {len(old_shape)} would become {len(new_shape)}")
    for axis, (old_dim, new_dim) in enumerate(zip(old_shape, new_shape)):
        if equal(old_dim, new_dim) is not Truth.YES:
            return Refusal(where, f"{what}dim {old_dim} would become {new_dim}", axis)
    return None


def _holds(operand, value: Value) -> bool:
    """Whether an operand (a value, or a variadic operand's values) is or holds `value`."""
    if isinstance(operand, (list, tuple)):
        return any(item is value for item in operand)
    return operand is value


def _aligned(shape: tuple, axis: int, rank: int):
    """numpy's right alignment: the dim of `shape` at `axis` of a rank-`rank` result; 1 where it has none."""
    index = axis - (rank - len(shape))
    return shape[index] if index >= 0 else 1


def _name(dtype) -> str:
    return "unknown" if dtype is None or dtype is UNKNOWN else str(dtype)
