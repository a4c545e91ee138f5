"""Dim algebra for symbolic shape reasoning, shared by every backend.

Backends infer shapes with these functions so that all of them agree on what
a dim is and when two dims are the same:

* `broadcast_dim` is numpy's (multidirectional) broadcasting over literal,
  symbolic and unknown dims. Two different symbols broadcast to a canonical
  `broadcast(a, b)`, so the information is kept: `broadcast(a, b)` and
  `broadcast(b, a)` are one dim.
* `add`, `subtract`, `multiply` compute with dims held as *values* (the
  contents of `Shape(x)`, sliced, concatenated, offset), folding literals and
  naming anything else by a canonical term (`Sum`, `Difference`, `Product`).

A term's structure is its identity: equal trees are equal dims. Every term
made here is a function of the dims it is made from, never a fresh counter,
so nothing here can make two unrelated dims "equal" by accident.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from rewrite.language.logic import (
    UNKNOWN,
    Arithmetic,
    Broadcast,
    Difference,
    Dim,
    Minimum,
    Product,
    Sum,
    Term,
    UnknownDim,
    canonical_key,
    is_literal,
)


class IncompatibleShapes(ValueError):
    """Two literal dims that no broadcasting reconciles, such as 3 and 4."""


_MAX_BROADCAST_PARTS = 8


def _broadcast_parts(dim: Term) -> tuple[Term, ...]:
    return dim.parts if type(dim) is Broadcast else (dim,)


def _holds_call(dim) -> bool:
    """Whether a min or a broadcast is part of `dim`."""
    pending = [dim]
    while pending:  # a stack, not recursion: a sum may be thousands deep
        dim = pending.pop()
        if isinstance(dim, (Minimum, Broadcast)):
            return True
        if isinstance(dim, Arithmetic):
            pending.extend((dim.left, dim.right))
    return False


def broadcast_dim(left: Dim, right: Dim) -> Dim:
    """The dim numpy broadcasting gives for two dims at one (right-aligned) axis."""
    if left == 1:
        return right
    if right == 1:
        return left
    if is_literal(left) and is_literal(right):
        if left != right:
            raise IncompatibleShapes(f"cannot broadcast {left} with {right}")
        return left
    # A literal other than 1 against anything else: the literal is the only
    # size that broadcasts with it (the other side is 1 or the same).
    if is_literal(left):
        return left
    if is_literal(right):
        return right
    # `is UNKNOWN` by its class, which has no other instance: what tells the
    # type checker that what is left are terms.
    if isinstance(left, UnknownDim) or isinstance(right, UnknownDim):
        return UNKNOWN
    if left == right:
        return left
    parts = set(_broadcast_parts(left)) | set(_broadcast_parts(right))
    if len(parts) > _MAX_BROADCAST_PARTS or any(_holds_call(part) for part in parts):
        # Too long to be worth naming (a chain of fresh symbols would grow the
        # term with every op). A part holding a min or broadcast of its own
        # stays unknown as it did when dims were names split at their commas,
        # so that what the shipped rules prove is what they proved.
        return UNKNOWN
    return Broadcast(tuple(sorted(parts, key=canonical_key)))


def broadcast_shapes(*shapes: Sequence[Dim] | None) -> tuple[Dim, ...] | None:
    """numpy broadcasting of whole shapes, right-aligned; None if any rank is unknown."""
    # Plain loops, not any()/all() over generators: this runs for every
    # elementwise op, and most of them meet equal shapes.
    for shape in shapes:
        if shape is None:
            return None
    known = cast("tuple[Sequence[Dim], ...]", shapes)  # the loop returned on a None
    first = known[0]
    if _all_equal(known, first) and _all_known(first):
        return tuple(first)  # the common case, and the same answer: a dim broadcasts with itself
    rank = max((len(shape) for shape in known), default=0)
    result: list[Dim] = [1] * rank
    for shape in known:
        offset = rank - len(shape)
        for axis, dim in enumerate(shape):
            result[offset + axis] = broadcast_dim(result[offset + axis], dim)
    return tuple(result)


def _all_equal(shapes, first) -> bool:
    for shape in shapes:
        if shape != first:
            return False
    return True


def _all_known(shape) -> bool:
    for dim in shape:  # `is`: `UNKNOWN in shape` would call every symbol's __eq__
        if dim is UNKNOWN:
            return False
    return True


def _expression(kind: type[Arithmetic], left: Dim, right: Dim, commutative: bool) -> Dim:
    if not (isinstance(left, (int, Term)) and isinstance(right, (int, Term))):
        return UNKNOWN  # UNKNOWN included
    if commutative:
        # Written in canonical order, so that a + b and b + a are one term.
        first, second = str(left), str(right)
        if first > second or (first == second and canonical_key(right) < canonical_key(left)):
            left, right = right, left
    return kind(left, right)


def add(left: Dim, right: Dim) -> Dim:
    """left + right: an int for two literals, else the canonical `Sum` (0 dropped)."""
    if is_literal(left) and is_literal(right):
        return left + right
    if right == 0:
        return left
    if left == 0:
        return right
    return _expression(Sum, left, right, commutative=True)


def subtract(left: Dim, right: Dim) -> Dim:
    """left - right: an int for two literals, else a `Difference` (a 0 subtracted dropped)."""
    if is_literal(left) and is_literal(right):
        return left - right
    if right == 0:
        return left
    return _expression(Difference, left, right, commutative=False)


def multiply(left: Dim, right: Dim) -> Dim:
    """left * right: an int for two literals or a 0, else the canonical `Product` (1 dropped)."""
    if is_literal(left) and is_literal(right):
        return left * right
    if right == 1:
        return left
    if left == 1:
        return right
    if left == 0 or right == 0:
        return 0
    return _expression(Product, left, right, commutative=True)


def is_plain_dim(dim: Dim) -> bool:
    """A literal, or a term that names a size (never negative), not arithmetic."""
    if is_literal(dim):
        return True
    return isinstance(dim, Term) and not isinstance(dim, Arithmetic)
