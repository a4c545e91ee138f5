"""Three-valued truth and dims that may be literal, symbolic or unknown.

The whole soundness story rests on this module: a rewrite fires only on
`Truth.YES`, and nothing about a symbol or an unknown dim is ever YES unless
it is the very same symbol.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Truth(enum.Enum):
    """Kleene's strong three-valued logic."""

    NO = 0
    UNKNOWN = 1
    YES = 2

    # `_value_` is a plain attribute; `value` and `Truth(...)` go through
    # enum's descriptors, and these run at every step of every condition.

    @staticmethod
    def of(value: bool) -> Truth:
        return _YES if value else _NO

    def __and__(self, other: Truth) -> Truth:
        return self if self._value_ <= other._value_ else other

    def __or__(self, other: Truth) -> Truth:
        return self if self._value_ >= other._value_ else other

    def __invert__(self) -> Truth:
        return _NEGATION[self._value_]

    def __bool__(self) -> bool:  # pragma: no cover - a guard, not an API
        raise TypeError("Truth is three-valued; compare with Truth.YES explicitly")

    def __str__(self) -> str:
        return self.name.lower()


_NO, _MAYBE, _YES = Truth.NO, Truth.UNKNOWN, Truth.YES
_NEGATION = (_YES, _MAYBE, _NO)


@dataclass(frozen=True, eq=False)
class Symbol:
    """A symbolic dim. Two dims are equal when they are the same symbol."""

    name: str

    # Written out rather than generated: shape inference compares dims at
    # every broadcast, and the generated method builds tuples to compare.
    def __eq__(self, other: object) -> bool:
        return self is other or (type(other) is Symbol and other.name == self.name)

    def __hash__(self) -> int:
        return hash(self.name)

    def __str__(self) -> str:
        return self.name


class _UnknownDim:
    """A dim about which nothing is known; unequal-to-nothing and equal-to-nothing."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "?"

    __str__ = __repr__


UNKNOWN = _UnknownDim()
"""The unknown scalar: an unknown dim, or a constant that could not be read."""

Dim = int | Symbol | _UnknownDim


def is_literal(dim: object) -> bool:
    # bool is an int in Python; it is never a dim. The exact types first: this
    # runs for every dim a condition reads.
    kind = type(dim)
    if kind is int or kind is float:
        return True
    return isinstance(dim, (int, float)) and kind is not bool


def equal(left: object, right: object) -> Truth:
    """Three-valued equality of scalars and dims."""
    if left is UNKNOWN or right is UNKNOWN:
        return Truth.UNKNOWN
    if isinstance(left, Symbol) or isinstance(right, Symbol):
        if left == right:
            return Truth.YES
        return Truth.UNKNOWN
    return Truth.of(left == right)


def proved_equal(left: object, right: object) -> bool:
    """`equal(left, right) is Truth.YES`, as a bool: what the shape guard asks of
    every dim it compares. A symbol is equal only to itself (by name), and
    nothing, not even itself, to an unknown."""
    return left is not UNKNOWN and right is not UNKNOWN and left == right


def order(operator: str, left: object, right: object) -> Truth:
    """`<`, `<=`, `>`, `>=` between literals; anything symbolic is unknown."""
    if not (is_literal(left) and is_literal(right)):
        if operator in ("<=", ">=") and isinstance(left, Symbol) and left == right:
            return Truth.YES
        return Truth.UNKNOWN
    if operator == "<":
        return Truth.of(left < right)
    if operator == "<=":
        return Truth.of(left <= right)
    if operator == ">":
        return Truth.of(left > right)
    return Truth.of(left >= right)


def format_dim(dim: object) -> str:
    return str(dim)
