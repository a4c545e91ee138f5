"""Bounds on the elements of integer and bool MIL values, proved from their producers.

`lower_bound`/`upper_bound` in a rule ask this: a gather guard
`select(i >= 0, i, i + n)` can go where every index is provably at least 0,
as it is for a `range_1d` from 0 or a slice of constant positions.

A bound is a proof about every element at run time, so:
- only integer and bool values have bounds (a NaN is below and above
  every number, so no float bound would be sound);
- arithmetic whose result may leave the dtype's range (and wrap) proves
  nothing;
- anything not listed proves nothing (None).

Rewrites replace values by equal ones, so a bound proved once stays true:
the adapter caches them for the whole run.
"""

from __future__ import annotations

import numpy as np

from rewrite.backends.mil.pymil import Var, types

Bounds = tuple[int | None, int | None]
UNBOUNDED: Bounds = (None, None)

# Ops whose output elements are all elements of their operand `x`.
_MOVES_ELEMENTS = frozenset({
    "identity", "reshape", "expand_dims", "squeeze", "transpose", "tile", "slice_by_index", "slice_by_size",
    "reverse", "reverse_sequence", "gather", "gather_along_axis", "gather_nd", "split", "flatten2d",
    "sliding_windows", "space_to_depth", "depth_to_space", "pixel_shuffle", "batch_to_space", "space_to_batch",
})
# Producers deeper than this are not followed: the bound is unproved, never wrong.
_DEPTH = 64


def _dtype_range(dtype) -> Bounds | None:
    """The range of an integer or bool dtype; None for any other."""
    if dtype == types.bool:
        return 0, 1
    if types.is_int(dtype):
        info = np.iinfo(types.nptype_from_builtin(dtype))
        return int(info.min), int(info.max)
    return None


def _within(bounds: Bounds, dtype) -> Bounds:
    """`bounds` where they fit the dtype; a result that may wrap around proves nothing."""
    limits = _dtype_range(dtype)
    low, high = bounds
    if limits is None or (low is not None and low < limits[0]) or (high is not None and high > limits[1]):
        return UNBOUNDED
    return low, high


def _union(bounds: list[Bounds]) -> Bounds:
    lows, highs = [b[0] for b in bounds], [b[1] for b in bounds]
    return (None if None in lows else min(lows)), (None if None in highs else max(highs))


class BoundsProver:
    """Proves bounds on values of one program, remembering what it proved."""

    def __init__(self, dims_of=None) -> None:
        # id(var) -> (var, bounds); the var is kept so its id is not reused.
        self._proved: dict[int, tuple[Var, Bounds]] = {}
        # dims_of(x): the (lowest, highest or None) of each of x's dims at run time
        # (an input's RangeDim bounds), or None; what a `shape` of x can hold.
        self._dims_of = dims_of

    def bounds(self, value: Var, depth: int = 0) -> Bounds:
        """(least, greatest) element of `value`, each None where unproved."""
        cached = self._proved.get(id(value))
        if cached is not None and cached[0] is value:
            return cached[1]
        if depth > _DEPTH:
            return UNBOUNDED
        self._proved[id(value)] = (value, UNBOUNDED)  # a cycle, if any, proves nothing
        found = _within(self._compute(value, depth + 1), value.dtype) if _dtype_range(value.dtype) else UNBOUNDED
        self._proved[id(value)] = (value, found)
        return found

    def _compute(self, value: Var, depth: int) -> Bounds:
        if value.val is not None:
            array = np.asarray(value.val)
            if array.size == 0 or array.dtype.kind not in "biu":
                return UNBOUNDED
            return int(array.min()), int(array.max())
        # What the dtype alone proves, for inputs and ops not followed.
        natural: Bounds = (0, 1) if value.dtype == types.bool else (0, None) if types.is_unsigned_int(value.dtype) \
            else UNBOUNDED
        op = value.op
        if op is None:
            return natural
        kind, inputs = op.op_type, op.inputs

        def of(name: str) -> Bounds:
            operand = inputs.get(name)
            return UNBOUNDED if operand is None else self.bounds(operand, depth)

        if kind == "shape":
            # A dim is never negative, and a shape's dtype holds every dim it gives;
            # the dims' own bounds (a RangeDim's), where known, are tighter.
            dims = self._dims_of(inputs["x"]) if self._dims_of is not None else None
            most = _dtype_range(value.dtype)[1]
            if dims:
                return min(low for low, _ in dims), max(most if high is None else high for _, high in dims)
            return 0, most
        if kind in _MOVES_ELEMENTS:
            return of("x")
        if kind in ("concat", "stack"):
            return _union([self.bounds(v, depth) for v in inputs["values"]])
        if kind == "cast":
            source = inputs["x"]
            if _dtype_range(source.dtype) is None:
                return UNBOUNDED  # from a float: rounding and NaN are not followed
            return self.bounds(source, depth)
        if kind in ("fill", "fill_like"):
            return of("value")
        if kind == "select":
            return _union([of("a"), of("b")])
        if kind in ("add", "sub", "mul"):
            # Only with both operands bounded on both sides: an unbounded
            # side may wrap around, and then no element is bounded at all.
            (a_low, a_high), (b_low, b_high) = of("x"), of("y")
            if None in (a_low, a_high, b_low, b_high):
                return UNBOUNDED
            if kind == "add":
                return a_low + b_low, a_high + b_high
            if kind == "sub":
                return a_low - b_high, a_high - b_low
            products = [a_low * b_low, a_low * b_high, a_high * b_low, a_high * b_high]
            return min(products), max(products)
        if kind == "maximum":
            (a_low, a_high), (b_low, b_high) = of("x"), of("y")
            lows = [v for v in (a_low, b_low) if v is not None]
            return (max(lows) if lows else None), (None if a_high is None or b_high is None else max(a_high, b_high))
        if kind == "minimum":
            (a_low, a_high), (b_low, b_high) = of("x"), of("y")
            highs = [v for v in (a_high, b_high) if v is not None]
            return (None if a_low is None or b_low is None else min(a_low, b_low)), (min(highs) if highs else None)
        if kind == "relu":
            low, high = of("x")
            return max(0, low or 0), (None if high is None else max(0, high))
        if kind == "range_1d":
            return _range_bounds(of("start"), of("end"), of("step"))
        return natural


def _range_bounds(start: Bounds, end: Bounds, step: Bounds) -> Bounds:
    """range_1d(start, end, step): from start towards end, end excluded (an empty range has any bounds)."""
    (start_low, start_high), (end_low, end_high), (step_low, step_high) = start, end, step
    if step_low is not None and step_low > 0:
        return start_low, (None if end_high is None else end_high - 1)
    if step_high is not None and step_high < 0:
        return (None if end_low is None else end_low + 1), start_high
    return UNBOUNDED
