"""Three-valued truth and dims: unknown never counts as yes."""

from __future__ import annotations

import pytest

from rewrite.language.logic import UNKNOWN, Symbol, Truth, equal, order

YES, NO, MAYBE = Truth.YES, Truth.NO, Truth.UNKNOWN


@pytest.mark.parametrize(
    "left, right, expected",
    [
        (8, 8, YES), (8, 1, NO),
        (Symbol("b"), Symbol("b"), YES),
        (Symbol("b"), Symbol("c"), MAYBE),  # different names may still be the same size
        (Symbol("b"), 1, MAYBE),  # a symbol is never provably 1
        (Symbol("b"), 8, MAYBE),
        (UNKNOWN, UNKNOWN, MAYBE),  # unknown is not even equal to itself
        (UNKNOWN, 1, MAYBE),
    ],
)
def test_equality_is_three_valued(left, right, expected):
    assert equal(left, right) is expected
    assert equal(right, left) is expected


def test_kleene_connectives():
    assert (YES & MAYBE) is MAYBE and (NO & MAYBE) is NO and (YES & YES) is YES
    assert (YES | MAYBE) is YES and (NO | MAYBE) is MAYBE and (NO | NO) is NO
    assert ~YES is NO and ~NO is YES and ~MAYBE is MAYBE


def test_truth_refuses_to_be_a_python_bool():
    with pytest.raises(TypeError):
        bool(MAYBE)


def test_ordering_needs_literals():
    assert order("<", 1, 2) is YES
    assert order(">", 1, 2) is NO
    assert order(">", Symbol("b"), 1) is MAYBE
    assert order("<=", Symbol("b"), Symbol("b")) is YES
    assert order("<", UNKNOWN, 2) is MAYBE
