"""Lists a rule computes: `range` stays small, and proved truths build as bools."""

from __future__ import annotations

from rewrite.engine.builtins import RANGE_LIMIT, _range
from rewrite.engine.rewriter import _as_bool
from rewrite.language.logic import UNKNOWN, Truth


def test_range_is_unknown_past_its_limit():
    # A bound such as int32's maximum is no list to hold: without the limit a
    # rule that builds range(upper_bound(%n)) with its cap dropped (as verify
    # drops conditions one by one) would exhaust memory.
    assert _range(None, 3) == [0, 1, 2]
    assert len(_range(None, RANGE_LIMIT)) == RANGE_LIMIT
    assert _range(None, RANGE_LIMIT + 1) is UNKNOWN
    assert _range(None, 2**31 - 1) is UNKNOWN


def test_proved_truths_build_as_bools_and_unknown_stays_unknown():
    assert _as_bool([Truth.YES, Truth.NO]) == [True, False]
    assert _as_bool([[Truth.NO], [Truth.YES]]) == [[False], [True]]
    assert _as_bool(Truth.UNKNOWN) is Truth.UNKNOWN
    assert _as_bool([1, 2]) == [1, 2]


class _Constants:
    """An adapter that only reads constants, keyed by value."""

    def __init__(self, **constants):
        self.constants = constants

    def constant(self, value):
        return self.constants.get(value)


def test_max_abs_reads_a_constant_as_one_array_however_large():
    import numpy as np

    from rewrite.engine.builtins import _max_abs

    big = np.zeros(RANGE_LIMIT * 3, np.float32)  # past what `range` would index
    big[-1] = -7.5
    adapter = _Constants(w=big, nan=np.array([1.0, np.nan]), runtime=None)
    assert _max_abs(adapter, "w") == 7.5
    assert _max_abs(adapter, "nan") is UNKNOWN
    assert _max_abs(adapter, "runtime") is UNKNOWN
    assert _max_abs(adapter, [[1, -3], [2, 0]]) == 3
    assert _max_abs(adapter, -2.5) == 2.5
    assert _max_abs(adapter, []) is UNKNOWN
