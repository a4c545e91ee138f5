"""Bounds on integer MIL values (`lower_bound`/`upper_bound`): proved, or unknown, never wrong.

Each program is also evaluated at several sizes, and every element it
computes must lie within the bounds proved for it.
"""

from __future__ import annotations

import numpy as np
import pytest
from coremltools.converters.mil.mil import get_new_symbol

from rewrite.backends.mil import Function, MilAdapter, Program, mb, types
from rewrite.backends.mil.reference import evaluate
from rewrite.engine.builtins import _lower_bound, _upper_bound
from rewrite.language.logic import UNKNOWN


def program_of(build):
    """A program whose output is `build(x)` for an fp32 input x of shape (1, S)."""
    length = get_new_symbol()
    with Function({"x": mb.placeholder(shape=(1, length), dtype=types.fp32)}) as function:
        function.set_outputs([build(function.inputs["x"])])
    program = Program()
    program.add_function("main", function)
    return program


def bounds_and_values(build, sizes=(1, 5, 17)):
    program = program_of(build)
    adapter = MilAdapter(program)
    (output,) = program.functions["main"].outputs
    bounds = (_lower_bound(adapter, output), _upper_bound(adapter, output))
    values = [evaluate(program, {"x": np.zeros((1, n), np.float32)})[output.name] for n in sizes]
    for array in values:
        if array.size:
            assert bounds[0] is UNKNOWN or array.min() >= bounds[0], (bounds, array)
            assert bounds[1] is UNKNOWN or array.max() <= bounds[1], (bounds, array)
    return bounds


def length_of(x):
    return mb.gather(x=mb.shape(x=x), indices=1, axis=0)


def positions(x, start=0, step=1):
    return mb.range_1d(start=np.int32(start), end=length_of(x), step=np.int32(step))


INT32_MAX = 2**31 - 1

CASES = {
    # what is proved, and what must stay unknown
    # A dim is at most what the shape's int32 holds, so a range below it is
    # below that, and one more than such a range still fits.
    "a range from 0": (lambda x: positions(x), (0, INT32_MAX - 1)),
    "a range from 0, plus one": (lambda x: mb.add(x=positions(x), y=np.int32(1)), (1, INT32_MAX)),
    "a range from 3, moved": (lambda x: mb.expand_dims(x=positions(x, 3), axes=[0]), (3, INT32_MAX - 1)),
    "a range counting down to -3": (
        lambda x: mb.range_1d(start=length_of(x), end=np.int32(-3), step=np.int32(-1)), (-2, INT32_MAX)),
    "a shape's dims": (lambda x: mb.shape(x=x), (0, INT32_MAX)),
    "a constant slice": (
        lambda x: mb.slice_by_index(x=np.array([4, 0, 7, 2], np.int32), begin=[0],
                                    end=mb.expand_dims(x=length_of(x), axes=[0])), (0, 7)),
    "a sum of bounded values": (
        lambda x: mb.add(x=mb.slice_by_index(x=np.array([4, 0, 7, 2], np.int32), begin=[0], end=[2]),
                         y=mb.cast(x=mb.greater(x=mb.reduce_sum(x=x, axes=[1]), y=0.0), dtype="int32")), (0, 5)),
    "a sum with an unbounded side may wrap": (
        lambda x: mb.add(x=positions(x), y=np.int32(2_147_483_000)), (UNKNOWN, UNKNOWN)),
    "a difference of bounded values": (
        lambda x: mb.sub(x=np.array([1, 2], np.int32), y=mb.cast(x=mb.greater(x=mb.reduce_sum(x=x, axes=[1]),
                                                                             y=0.0), dtype="int32")), (0, 2)),
    "a select of two bounded values": (
        lambda x: mb.select(cond=mb.greater(x=mb.reduce_sum(x=x, axes=[1]), y=0.0),
                            a=np.int32(-4), b=np.int32(9)), (-4, 9)),
    "a maximum with a bounded value": (lambda x: mb.maximum(x=positions(x, -5), y=np.int32(2)), (2, INT32_MAX - 1)),
    "a maximum with an unbounded value": (lambda x: mb.maximum(x=mb.cast(x=x, dtype="int32"), y=np.int32(2)),
                                          (2, UNKNOWN)),
    "a cast from a float": (lambda x: mb.cast(x=x, dtype="int32"), (UNKNOWN, UNKNOWN)),
    "a float": (lambda x: mb.add(x=x, y=1.0), (UNKNOWN, UNKNOWN)),
    "a comparison": (lambda x: mb.greater(x=x, y=0.0), (0, 1)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bounds_are_proved_or_unknown_and_hold_at_run_time(name):
    build, expected = CASES[name]
    assert bounds_and_values(build) == expected


def test_a_long_chain_is_unproved_not_a_recursion_error():
    # 5,000 moves of a range from 0: beyond the depth followed, the bound is
    # unknown (sound), and nothing recurses along the chain.
    def build(x):
        value = positions(x)
        for _ in range(5000):
            value = mb.identity(x=value)
        return value

    program = program_of(build)
    (output,) = program.functions["main"].outputs
    assert _lower_bound(MilAdapter(program), output) is UNKNOWN
