"""Symbolic broadcasting and dim arithmetic, onnx-light's semantics."""

from __future__ import annotations

import pytest

from rewrite.engine.logic import UNKNOWN, Symbol
from rewrite.engine.shapes import (
    IncompatibleShapes,
    add,
    broadcast_dim,
    broadcast_shapes,
    is_plain_dim,
    multiply,
    subtract,
)

a, b, c = Symbol("a"), Symbol("b"), Symbol("c")


@pytest.mark.parametrize(
    "left, right, expected",
    [
        (8, 1, 8), (1, 8, 8), (8, 8, 8),          # ints: equal, or one is 1
        (1, a, a), (a, 1, a),                      # 1 against anything: the other
        (8, a, 8), (a, 8, 8),                      # an int other than 1 against a symbol: the int
        (a, a, a),                                 # the same symbol
        (8, UNKNOWN, 8), (1, UNKNOWN, UNKNOWN),    # unknown is 1 or the same as an int
        (a, UNKNOWN, UNKNOWN),
        (a, b, Symbol("broadcast(a,b)")),          # two symbols: a fresh, canonical dim
        (b, a, Symbol("broadcast(a,b)")),
        (Symbol("broadcast(a,b)"), c, Symbol("broadcast(a,b,c)")),
        (Symbol("broadcast(a,b)"), a, Symbol("broadcast(a,b)")),
    ],
)
def test_broadcast_dim(left, right, expected):
    assert broadcast_dim(left, right) == expected


def test_incompatible_ints_are_an_error():
    with pytest.raises(IncompatibleShapes):
        broadcast_dim(3, 4)


def test_broadcast_shapes_right_aligns():
    assert broadcast_shapes((a, 1, 8), (4, 1)) == (a, 4, 8)
    assert broadcast_shapes((8,), ()) == (8,)
    assert broadcast_shapes((8,), None) is None


def test_dim_arithmetic_is_canonical():
    assert add(3, 4) == 7 and subtract(a, 0) == a and multiply(a, 1) == a
    assert add(a, 1) == add(1, a) == Symbol("(1+a)")
    assert multiply(a, b) == multiply(b, a)
    assert subtract(a, 1) != subtract(1, a)
    assert add(a, UNKNOWN) is UNKNOWN
    assert is_plain_dim(a) and is_plain_dim(3) and not is_plain_dim(add(a, 1))
