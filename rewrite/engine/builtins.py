"""The builtins conditions call: one definition each, with its three-valued semantics.

Each takes the adapter first, then the rule's arguments, already evaluated.
Numbers are ints, floats, symbolic dims (`Term`s) or `UNKNOWN`; lists are Python lists
(or `UNKNOWN`); booleans are `Truth`. Whatever cannot be read off the graph
is `UNKNOWN` (or `Truth.UNKNOWN` for a yes/no builtin), so that it can never
make a rule fire.

`REGISTRY` names them all, each with what its unknown answer means in a
rule author's words (`Builtin.unknown`), which `explain` quotes, and
whether a run can change its answer for the same arguments
(`Builtin.stable`), which decides what the engine may keep between anchors.
The signatures the checker enforces are in `rewrite.language.types.BUILTINS`.

One module, though long: it is the registry, one definition per builtin with
its three-valued semantics and explanation text, which the issue asked to keep
in one place; each entry is short and independent.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rewrite.engine.interfaces import Adapter, Capability, optional, use_counter
from rewrite.engine.matcher import ABSENT
from rewrite.engine.operands import OperandsExcept
from rewrite.language.logic import UNKNOWN, Term, Truth, equal, is_literal
from rewrite.language.types import BUILTINS, Type


@dataclass(frozen=True)
class Builtin:
    """One builtin: its function, whether a run can change its answer, and what an unknown answer means."""

    name: str
    function: Callable
    stable: bool  # the same arguments give the same answer for the whole run
    unknown: str  # why it answers "unknown", said to a rule author



# builtin -> (positions, keyword names) of its graph-value parameters; computed
# once, since every call of a builtin checks them.
_VALUE_PARAMETERS = {
    name: (
        tuple(i for i, p in enumerate(signature.positional) if p.type is Type.VALUE),
        tuple(n for n, p in signature.keywords.items() if p.type is Type.VALUE),
    )
    for name, signature in BUILTINS.items()
}


def _missing_value(function: str, arguments, keywords) -> bool:
    positions, names = _VALUE_PARAMETERS[function]
    for position in positions:
        if position < len(arguments):
            argument = arguments[position]
            if argument is ABSENT or argument is UNKNOWN or argument is None:
                return True
    for name in names:
        argument = keywords.get(name)
        if argument is ABSENT or argument is UNKNOWN:
            return True
    return False


def _equal(left, right) -> Truth:
    if isinstance(left, list) and isinstance(right, list):
        if len(left) != len(right):
            return Truth.NO
        result = Truth.YES
        for a, b in zip(left, right):
            result = result & _equal(a, b)
        return result
    if isinstance(left, Truth) and isinstance(right, Truth):
        if Truth.UNKNOWN in (left, right):
            return Truth.UNKNOWN
        return Truth.of(left is right)
    if isinstance(left, list) or isinstance(right, list):
        return Truth.UNKNOWN if UNKNOWN in (left, right) else Truth.NO
    return equal(left, right)


def _arithmetic(operator: str, left, right):
    if not (is_literal(left) and is_literal(right)):
        return UNKNOWN
    if operator == "+":
        return left + right
    if operator == "-":
        return left - right
    if operator == "*":
        return left * right
    if right == 0:
        return UNKNOWN
    quotient = left / right
    if isinstance(left, int) and isinstance(right, int) and left % right == 0:
        return left // right
    return quotient


def _shape(adapter: Adapter, value):
    if value is None or value is UNKNOWN or value is ABSENT or isinstance(value, (list, tuple)):
        return None
    return adapter.shape(value)


def _proven(adapter: Adapter, value, shape):
    """`shape`, or where it has a dim that is no literal, what the adapter can
    prove about it by following shape arithmetic (asked only then: it costs more)."""
    prove = optional(adapter, Capability.SHAPE_PROOFS)
    if prove is None or (shape is not None and all(is_literal(d) for d in shape)):
        return shape
    return prove(value)


def _axis(axis, rank: int):
    if type(axis) is int:
        return axis + rank if -rank <= axis < 0 else (axis if 0 <= axis < rank else None)
    if not is_literal(axis) or axis != int(axis):
        return None
    axis = int(axis)
    if axis < 0:
        axis += rank
    return axis if 0 <= axis < rank else None


def _rank(adapter, value):
    shape = _shape(adapter, value)
    if shape is None:
        shape = _proven(adapter, value, shape)
    return UNKNOWN if shape is None else len(shape)


def _dim(adapter, value, axis):
    shape = _shape(adapter, value)
    if shape is None:
        shape = _proven(adapter, value, shape)
        if shape is None:
            return UNKNOWN
    index = _axis(axis, len(shape))
    if index is None:
        return UNKNOWN
    dim = shape[index]
    if type(dim) is int or is_literal(dim):
        return dim
    return _proven(adapter, value, shape)[index]


def _shape_list(adapter, value):
    shape = _shape(adapter, value)
    shape = _proven(adapter, value, shape)
    return UNKNOWN if shape is None else list(shape)


def _axes(adapter, value):
    rank = _rank(adapter, value)
    return UNKNOWN if rank is UNKNOWN else list(range(rank))


def _aligned_dim(adapter, value, axis, of):
    offset = _aligned_offset(adapter, axis, of)
    return UNKNOWN if offset is None else _right_dim(adapter, value, offset)


def _aligned_offset(adapter, axis, of) -> int | None:
    """Where `axis` of `of` is counted from the right (1 for the last axis);
    None when `of`'s rank is unknown or it has no such axis."""
    reference = _shape(adapter, of)
    if reference is None:
        reference = _proven(adapter, of, reference)
    if reference is None:
        return None
    index = _axis(axis, len(reference))
    return None if index is None else len(reference) - index


def _right_dim(adapter, value, offset: int):
    """The dim of `value` `offset` axes from the right (1 beyond its rank): its
    dim aligned, numpy's way, with an axis that far from the right of another value."""
    shape = _shape(adapter, value)
    if shape is None:
        shape = _proven(adapter, value, shape)
    if shape is None:
        return UNKNOWN
    position = len(shape) - offset
    if position < 0:
        return 1
    dim = shape[position]
    if type(dim) is int or is_literal(dim):
        return dim
    return _proven(adapter, value, shape)[position]


def _constant(adapter, value):
    if value is None or value is UNKNOWN or value is ABSENT or isinstance(value, (list, tuple)):
        return None
    return adapter.constant(value)


def _absent(adapter, value):
    return Truth.of(value is ABSENT)


def _is_const(adapter, value):
    return Truth.of(_constant(adapter, value) is not None)


def _const(adapter, value):
    constant = _constant(adapter, value)
    return UNKNOWN if constant is None else np.asarray(constant).tolist()


def _is_symbolic(adapter, dim):
    if dim is UNKNOWN:
        return Truth.UNKNOWN
    return Truth.of(isinstance(dim, Term))


def _is_known(adapter, dim):
    return Truth.of(is_literal(dim) and not (isinstance(dim, float) and math.isnan(dim)))


def _dtype(adapter, value):
    if value is None or value is UNKNOWN or value is ABSENT:
        return UNKNOWN
    dtype = adapter.dtype(value)
    return UNKNOWN if dtype is None else dtype


def _use_count(adapter, value):
    return use_counter(adapter)(value)


def _one_use(adapter, value):
    # Counted up to 2: a value every layer reads is not listed to say it has more than one use.
    return Truth.of(use_counter(adapter)(value, 2) == 1 and not adapter.is_block_output(value))


def _block_output(adapter, value):
    return Truth.of(adapter.is_block_output(value))


def _is_input(adapter, value):
    if value is None or value is UNKNOWN or value is ABSENT or isinstance(value, (list, tuple, OperandsExcept)):
        return Truth.UNKNOWN
    return Truth.of(adapter.producer(value) is None)


def _same_block(adapter, value, other):
    if value is None or other is None:
        return Truth.NO
    return Truth.of(adapter.defining_block(value) == adapter.defining_block(other))


def _broadcasts(adapter, value):
    op = adapter.producer(value) if value is not None and value is not UNKNOWN else None
    if op is None:
        return Truth.NO
    broadcast_operands = optional(adapter, Capability.BROADCASTING)
    if broadcast_operands is None:
        return Truth.UNKNOWN
    return Truth.of(broadcast_operands(op) is not None)


def _op_type(adapter, value):
    op = adapter.producer(value) if value is not None else None
    return UNKNOWN if op is None else adapter.op_type(op)


def _attribute(adapter, value, name, default=None):
    # What the op sets; else what its schema says it has unset (the backend's
    # `attribute_default`); else the rule's own `default=`; else unknown.
    op = adapter.producer(value) if value is not None and value is not UNKNOWN else None
    if op is None or not isinstance(name, str):
        return UNKNOWN
    found = adapter.attribute(op, name)
    if found is None:
        schema_default = optional(adapter, Capability.ATTRIBUTE_DEFAULTS)
        if schema_default is not None:
            found = schema_default(op, name)
    if found is None:
        found = default
    return UNKNOWN if found is None else found


def _normalized_axes(adapter, axes, rank):
    if is_literal(axes):
        axes = [axes]
    if not isinstance(axes, list) or not is_literal(rank) or rank != int(rank):
        return UNKNOWN
    rank = int(rank)
    positions = set()
    for axis in axes:
        if not is_literal(axis) or axis != int(axis) or not -rank <= int(axis) < rank:
            return UNKNOWN
        positions.add(int(axis) % rank)
    return sorted(positions)


_NUMPY_TYPES = {
    "bool": np.bool_, "int8": np.int8, "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16,
    "int32": np.int32, "uint32": np.uint32, "int64": np.int64, "uint64": np.uint64,
    "fp16": np.float16, "fp32": np.float32, "fp64": np.float64,
}


def _zero_of(adapter, dtype):
    kind = _NUMPY_TYPES.get(dtype) if isinstance(dtype, str) else None
    return UNKNOWN if kind is None else kind(0)


def _lowest(adapter, dtype):
    if not isinstance(dtype, str):
        return UNKNOWN
    if dtype in ("fp16", "fp32", "fp64", "bf16"):
        return float("-inf")
    if dtype == "bool":
        return 0
    try:
        return int(np.iinfo(np.dtype(dtype)).min)
    except TypeError:
        return UNKNOWN


# bfloat16 has fp32's exponent and 8 bits of precision; numpy has no such type.
_BF16_MAX = float.fromhex("0x1.fep127")


def _finite_range(dtype) -> tuple[int | float, int | float] | None:
    """The most negative and the largest finite value of `dtype`, as Python numbers."""
    if not isinstance(dtype, str):
        return None
    if dtype == "bf16":
        return -_BF16_MAX, _BF16_MAX
    if dtype == "bool":
        return 0, 1
    kind = _NUMPY_TYPES.get(dtype)
    if kind is None:
        return None
    if np.issubdtype(kind, np.floating):
        floats = np.finfo(kind)
        return float(floats.min), float(floats.max)
    ints = np.iinfo(kind)
    return int(ints.min), int(ints.max)


def _max_finite(adapter, dtype):
    found = _finite_range(dtype)
    return UNKNOWN if found is None else found[1]


def _lowest_finite(adapter, dtype):
    found = _finite_range(dtype)
    return UNKNOWN if found is None else found[0]


def _max_of(adapter, items):
    flat = np.asarray(items, dtype=object).reshape(-1).tolist() if isinstance(items, list) else [items]
    if not flat or not all(is_literal(v) for v in flat):
        return UNKNOWN
    if any(isinstance(v, float) and math.isnan(v) for v in flat):
        return UNKNOWN
    return max(flat)


def _max_abs(adapter, items):
    """The largest |element| of a value's constant (read as one array, however big), or of
    a (nested) list or number; unknown with a NaN, an empty one, or no constant."""
    if isinstance(items, (list, int, float)) and not isinstance(items, bool):
        array = np.asarray(items, dtype=object).reshape(-1)
        if array.size == 0 or not all(is_literal(v) for v in array.tolist()):
            return UNKNOWN
        array = array.astype(np.float64)
    else:
        if items is None or items is UNKNOWN or items is ABSENT or isinstance(items, (tuple, OperandsExcept)):
            return UNKNOWN
        constant = adapter.constant(items)
        if constant is None:
            return UNKNOWN
        array = np.asarray(constant)
        if array.size == 0 or array.dtype.kind not in "biuf":
            return UNKNOWN
    if array.dtype.kind == "f" and np.isnan(array).any():
        return UNKNOWN
    return np.abs(array).max().item()


def _contains(adapter, items, item):
    if not isinstance(items, (list, tuple)):
        return Truth.UNKNOWN
    result = Truth.NO
    for element in items:
        result = result | _equal(element, item)
        if result is Truth.YES:
            break
    return result


def _gather(adapter, items, indices):
    if not isinstance(items, list) or not isinstance(indices, list):
        return UNKNOWN
    picked = []
    for index in indices:
        if not is_literal(index) or index != int(index) or not -len(items) <= int(index) < len(items):
            return UNKNOWN
        picked.append(items[int(index)])
    return picked


# dtype -> the dtypes that hold each of its values exactly.
_EXACT_IN = {
    "bool": {"bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
             "fp16", "bf16", "fp32", "fp64"},
    "int8": {"int8", "int16", "int32", "int64", "fp16", "fp32", "fp64"},
    "uint8": {"uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "fp16", "fp32", "fp64"},
    "int16": {"int16", "int32", "int64", "fp32", "fp64"},
    "uint16": {"uint16", "int32", "uint32", "int64", "uint64", "fp32", "fp64"},
    "int32": {"int32", "int64", "fp64"},
    "uint32": {"uint32", "int64", "uint64", "fp64"},
    "int64": {"int64"},
    "uint64": {"uint64"},
    "fp16": {"fp16", "fp32", "fp64"},
    "bf16": {"bf16", "fp32", "fp64"},
    "fp32": {"fp32", "fp64"},
    "fp64": {"fp64"},
}


def _represents(adapter, wide, narrow):
    if not isinstance(wide, str) or not isinstance(narrow, str):
        return Truth.UNKNOWN
    if narrow not in _EXACT_IN:
        return Truth.UNKNOWN
    return Truth.of(wide in _EXACT_IN[narrow])


def _len(adapter, items):
    return len(items) if isinstance(items, (list, tuple, OperandsExcept)) else UNKNOWN


# The longest list `range` makes: a rule reads lists of axes or builds a table
# of positions; one past this (a bound such as int32's maximum) is no list to hold.
RANGE_LIMIT = 1 << 20


def _range(adapter, stop):
    if not is_literal(stop) or stop != int(stop) or stop > RANGE_LIMIT:
        return UNKNOWN
    return list(range(int(stop)))


def _abs(adapter, x):
    return abs(x) if is_literal(x) else UNKNOWN


def _available(adapter, op_type):
    check = optional(adapter, Capability.TARGETS)
    if check is None or not isinstance(op_type, str):
        return Truth.UNKNOWN
    found = check(op_type)
    return Truth.UNKNOWN if found is None else Truth.of(found)


def _every_row_any(adapter, items):
    if not isinstance(items, list):
        return Truth.UNKNOWN
    rows = np.asarray(items, dtype=object)
    if rows.ndim == 0 or rows.size == 0:
        return Truth.UNKNOWN
    return Truth.of(bool(rows.astype(bool).any(axis=-1).all()))


def _sqrt(adapter, x):
    return math.sqrt(x) if is_literal(x) and x >= 0 else UNKNOWN


def _mod(adapter, x, y):
    if not (is_literal(x) and is_literal(y)) or y == 0:
        return UNKNOWN
    return x % y


def _flat_numbers(items) -> list | None:
    """The elements of a number or (nested) list, as Python numbers; None if any is not one."""
    flat = np.asarray(items, dtype=object).reshape(-1).tolist() if isinstance(items, list) else [items]
    if not all(is_literal(v) or isinstance(v, bool) for v in flat):
        return None
    return [float(v) for v in flat]


def _all_of(items, test) -> Truth:
    flat = _flat_numbers(items)
    if flat is None or not flat:
        return Truth.UNKNOWN
    return Truth.of(all(test(v) for v in flat))


def _is_nan(adapter, items):
    return _all_of(items, math.isnan)


def _is_inf(adapter, items):
    return _all_of(items, math.isinf)


def _is_finite(adapter, items):
    return _all_of(items, math.isfinite)


_FLOAT_TYPES = {"fp16": np.float16, "fp32": np.float32, "fp64": np.float64}


def _close(adapter, x, y, abs=0.0, rel=0.0, ulps=0, dtype=None):  # noqa: A002 - the rule's own names
    """|x - y| within the largest of the tolerances given (exactly equal when none is)."""
    if not (is_literal(x) and is_literal(y)):
        return Truth.UNKNOWN
    tolerances = (abs, rel, ulps)
    if not all(is_literal(t) and t >= 0 for t in tolerances):
        return Truth.UNKNOWN
    if math.isnan(x) or math.isnan(y):
        return Truth.NO
    if math.isinf(x) or math.isinf(y):
        return Truth.of(x == y)
    allowed = max(abs, rel * math.fabs(y))
    if ulps:
        kind = _FLOAT_TYPES.get(dtype) if isinstance(dtype, str) else None
        if kind is None:
            return Truth.UNKNOWN  # an ulp of no known float dtype
        allowed = max(allowed, ulps * float(np.spacing(kind(math.fabs(y)))))
    return Truth.of(math.fabs(x - y) <= allowed)


def _as_dtype(adapter, items, dtype):
    kind = _NUMPY_TYPES.get(dtype) if isinstance(dtype, str) else None
    flat = _flat_numbers(items)
    if kind is None or flat is None:
        return UNKNOWN
    return np.asarray(items, dtype=np.float64).astype(kind)


def _uniform(adapter, value):
    """The one number every element of `value` holds, read from a constant or a fill."""
    constant = _constant(adapter, value)
    if constant is not None:
        flat = np.asarray(constant).reshape(-1)
        if flat.size == 0 or flat.dtype.kind not in "biuf" or not (flat == flat[0]).all():
            return UNKNOWN
        return flat[0].item() if flat.dtype.kind != "b" else int(flat[0])
    fill_value = optional(adapter, Capability.FILLS)
    found = fill_value(value) if fill_value is not None else None
    return UNKNOWN if found is None else found


def _scaling_chain(adapter, value):
    """Walk down constant scalings from `value`: (the value scaled, the product of factors).

    Each step below the top must have no other use, so the chain can fold away.
    """
    scaling = optional(adapter, Capability.SCALINGS)
    count_uses = use_counter(adapter)
    factor = 1.0
    current = value
    while scaling is not None:
        op = adapter.producer(current)
        step = scaling(op) if op is not None else None
        if step is None:
            break
        if current is not value and (count_uses(current, 2) != 1 or adapter.is_block_output(current)):
            break
        current, by = step
        factor *= by
    return current, factor


def _value_bounds(adapter, value) -> tuple:
    """(least, greatest) element of an integer or bool value, each None where unproved.

    The adapter's `value_bounds` follows producers; without one, only a
    constant has bounds. Floats have none: a NaN element is below and above
    every bound, and a proof that ignored it would let a rule fire on one.
    """
    if value is None or value is UNKNOWN or value is ABSENT or isinstance(value, (list, tuple)):
        return None, None
    proved = optional(adapter, Capability.VALUE_BOUNDS)
    if proved is not None:
        return proved(value)
    constant = adapter.constant(value)
    if constant is None:
        return None, None
    array = np.asarray(constant)
    if array.size == 0 or array.dtype.kind not in "biu":
        return None, None
    return int(array.min()), int(array.max())


def _lower_bound(adapter, value):
    least = _value_bounds(adapter, value)[0]
    return UNKNOWN if least is None else least


def _upper_bound(adapter, value):
    greatest = _value_bounds(adapter, value)[1]
    return UNKNOWN if greatest is None else greatest


def _elements(adapter, value):
    """The elements of an integer value, flattened, as proved for run time: a
    constant's, or what a backend's shape-value analysis follows (`shape`,
    slices, gathers, concats and arithmetic of dims: numbers and symbols)."""
    if value is None or value is UNKNOWN or value is ABSENT or isinstance(value, (list, tuple, OperandsExcept)):
        return UNKNOWN
    follow = optional(adapter, Capability.SHAPE_VALUES)
    items = follow(value) if follow is not None else None
    if items is not None:
        return list(items)
    constant = adapter.constant(value)
    if constant is None:
        return UNKNOWN
    array = np.asarray(constant)
    if array.dtype.kind not in "biu":
        return UNKNOWN
    return [int(v) for v in array.reshape(-1)]


def _dim_source(adapter, dim):
    find = optional(adapter, Capability.DIM_SOURCES)
    if find is None or not isinstance(dim, Term):
        return None
    return find(dim)


def _input_of_dim(adapter, dim):
    source = _dim_source(adapter, dim)
    return UNKNOWN if source is None else source[0]


def _axis_of_dim(adapter, dim):
    source = _dim_source(adapter, dim)
    return UNKNOWN if source is None else source[1]


def _unscaled(adapter, value):
    return _scaling_chain(adapter, value)[0]


def _scale_of(adapter, value):
    return _scaling_chain(adapter, value)[1]


def _registry(*entries) -> dict[str, Builtin]:
    return {name: Builtin(name, function, stable, unknown) for name, function, stable, unknown in entries}


_SHAPE = "the value's shape (its rank, or that dim) is not known, or the axis is not one of its axes"
_CONSTANT = "the value is not a constant the engine can read"
_NUMBER = "an argument is not a known number"
_DTYPE = "the argument is not a dtype the engine knows"
_LIST = "an argument is not a known list"
_VALUE = "the argument is not a value of the graph"

# Every builtin, with whether a run can change its answer for the same
# arguments: those reading uses (`use_count`, `one_use`, `block_output`, the
# scaling chain's, `internal`) or following producers' operands
# (`elements`, the bounds) can; those reading a value's type (which the
# shape guard keeps), constant, producer and its attributes, or computing
# on numbers and lists, cannot.
REGISTRY: dict[str, Builtin] = _registry(
    ("is_nan", _is_nan, True, "an element is not a known number"),
    ("is_inf", _is_inf, True, "an element is not a known number"),
    ("is_finite", _is_finite, True, "an element is not a known number"),
    ("close", _close, True, "a side or a tolerance is not a known number (or ulps of no float dtype)"),
    ("as_dtype", _as_dtype, True, "the numbers or the dtype are not known"),
    ("uniform", _uniform, True, "the value is not a constant or a fill holding one number everywhere"),
    ("unscaled", _unscaled, False, _VALUE),
    ("scale_of", _scale_of, False, _VALUE),
    ("rank", _rank, True, "the value's rank is not known"),
    ("dim", _dim, True, _SHAPE),
    ("shape", _shape_list, True, "the value's rank is not known"),
    ("axes", _axes, True, "the value's rank is not known"),
    ("aligned_dim", _aligned_dim, True, "the rank of the value aligned with is not known, or " + _SHAPE),
    ("is_const", _is_const, True, _VALUE),
    ("absent", _absent, True, _VALUE),
    ("const", _const, True, _CONSTANT),
    ("is_symbolic", _is_symbolic, True, "the dim is not known at all"),
    ("is_known", _is_known, True, "never: a dim is known or it is not"),
    ("dtype", _dtype, True, "the value's dtype is not known"),
    ("use_count", _use_count, False, _VALUE),
    ("one_use", _one_use, False, _VALUE),
    ("block_output", _block_output, False, _VALUE),
    ("is_input", _is_input, True, _VALUE),
    ("same_block", _same_block, True, _VALUE),
    ("broadcasts", _broadcasts, True, "the backend does not say which ops broadcast"),
    ("op_type", _op_type, True, "the value is a graph input: no op produces it"),
    ("attribute", _attribute, True, "the op has no such attribute, or the value has no producing op"),
    ("contains", _contains, True, _LIST),
    ("gather", _gather, True, "the list or an index is not known, or an index is out of range"),
    ("lowest", _lowest, True, _DTYPE),
    ("max_finite", _max_finite, True, _DTYPE),
    ("lowest_finite", _lowest_finite, True, _DTYPE),
    ("zero_of", _zero_of, True, _DTYPE),
    ("max_of", _max_of, True, "an element is not a known number, or one is NaN"),
    ("max_abs", _max_abs, True, "the value is not a readable constant, is empty, or holds NaN"),
    ("normalized_axes", _normalized_axes, True, "an axis or the rank is not known, or an axis is out of range"),
    ("represents", _represents, True, _DTYPE),
    ("len", _len, True, _LIST),
    ("range", _range, True, "the bound is not a known whole number (or is past RANGE_LIMIT)"),
    ("abs", _abs, True, _NUMBER),
    ("sqrt", _sqrt, True, "the argument is not a known number at least 0"),
    ("every_row_any", _every_row_any, True, "the argument is not a known, non-empty list"),
    ("lower_bound", _lower_bound, False, "no bound on the value's elements is proved"),
    ("upper_bound", _upper_bound, False, "no bound on the value's elements is proved"),
    ("elements", _elements, False, "the value's elements are not known at compile time"),
    ("input_of_dim", _input_of_dim, False, "the dim is not a symbol the backend can trace to an input"),
    ("axis_of_dim", _axis_of_dim, False, "the dim is not a symbol the backend can trace to an input"),
    ("available", _available, False, "the backend cannot say whether the op exists at the program's target"),
    ("mod", _mod, True, "an argument is not a known number, or the divisor is 0"),
)
# `internal(%v)` is the compiler's own: it reads the rule's bindings, not just the adapter.
INTERNAL = Builtin("internal", None, False, _VALUE)  # type: ignore[arg-type]

STABLE = frozenset(name for name, builtin in REGISTRY.items() if builtin.stable)


def function_of(name: str) -> Callable:
    """The function of builtin `name`."""
    return REGISTRY[name].function


def missing_result(name: str):
    """What builtin `name` answers when a graph-value argument is absent or unknown."""
    return Truth.UNKNOWN if BUILTINS[name].result is Type.BOOL else UNKNOWN
