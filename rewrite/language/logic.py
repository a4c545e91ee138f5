"""Three-valued truth and dims that may be literal, symbolic or unknown.

The whole soundness story rests on this module: a rewrite fires only on
`Truth.YES`, and nothing about a symbolic or an unknown dim is ever YES unless
it is the very same term (see `Term`: a tree, never a name read back apart).

It belongs to the language: the linter folds conditions with it when rules
load, before there is any model or engine, and the engine and the backends
reason with the same logic, importing it from here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:  # typing.TypeIs is Python 3.13's; only the type checker reads it
    from typing_extensions import TypeIs


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


class Term:
    """A symbolic dim: a size known only at run time, named (`Symbol`, `Local`) or
    computed from others (`Sum`, `Difference`, `Product`, `Minimum`, `Broadcast`).

    Terms are trees, compared by structure: two terms are one dim when they
    are the same tree, never because they print alike. A model's own name
    for a size is a leaf whatever characters it holds, so a `dim_param`
    spelled "(a+b)" is not the sum of a and b. What a term prints as is
    what messages, explanations and written-back names have always shown.
    """

    __slots__ = ()

    def structure(self) -> tuple:
        """A key that orders terms totally, by kind and then by contents (see `canonical_key`)."""
        raise NotImplementedError


@dataclass(frozen=True, eq=False, slots=True)
class Symbol(Term):
    """A named size: a model's own name for a dim, held as given."""

    name: str

    # Written out rather than generated: shape inference compares dims at
    # every broadcast, and the generated method builds tuples to compare.
    def __eq__(self, other: object) -> bool:
        return self is other or (type(other) is Symbol and other.name == self.name)

    def __hash__(self) -> int:
        return hash(self.name)

    def __str__(self) -> str:
        return self.name

    def structure(self) -> tuple:
        return (1, self.name)


@dataclass(frozen=True, eq=False, slots=True)
class Local(Term):
    """A size named only at one place (`name@place`): a dim an exporter declared on one
    value's axis, or one onnx made up for one node's output, whose name means nothing
    elsewhere. `name` may be empty: a run-time value the backend numbers itself (MIL's `@3`)."""

    name: str
    place: str

    def __eq__(self, other: object) -> bool:
        return self is other or (type(other) is Local and other.name == self.name and other.place == self.place)

    def __hash__(self) -> int:
        return hash((self.name, self.place))

    def __str__(self) -> str:
        return f"{self.name}@{self.place}"

    def structure(self) -> tuple:
        return (2, self.name, self.place)


@dataclass(frozen=True, eq=False, slots=True)
class _Pair(Term):
    # Two operands, each an int or a term. The hash and the printed form are
    # worked out once: dims are hashed and compared at every broadcast.
    left: Dim
    right: Dim
    _hash: int = field(init=False, repr=False)
    _text: str = field(init=False, repr=False)

    _KIND = 0
    _FORMAT = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self._KIND, self.left, self.right)))
        object.__setattr__(self, "_text", self._FORMAT.format(self.left, self.right))

    def __eq__(self, other: object) -> bool:
        return self is other or (
            type(other) is type(self) and other._hash == self._hash and other._text == self._text
            and _same_tree(self, other)
        )

    def __hash__(self) -> int:
        return self._hash

    def __str__(self) -> str:
        return self._text

    def structure(self) -> tuple:
        return (self._KIND, _structure(self.left), _structure(self.right))


class Arithmetic(_Pair):
    """`left + right`, `left - right` or `left * right` of two dims."""

    __slots__ = ()


@dataclass(frozen=True, eq=False, slots=True)
class Sum(Arithmetic):
    """left + right, printed `(left+right)`."""

    _KIND = 3
    _FORMAT = "({}+{})"


@dataclass(frozen=True, eq=False, slots=True)
class Difference(Arithmetic):
    """left - right, printed `(left-right)`; not known to be a size (it may be negative)."""

    _KIND = 4
    _FORMAT = "({}-{})"


@dataclass(frozen=True, eq=False, slots=True)
class Product(Arithmetic):
    """left * right, printed `(left*right)`."""

    _KIND = 5
    _FORMAT = "({}*{})"


@dataclass(frozen=True, eq=False, slots=True)
class Minimum(_Pair):
    """The smaller of two sizes, printed `min(left,right)`: a slice of an axis to a bound."""

    _KIND = 6
    _FORMAT = "min({},{})"


@dataclass(frozen=True, eq=False, slots=True)
class Broadcast(Term):
    """The dim that numpy broadcasting gives a few sizes at one axis, printed
    `broadcast(a,b,...)`; `parts` are in canonical order, none itself a `Broadcast`."""

    parts: tuple[Term, ...]
    _hash: int = field(init=False, repr=False)
    _text: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((7, self.parts)))
        object.__setattr__(self, "_text", f"broadcast({','.join(str(part) for part in self.parts)})")

    def __eq__(self, other: object) -> bool:
        return self is other or (type(other) is Broadcast and other._hash == self._hash and other.parts == self.parts)

    def __hash__(self) -> int:
        return self._hash

    def __str__(self) -> str:
        return self._text

    def structure(self) -> tuple:
        return (7, tuple(part.structure() for part in self.parts))


def _same_tree(left: _Pair, right: _Pair) -> bool:
    # Walked with a stack: a Concat of thousands of inputs along a symbolic axis
    # builds a sum that deep, past what recursion allows.
    pending: list[tuple[Dim, Dim]] = [(left, right)]
    while pending:
        a, b = pending.pop()
        if a is b:
            continue
        if type(a) is not type(b):
            return False
        if isinstance(a, _Pair):
            twin = cast(_Pair, b)  # of a's type, which was just checked
            if a._hash != twin._hash:
                return False
            pending.append((a.left, twin.left))
            pending.append((a.right, twin.right))
        elif a != b:
            return False
    return True


def _structure(dim) -> tuple:
    return (0, dim) if type(dim) is int else dim.structure()


class _Tiebreak:
    # Orders two dims that print alike by their structure, worked out only then:
    # most dims print apart, and a deep one's structure is as deep.
    __slots__ = ("dim",)

    def __init__(self, dim) -> None:
        self.dim = dim

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Tiebreak) and type(self.dim) is type(other.dim) and self.dim == other.dim

    def __lt__(self, other: _Tiebreak) -> bool:
        return _structure(self.dim) < _structure(other.dim)


def canonical_key(dim) -> tuple:
    """The order in which commutative operands and broadcast parts are written: by how
    they print, then (for two that print alike) by structure. An int or a term."""
    return (str(dim), _Tiebreak(dim))


class UnknownDim:
    """A dim about which nothing is known; unequal-to-nothing and equal-to-nothing.

    `UNKNOWN` is its one instance, so `isinstance(dim, UnknownDim)` is
    `dim is UNKNOWN` in a form a type checker narrows by.
    """

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "?"

    __str__ = __repr__


UNKNOWN = UnknownDim()
"""The unknown scalar: an unknown dim, or a constant that could not be read."""

Dim = int | Term | UnknownDim


def is_literal(dim: object) -> TypeIs[int | float]:
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
    if isinstance(left, Term) or isinstance(right, Term):
        if left == right:
            return Truth.YES
        return Truth.UNKNOWN
    return Truth.of(left == right)


def proved_equal(left: object, right: object) -> bool:
    """`equal(left, right) is Truth.YES`, as a bool: what the shape guard asks of
    every dim it compares. A symbol is equal only to itself (the same term), and
    nothing, not even itself, to an unknown."""
    return left is not UNKNOWN and right is not UNKNOWN and left == right


def order(operator: str, left: object, right: object) -> Truth:
    """`<`, `<=`, `>`, `>=` between literals; anything symbolic is unknown."""
    if not (is_literal(left) and is_literal(right)):
        if operator in ("<=", ">=") and isinstance(left, Term) and left == right:
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
