"""Symbolic broadcasting and dim arithmetic, onnx-light's semantics."""

from __future__ import annotations

import pytest

from rewrite.engine.shapes import (
    IncompatibleShapes,
    add,
    broadcast_dim,
    broadcast_shapes,
    is_plain_dim,
    multiply,
    subtract,
)
from rewrite.language.logic import UNKNOWN, Broadcast, Sum, Symbol

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
        (a, b, Broadcast((a, b))),                 # two symbols: a fresh, canonical dim
        (b, a, Broadcast((a, b))),
        (Broadcast((a, b)), c, Broadcast((a, b, c))),
        (Broadcast((a, b)), a, Broadcast((a, b))),
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
    assert add(a, 1) == add(1, a) == Sum(1, a)
    assert str(add(a, 1)) == "(1+a)" and add(a, 1) != Symbol("(1+a)")
    assert multiply(a, b) == multiply(b, a)
    assert subtract(a, 1) != subtract(1, a)
    assert add(a, UNKNOWN) is UNKNOWN
    assert is_plain_dim(a) and is_plain_dim(3) and not is_plain_dim(add(a, 1))


def test_terms_are_trees_compared_by_structure_never_by_how_they_print():
    # A model's names print like the engine's terms; they are leaves, and other dims.
    assert Symbol("(a+b)") != add(a, b) and str(Symbol("(a+b)")) == str(add(a, b))
    assert broadcast_dim(Symbol("broadcast(a,b)"), c) == Broadcast((Symbol("broadcast(a,b)"), c))
    assert broadcast_dim(Symbol("broadcast(a,b)"), c) != broadcast_dim(broadcast_dim(a, b), c)
    assert is_plain_dim(Symbol("(a+b)")) and not is_plain_dim(add(a, b))
    # Equal trees are one dim, however they were built.
    assert add(a, multiply(b, 2)) == add(multiply(2, b), a)
    assert hash(add(a, b)) == hash(Sum(a, b)) and {add(b, a): 1}[Sum(a, b)] == 1


def test_operands_that_print_alike_are_still_ordered_one_way():
    # "(a+b)" the name and a + b the sum: a + b in either order is one term.
    named, summed = Symbol("(a+b)"), add(a, b)
    assert add(named, summed) == add(summed, named)
    assert multiply(named, summed) == multiply(summed, named)
    assert broadcast_dim(named, summed) == broadcast_dim(summed, named)


def test_a_term_thousands_deep_is_compared_without_recursion():
    # A Concat of thousands of inputs along a symbolic axis sums that many dims, one at a time.
    first = second = 0
    for _ in range(5000):
        first, second = add(first, a), add(second, a)
    assert first == second and first is not second and hash(first) == hash(second)
    assert first != add(second, a) and broadcast_dim(first, second) == first
    assert broadcast_dim(first, b) == broadcast_dim(b, second)
