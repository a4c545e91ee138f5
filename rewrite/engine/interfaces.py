"""What the engine needs from an IR, and nothing more.

A backend implements `Adapter` over its own objects. The engine treats ops,
values and blocks as opaque handles: it only hashes them, compares them with
`==`, and passes them back to the adapter.

The contract has a core every adapter implements and optional parts, each a
`Capability` an adapter declares in its `capabilities` (data, never found
out by probing for methods). The engine calls an optional method only when
its capability is declared, and otherwise does without: a third backend is
written from this module alone, starting with `capabilities = frozenset()`,
and from `rewrite.language.schema` for the op schema its rules are checked
against. `missing_methods` says what a declared capability still lacks.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from rewrite.language.logic import UNKNOWN, Dim

Op = Hashable
Value = Hashable
Block = Hashable


class ModelError(Exception):
    """A model a backend cannot read or index. The message names the file or node.

    Every backend's model errors derive from it, so that a caller (the CLI)
    can report any of them as the user's mistake without knowing the backend.
    """


@dataclass(frozen=True)
class NamedValue:
    """A reference, by name, to a value of a program being built from text (rule examples)."""

    name: str


@dataclass(frozen=True)
class Scaling:
    """One way a dialect spells `k·x` for a constant k: `op_type(value_operand=x, factor_operand=k)`,
    or `x / (1/k)` where `divides`."""

    op_type: str
    value_operand: str
    factor_operand: str
    divides: bool = False


@dataclass(frozen=True)
class ExampleFacts:
    """What `rewrite verify` needs to know of a dialect to build random instances of its rules.

    A backend that builds rule examples (`build_example`) declares these, so
    that the instance generator holds no dialect's spellings of its own.
    """

    opsets: tuple  # None (the backend's default) first, then oldest to newest
    dtypes: tuple[str, ...]  # the data dtype first, then the others an instance may take
    extra_consumer: str  # a unary op that reads any value: a use the rule does not expect
    unary_operand: str  # that op's operand name
    constant_operands: frozenset[str]  # operands that are constants whatever the conditions say
    contractions: frozenset[str]  # ops that contract their operands' matrix axes
    flag_input: tuple  # (name, dtype, dims) of the predicate input of a nested instance
    scalings: tuple[Scaling, ...]  # the spellings of k·x that `unscaled` and `scale_of` see through
    old_broadcast_below: int | None = None  # opsets below this broadcast only when told (`broadcast=1`)
    # The evaluators `evaluate_example(..., engine=)` takes, in the order to try
    # them: both sides of an instance are evaluated by the first that runs the
    # original, as two evaluators need not agree (on a zero's sign, say).
    engines: tuple = (None,)
    # Attributes an op may carry whatever a rule says of them, with the values
    # to try besides the default (ONNX's keepdims=0): a rule that proves them
    # only indirectly (`rank(%mean) == rank(%x)`) is tried where they differ.
    attribute_values: tuple = ()  # (attribute name, (value, ...)), ...


class OperandRejected(Exception):
    """Raised by an adapter's `output_types_with`: the op's own type inference
    refuses the new operand outright (a concat whose other operands no longer
    fit, say), whatever the shapes are proved to be."""


class TypesUnknown(Exception):
    """Raised by an adapter's `output_types_with` where it cannot say, to say why
    (the op has subgraphs, no inference is known for it, an input type is
    unknown): the shape guard's refusal quotes it."""


class TypeChangedError(RuntimeError):
    """A rewrite changed the type of a value it promised to keep (checked mode).

    Raised by adapters; the driver adds the name of the rule that fired.
    """


class Capability(enum.Enum):
    """An optional part of the `Adapter` contract, and the methods it brings.

    What the engine does without each: it lists consumers to count uses
    (USE_INDEX); keeps no verdict about uses between anchors (USES_VERSION);
    takes no op as broadcasting (BROADCASTING); proves consumers' types only by
    the broadcast algebra and same-type replacements (TYPE_INFERENCE), and
    quotes no inference in refusals (INFERRED_TYPES); reads every dim as the
    IR states it (SHAPE_PROOFS, STATED_SHAPES); knows no element of a value
    computed from shapes (SHAPE_VALUES), no input a symbol comes from
    (DIM_SOURCES), no bound of an integer value but a constant's
    (VALUE_BOUNDS), no fill's number (FILLS), no scaling by a constant
    (SCALINGS), no op the target lacks (TARGETS), no attribute default
    (ATTRIBUTE_DEFAULTS); builds an op's type afresh from its operands instead
    of copying it (REBUILD); names no op that lost a dim (UNKNOWN_DIM_ORIGINS);
    counts no ops for the statistics (COUNT_OPS); and releases nothing (RELEASE).
    """

    USE_INDEX = ("has_uses", "use_count")
    USES_VERSION = ("uses_version",)
    BROADCASTING = ("broadcast_operands",)
    TYPE_INFERENCE = ("output_types_with",)
    INFERRED_TYPES = ("inferred_output_types",)
    STATED_SHAPES = ("stated_shape",)
    SHAPE_PROOFS = ("proven_shape",)
    SHAPE_VALUES = ("shape_value",)
    DIM_SOURCES = ("dim_source",)
    VALUE_BOUNDS = ("value_bounds",)
    FILLS = ("fill_value",)
    SCALINGS = ("scaling",)
    TARGETS = ("op_available",)
    ATTRIBUTE_DEFAULTS = ("attribute_default",)
    REBUILD = ("rebuild",)
    UNKNOWN_DIM_ORIGINS = ("unknown_dim_origin",)
    COUNT_OPS = ("count_ops",)
    RELEASE = ("release",)

    @property
    def methods(self) -> tuple[str, ...]:
        return self.value


def missing_methods(adapter: Any) -> list[str]:
    """The methods a declared capability brings that `adapter` does not have (for a backend's tests)."""
    return [name for capability in adapter.capabilities for name in capability.methods
            if not callable(getattr(adapter, name, None))]


class Adapter(Protocol):
    """The engine's view of one program in some IR.

    The methods marked "Optional" belong to a `Capability`: an adapter that
    declares it in `capabilities` implements them, and one that does not
    need not have them.
    """

    dialect: str
    capabilities: frozenset[Capability]

    # ---- structure

    def top_blocks(self) -> Sequence[Block]:
        """The outermost blocks (functions, the main graph)."""

    def operations(self, block: Block) -> Sequence[Op]:
        """A snapshot of the ops of `block`, in program order."""

    def block_outputs(self, block: Block) -> Sequence[Value]:
        """The values `block` returns, in order."""

    def nested_blocks(self, op: Op) -> Sequence[Block]:
        """Blocks owned by `op` (cond branches, loop bodies, subgraphs)."""

    def is_live(self, op: Op) -> bool:
        """False once `op` has been removed from its block."""

    def op_type(self, op: Op) -> str: ...

    def op_name(self, op: Op) -> str: ...

    def block_of(self, op: Op) -> Block: ...

    def has_side_effects(self, op: Op) -> bool:
        """True if `op` must stay even when none of its outputs is used."""

    def operand(self, op: Op, name: str) -> Value | tuple[Value, ...] | None:
        """The operand named `name`: a value, a tuple for a variadic input, or None."""

    def operand_names(self, op: Op) -> Sequence[str]:
        """The names of the operands present on `op`, in schema order."""

    def operands(self, op: Op) -> Sequence[Value]:
        """The operands present, flattened, in schema order."""

    def outputs(self, op: Op) -> Sequence[Value]: ...

    def attribute(self, op: Op, name: str) -> Any:
        """The value of attribute `name` of `op` (a Python value), or None."""

    def attribute_default(self, op: Op, name: str) -> Any:
        """Optional. The value `op`'s schema gives attribute `name` where `op`
        does not set it, at the program's opset; None if it gives none. The
        builtin `attribute` falls back on it."""

    # ---- values

    def producer(self, value: Value) -> Op | None:
        """The op that defines `value`; None for block and function inputs."""

    def defining_block(self, value: Value) -> Block: ...

    def consumers(self, value: Value) -> Sequence[Op]:
        """Distinct ops (in any block) that take `value` as an operand."""

    def is_block_output(self, value: Value) -> bool:
        """True if `value` is an output of any block (a function output included)."""

    def has_uses(self, value: Value) -> bool:
        """Optional. Whether any op takes `value` as an operand or any block
        outputs it, in O(1): `bool(consumers(value)) or is_block_output(value)`
        without listing the consumers. Cleaning up after each rewrite asks it
        of every output of every op it visits, and a value one attention mask
        or `Shape` makes can have thousands of consumers (see `uses_checker`)."""

    def use_count(self, value: Value, limit: int | None = None) -> int:
        """Optional. How many distinct ops take `value` as an operand, what
        `len(consumers(value))` says, without listing them; with `limit`, counted
        no further (the answer is then at most `limit`). O(1), or at most
        O(limit): `one_use` asks it of values a whole model reads, and
        `internal` asks whether there are more consumers than bound ops
        (see `use_counter`)."""

    def uses_version(self, value: Value) -> int:
        """Optional. A number that changes whenever the ops using `value` change
        (one starts or stops using it, or is removed), and may change more
        often; O(1). While it stays the same, `consumers(value)` lists the same
        ops: a quantifier over the uses whose body reads only each use (not
        the anchor's bindings) keeps its verdict per value until then (see
        `uses_versioner`)."""

    def shape(self, value: Value) -> tuple[Dim, ...] | None:
        """The dims of `value`; None when its rank is unknown."""

    def stated_shape(self, value: Value) -> tuple[Dim, ...] | None:
        """Optional. The dims the IR's own type states for `value`, which its
        later passes go by, where `shape` corrects a type the IR gets wrong.
        Where the two values' stated shapes differ, the shape guard has each
        consumer's own type inference (`output_types_with`) take the new one."""

    def proven_shape(self, value: Value) -> tuple[Dim, ...] | None:
        """Optional. `shape(value)` with the dims that shape arithmetic proves
        put in for symbols the IR made up; asked only for dims `shape` leaves
        symbolic, since following the arithmetic costs more."""

    def shape_value(self, value: Value) -> list | None:
        """Optional. The elements of a rank-0 or rank-1 integer value as dims
        (ints and `Term`s, `UNKNOWN` where an element is not proved), where
        the value is computed from shapes; None when it is not followed.
        The builtin `elements` reads it."""

    def unknown_dim_origin(self, value: Value, axis: int) -> Op | None:
        """Optional. The op whose shape inference lost dim `axis` of `value`
        (a dim `shape` gives as unknown): the first op up `value`'s producers
        whose output has that dim unknown while its inputs had it known.
        None when no op lost it (an input was declared so) or the adapter
        cannot tell. `follow_unknown_dim` does the walk for an adapter.
        `rewrite explain` names this op where a condition failed on a `?`."""

    def dim_source(self, dim) -> tuple[Value, int] | None:
        """Optional. (a function input, an axis) whose dim is the symbol `dim` at
        run time; None if no input has it. The builtins `input_of_dim` and
        `axis_of_dim` read it."""

    def output_types_with(self, op: Op, old: Value, new: Value) -> list | None:
        """Optional. The (dtype, dims) of `op`'s outputs were its operand `old`
        replaced by `new`, by the IR's own type inference; None if it cannot
        say, or raises `TypesUnknown` saying why it cannot. Raises
        `OperandRejected` when that inference refuses `new`. The op is left
        as it was. The shape guard's third proof."""

    def inferred_output_types(self, op: Op, old: Value, new: Value) -> list | None:
        """Optional, for an adapter without `output_types_with`. What the backend's
        own shape inference gives `op`'s outputs, as `output_types_with` would, where
        that inference cannot be trusted as a proof (it is written for valid
        graphs): the shape guard quotes it in a refusal, to say what would change.
        Raises `OperandRejected` and `TypesUnknown` as `output_types_with` does."""

    def value_bounds(self, value: Value) -> tuple[int | None, int | None]:
        """Optional. The least and greatest element of an integer or bool value,
        each None where not proved; the builtins `lower_bound` and `upper_bound`
        read it (without it only a constant has bounds)."""

    def fill_value(self, value: Value) -> float | None:
        """Optional. The one number a value made by a fill op holds everywhere
        (Core ML's `fill`); None if it is no such value. `uniform` reads it."""

    def scaling(self, op: Op) -> tuple[Value, float] | None:
        """Optional. (x, k) where `op` computes k·x for a finite constant k that
        cannot widen x; `unscaled` and `scale_of` walk chains of these."""

    def op_available(self, op_type: str) -> bool | None:
        """Optional. Whether new ops of `op_type` may be built in this program
        (its opset or deployment target has them); None if it cannot tell."""

    def dtype(self, value: Value) -> str | None:
        """A dtype name such as "fp32", "int32", "bool"; None if unknown."""

    def constant(self, value: Value) -> np.ndarray | None:
        """The value's compile-time constant, or None."""

    def value_name(self, value: Value) -> str: ...

    # ---- mutation

    def build(self, op_type: str, operands: dict[str, Any], before: Op, name: str) -> Value:
        """Insert a new op before `before`, in the same block; return its output.

        Operands are values of this program or plain Python/numpy constants.
        """

    def rebuild(self, op: Op, changes: dict[str, Any], before: Op, name: str) -> Value:
        """Optional. A copy of `op` with the operands (and attributes) in `changes`
        replaced, inserted before `before`; its first output. Without it the
        engine builds the op's type from its operands, which is enough for an
        IR whose attributes are operands (MIL)."""

    def replace_all_uses(self, old: Value, new: Value) -> None:
        """Redirect every use of `old` (ops and block outputs) to `new`.

        A function output keeps its name.
        """

    def replace_operand(self, op: Op, old: Value, new: Value) -> None:
        """Make `op` use `new` wherever it uses `old`; other uses of `old` stay."""

    def remove_op(self, op: Op) -> None:
        """Remove an op none of whose outputs is used."""

    def finish(self) -> None:
        """Called once when a run ends: settle bookkeeping deferred during it."""

    def count_ops(self) -> int:
        """Optional. Ops in the program, nested blocks included; read from the
        index when a run starts and after `finish`, for the statistics."""

    def release(self) -> None:
        """Optional. Called by `RuleSet.apply`, which made the adapter, once it
        is done with it: drop whatever index the adapter built."""


# ---------------------------------------------------------------- helpers for the engine


def has(adapter: Adapter, capability: Capability) -> bool:
    """Whether `adapter` declares `capability`."""
    return capability in adapter.capabilities


def uses_checker(adapter: Adapter) -> Callable[[Value], bool]:
    """`adapter.has_uses`, or the same answer from `consumers` for an adapter without a use index.

    The fallback lists the consumers, so it costs as many as the value has:
    an adapter over an IR that keeps its uses should have `USE_INDEX`.
    """
    if has(adapter, Capability.USE_INDEX):
        return adapter.has_uses
    consumers, is_block_output = adapter.consumers, adapter.is_block_output
    return lambda value: bool(consumers(value)) or is_block_output(value)


def use_counter(adapter: Adapter) -> Callable[..., int]:
    """`adapter.use_count`, or the same answer from `consumers` for an adapter without a use index.

    The fallback lists the consumers, so it costs as many as the value has.
    """
    if has(adapter, Capability.USE_INDEX):
        return adapter.use_count
    consumers = adapter.consumers

    def count(value: Value, limit: int | None = None) -> int:
        found = len(consumers(value))
        return found if limit is None else min(found, limit)

    return count


def uses_versioner(adapter: Adapter) -> Callable[[Value], int] | None:
    """`adapter.uses_version`, or None for an adapter without `USES_VERSION`: then
    nothing about a value's uses is kept from one anchor to the next."""
    return adapter.uses_version if has(adapter, Capability.USES_VERSION) else None


def optional(adapter: Adapter, capability: Capability) -> Callable | None:
    """The one method `capability` brings, if `adapter` declares it; else None."""
    (name,) = capability.methods
    return getattr(adapter, name) if has(adapter, capability) else None


# ---------------------------------------------------------------- helpers for adapters

# (op, axis of its output) -> the (operand, axis) pairs that dim is computed
# from, axis None for an operand of unknown rank; None when the adapter does
# not know how the op maps axes.
AxisMap = Callable[[Op, int], "Sequence[tuple[Value, int | None]] | None"]

# Beyond any chain of producers worth walking to explain one dim.
_MAX_STEPS = 100_000


def follow_unknown_dim(adapter: Adapter, value: Value, axis: int, carried: AxisMap | None = None) -> Op | None:
    """`Adapter.unknown_dim_origin` by walking producers: the op that lost dim `axis` of `value`.

    At each op the walk asks `carried` which operand dims the unknown one is
    computed from (by default, for the ops the adapter says broadcast, the
    right-aligned dims of those operands). If one of them is unknown too, the
    dim was lost further up, and the walk follows the first such operand.
    Otherwise this op lost it. Where the axes do not map, the walk follows
    the first operand with any unknown dim or rank; an op none of whose
    operands has one lost the dim itself.
    """
    shape = adapter.shape(value)
    if shape is None or not -len(shape) <= axis < len(shape) or shape[axis] is not UNKNOWN:
        return None
    position: int | None = axis % len(shape)
    broadcast = optional(adapter, Capability.BROADCASTING)
    for _ in range(_MAX_STEPS):
        op = adapter.producer(value)
        if op is None:
            return None  # an input declared so: no op lost it
        mapped = carried(op, position) if carried is not None and position is not None else None
        if mapped is None and position is not None and broadcast is not None:
            mapped = _right_aligned(adapter, broadcast(op), value, position)
        if mapped is None:
            mapped = [(operand, None) for operand in adapter.operands(op)]
        upstream = next(((v, a) for v, a in mapped if _unknown_at(adapter, v, a)), None)
        if upstream is None:
            return op
        value, position = upstream
    return None


def _right_aligned(adapter: Adapter, operands, output: Value, axis: int):
    """The dims that broadcast into dim `axis` of `output` (numpy's right alignment)."""
    if operands is None:
        return None
    shape = adapter.shape(output)
    assert shape is not None  # the walk has an axis only of a value whose rank is known
    rank = len(shape)
    pairs: list[tuple[Value, int | None]] = []
    for operand in operands:
        shape = adapter.shape(operand)
        if shape is None:
            pairs.append((operand, None))
        elif axis - (rank - len(shape)) >= 0:
            pairs.append((operand, axis - (rank - len(shape))))
    return pairs


def _unknown_at(adapter: Adapter, value: Value, axis: int | None) -> bool:
    """Whether `value`'s dim `axis` (any dim, for None) or its rank is unknown."""
    if value is None or isinstance(value, tuple):
        return False
    shape = adapter.shape(value)
    if shape is None:
        return True
    if axis is None:
        return any(dim is UNKNOWN for dim in shape)
    return 0 <= axis < len(shape) and shape[axis] is UNKNOWN
