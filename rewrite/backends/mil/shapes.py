"""What the MIL adapter knows of op shapes: which ops broadcast, keep, or follow shapes, and shape helpers."""

from __future__ import annotations

from collections import Counter

import numpy as np

from rewrite.backends.mil.pymil import (
    Operation,
    types,
)
from rewrite.engine import shape_values
from rewrite.engine.shapes import multiply as dims_multiply
from rewrite.language.logic import (
    UNKNOWN,
    Broadcast,
    Difference,
    Local,
    Symbol,
    Term,
    Truth,
    canonical_key,
    equal,
)

UNARY_ELEMENTWISE = frozenset(
    "abs acos asin atan atanh ceil clip cos cosh erf exp exp2 floor inverse log logical_not relu relu6 round "
    "rsqrt sigmoid sigmoid_hard sign silu sin sinh softplus softsign sqrt square tan tanh threshold gelu "
    "elu leaky_relu linear_activation scaled_tanh softmax cast identity".split()
)
BINARY_BROADCASTING = frozenset(
    "add sub mul real_div pow maximum minimum floor_div mod equal not_equal less less_equal greater "
    "greater_equal logical_and logical_or logical_xor".split()
)
REDUCTIONS = frozenset(
    "reduce_sum reduce_mean reduce_max reduce_min reduce_prod reduce_l1_norm reduce_l2_norm reduce_log_sum "
    "reduce_log_sum_exp reduce_sum_square".split()
)
LAYOUT = REDUCTIONS | {"expand_dims", "squeeze", "tile", "transpose"}
# Ops whose output has x's shape.
SAME_SHAPE = frozenset({"layer_norm", "batch_norm", "instance_norm", "l2_norm", "local_response_norm", "band_part"})
# Ops whose output has the indices' shape.
INDICES_SHAPE = frozenset({"gather_along_axis"})
# Ops the torch frontend puts on a flexible sequence's way (see MilAdapter._frontend_shape).
FRONTEND_SHAPES = frozenset(
    {"linear", "scaled_dot_product_attention", "split", "gather", "concat", "range_1d", "slice_by_index", "stack",
     "gather_nd"}
)
SHAPE_FOLLOWS = (
    UNARY_ELEMENTWISE | BINARY_BROADCASTING | LAYOUT | SAME_SHAPE | INDICES_SHAPE | FRONTEND_SHAPES
    | {"select", "fill", "fill_like", "reshape", "matmul"}
)


def shape_operands(op: Operation) -> list:
    """The operands whose shapes an op's output shape follows from."""
    kind = op.op_type
    inputs = op.inputs
    if kind in UNARY_ELEMENTWISE:
        return [inputs["x"]]
    if kind in BINARY_BROADCASTING or kind == "select":
        return [inputs[name] for name in ("cond", "a", "b", "x", "y") if name in inputs]
    if kind == "fill_like":
        return [inputs["ref_tensor"]]
    if kind in LAYOUT:
        return [inputs["x"]]
    if kind == "matmul":
        return [inputs["x"], inputs["y"]]
    if kind in SAME_SHAPE or kind in ("linear", "split", "slice_by_index"):
        return [inputs["x"]]
    if kind == "reshape":
        return [inputs["x"]]
    if kind in INDICES_SHAPE:
        return [inputs["indices"]]
    if kind == "gather":
        return [inputs["x"], inputs["indices"]]
    if kind in ("concat", "stack"):
        return list(inputs["values"])
    if kind == "gather_nd":
        return [inputs["x"], inputs["indices"]]
    if kind == "scaled_dot_product_attention":
        return [inputs["query"], inputs["value"]]
    return []


def never_negative(dim) -> bool:
    """A literal >= 0, or a size, or a sum or product of sizes (not a difference)."""
    pending = [dim]
    while pending:  # a stack, not recursion: a concat's sum of sizes may be thousands deep
        dim = pending.pop()
        if isinstance(dim, int):
            if dim < 0:
                return False
        elif isinstance(dim, Symbol):
            # A coremltools expression is one leaf, named by sympy: one with a minus may be negative.
            if "-" in dim.name:
                return False
        elif isinstance(dim, Local):
            continue  # a value proved non-negative (`ShapeProofs._value_symbol`)
        elif isinstance(dim, Difference) or not isinstance(dim, Term):
            return False
        elif isinstance(dim, Broadcast):
            pending.extend(dim.parts)
        else:  # a sum, product or minimum
            pending.extend((dim.left, dim.right))
    return True


def factors(dims) -> tuple[int, Counter] | None:
    """A product of dims as (literal coefficient, symbols with their powers); None if a dim is unknown."""
    coefficient, symbols = 1, Counter()
    for d in dims:
        if isinstance(d, int):
            coefficient *= d
        elif isinstance(d, Term):
            symbols[d] += 1
        else:
            return None
    return coefficient, symbols


def reshaped(source, shape):
    """A reshape's dims where its shape holds one -1: the element count of `source`
    divided by the other dims, cancelled symbol by symbol."""
    if source is None or any(d is UNKNOWN for d in (*source, *shape)):
        return None
    if any(isinstance(d, int) and (d == 0 or d < -1) for d in shape):
        return None  # 0 copies a dim of x: not followed here
    numerator = factors(source)
    denominator = factors([d for d in shape if d != -1])
    if numerator is None or denominator is None or denominator[0] == 0:
        return None
    coefficient, symbols = numerator
    if coefficient % denominator[0]:
        return None
    remaining = symbols.copy()
    remaining.subtract(denominator[1])
    if any(count < 0 for count in remaining.values()):
        return None
    inferred = coefficient // denominator[0]
    for symbol, count in sorted(remaining.items(), key=lambda item: canonical_key(item[0])):
        for _ in range(count):
            inferred = dims_multiply(inferred, symbol)
    return tuple(inferred if d == -1 else d for d in shape)


def divided(left: list | None, right: list | None) -> list | None:
    """An int real_div of shape values, where it is exact: a literal quotient, or a dim by
    itself, 1 (the torch frontend's tile reps for an expand). At a size 0 the latter
    divides by zero, which leaves the original no defined value to keep."""
    pairs = shape_values.paired(left, right)
    if pairs is None:
        return None
    quotients = []
    for a, b in pairs:
        if isinstance(a, int) and isinstance(b, int) and b != 0 and a % b == 0:
            quotients.append(a // b)
        elif b == 1 and isinstance(b, int) and a is not UNKNOWN:
            quotients.append(a)  # a dim by 1 (a batch repeated: `expand(B, -1, -1)` of a (1, ...) token)
        elif a == b and a is not UNKNOWN:
            quotients.append(1)
        else:
            quotients.append(UNKNOWN)
    return quotients


SHAPE_DTYPES = frozenset({types.int32, types.int64, types.int16, types.uint16, types.int8, types.uint8})
SHAPE_DTYPE_NAMES = frozenset({"int32", "int64", "int16", "uint16", "int8", "uint8"})
SHAPE_ARITHMETIC = {"add": "+", "sub": "-", "mul": "*"}


def provably_same_shape(left, right) -> bool:
    if left is None or right is None or len(left) != len(right):
        return False
    return all(equal(a, b) is Truth.YES for a, b in zip(left, right))


def same_known_dims(left, right) -> bool:
    if left is None or right is None:
        return left is right
    if len(left) != len(right):
        return False
    return all(not (isinstance(a, int) and isinstance(b, int)) or a == b for a, b in zip(left, right))


def describe_type(dtype, shape) -> str:
    dims = "?" if shape is None else ", ".join(str(d) for d in shape)
    return f"{dtype}({dims})"


def as_mil_constant(value):
    if isinstance(value, tuple):  # a variadic operand: values, and constants to make consts of
        return tuple(as_mil_constant(item) for item in value)
    if isinstance(value, list):
        array = np.asarray(value)
        if array.dtype == np.int64:
            array = array.astype(np.int32)
        elif array.dtype == np.float64:
            array = array.astype(np.float32)
        return array
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return np.int32(value)
    if isinstance(value, float):
        return np.float32(value)
    return value


