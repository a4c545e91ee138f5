"""Dim algebra for symbolic shape reasoning, shared by every backend.

Backends infer shapes with these functions so that all of them agree on what
a dim is and when two dims are the same:

* `broadcast_dim` is numpy's (multidirectional) broadcasting over literal,
  symbolic and unknown dims. Two different symbols broadcast to a canonical
  `broadcast(a, b)`, so the information is kept: `broadcast(a, b)` and
  `broadcast(b, a)` are one dim.
* `add`, `subtract`, `multiply` compute with dims held as *values* (the
  contents of `Shape(x)`, sliced, concatenated, offset), folding literals and
  naming anything else by a canonical expression.

A symbol's name is its identity: equal names are equal dims. Every name made
here is a function of the names it is made from, never a fresh counter, so
nothing here can make two unrelated dims "equal" by accident.
"""

from __future__ import annotations

from collections.abc import Sequence

from rewrite.engine.logic import UNKNOWN, Dim, Symbol, is_literal


class IncompatibleShapes(ValueError):
    """Two literal dims that no broadcasting reconciles, such as 3 and 4."""


_MAX_BROADCAST_PARTS = 8


def _broadcast_parts(dim: Symbol) -> tuple[str, ...]:
    if dim.name.startswith("broadcast(") and dim.name.endswith(")"):
        return tuple(dim.name[len("broadcast(") : -1].split(","))
    return (dim.name,)


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
    if left is UNKNOWN or right is UNKNOWN:
        return UNKNOWN
    if left == right:
        return left
    parts = set(_broadcast_parts(left)) | set(_broadcast_parts(right))
    if len(parts) > _MAX_BROADCAST_PARTS or any("," in part for part in parts):
        # Too long to be worth naming (a chain of fresh symbols would grow the
        # name with every op), or a name we could not split back apart.
        return UNKNOWN
    parts = sorted(parts)
    return Symbol(f"broadcast({','.join(parts)})")


def broadcast_shapes(*shapes: Sequence[Dim] | None) -> tuple[Dim, ...] | None:
    """numpy broadcasting of whole shapes, right-aligned; None if any rank is unknown."""
    # Plain loops, not any()/all() over generators: this runs for every
    # elementwise op, and most of them meet equal shapes.
    for shape in shapes:
        if shape is None:
            return None
    first = shapes[0]
    if _all_equal(shapes, first) and _all_known(first):
        return tuple(first)  # the common case, and the same answer: a dim broadcasts with itself
    rank = max((len(shape) for shape in shapes), default=0)
    result: list[Dim] = [1] * rank
    for shape in shapes:
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


def _expression(operator: str, left: Dim, right: Dim, commutative: bool) -> Dim:
    if not (isinstance(left, (int, Symbol)) and isinstance(right, (int, Symbol))):
        return UNKNOWN  # UNKNOWN included
    names = [str(left), str(right)]
    if commutative:
        names.sort()
    return Symbol(f"({names[0]}{operator}{names[1]})")


def add(left: Dim, right: Dim) -> Dim:
    if is_literal(left) and is_literal(right):
        return left + right
    if right == 0:
        return left
    if left == 0:
        return right
    return _expression("+", left, right, commutative=True)


def subtract(left: Dim, right: Dim) -> Dim:
    if is_literal(left) and is_literal(right):
        return left - right
    if right == 0:
        return left
    return _expression("-", left, right, commutative=False)


def multiply(left: Dim, right: Dim) -> Dim:
    if is_literal(left) and is_literal(right):
        return left * right
    if right == 1:
        return left
    if left == 1:
        return right
    if left == 0 or right == 0:
        return 0
    return _expression("*", left, right, commutative=True)


def is_plain_dim(dim: Dim) -> bool:
    """A literal, or a symbol that names a size (never negative), not an expression."""
    if is_literal(dim):
        return True
    return isinstance(dim, Symbol) and not dim.name.startswith("(")
