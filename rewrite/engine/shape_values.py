"""Values used as shapes: the dim algebra of shape arithmetic, for every backend.

Converters build runtime shapes out of small integer tensors: the shape of
an input, sliced, gathered, concatenated with constants, and combined with
+, - and *. A backend that can say what each such op is calls these
functions to follow the dims through it, so `fill(shape=concat(shape(x)[0:1],
[8]))` is known to have x's first dim, a symbol, and not some fresh one.

Each function takes and returns a "shape value": a list of dims (ints,
`Term`s or `UNKNOWN`), or None when the value is not a known list. The
results are proofs about run time: an element is a symbol or int only when
it is that at run time, for every input the program accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rewrite.engine import shapes as dims
from rewrite.language.logic import UNKNOWN, Arithmetic, Dim, UnknownDim, is_literal

ShapeValue = list  # list[Dim]; None stands for "not known"


def shape_of(shape: Sequence[Dim] | None, start: int = 0, end: int | None = None) -> ShapeValue | None:
    """The shape of a value of dims `shape`, as a shape value (ONNX `Shape` with start/end)."""
    if shape is None:
        return None
    return list(shape)[slice(start, end)]


def sliced(items: ShapeValue | None, start: int, end: int, step: int = 1) -> ShapeValue | None:
    """items[start:end:step], Python's clamping included."""
    if items is None or step == 0:
        return None
    return list(items)[slice(start, end, step)]


def gathered(items: ShapeValue | None, indices: Sequence[int]) -> ShapeValue | None:
    """[items[i] for i in indices]; None if an index is out of range."""
    if items is None:
        return None
    picked = []
    for index in indices:
        if not -len(items) <= int(index) < len(items):
            return None
        picked.append(items[int(index)])
    return picked


def concatenated(parts: Sequence[ShapeValue | None]) -> ShapeValue | None:
    """The parts one after another; None if any part is unknown."""
    result: list = []
    for part in parts:
        if part is None:
            return None
        result.extend(part)
    return result


def paired(left: ShapeValue | None, right: ShapeValue | None):
    """Two shape values element by element, a one-element side repeated; None if they cannot pair."""
    if left is None or right is None:
        return None
    if len(left) == 1 and len(right) > 1:
        left = left * len(right)
    if len(right) == 1 and len(left) > 1:
        right = right * len(left)
    if len(left) != len(right):
        return None
    return zip(left, right)


def elementwise(operation: str, left: ShapeValue | None, right: ShapeValue | None) -> ShapeValue | None:
    """`left (+|-|*) right` elementwise, a one-element side broadcast to the other."""
    combine: Callable[[Dim, Dim], Dim] = {"+": dims.add, "-": dims.subtract, "*": dims.multiply}[operation]
    pairs = paired(left, right)
    return None if pairs is None else [combine(a, b) for a, b in pairs]


def equal(left: ShapeValue | None, right: ShapeValue | None) -> list | None:
    """Elementwise `==` as True, False or UNKNOWN. A dim is never negative, so a
    symbol against a negative literal is False (the `expand(-1)` test)."""
    pairs = paired(left, right)
    if pairs is None:
        return None
    result: list[bool | UnknownDim] = []
    for a, b in pairs:
        if is_literal(a) and is_literal(b):
            result.append(a == b)
        elif a is not UNKNOWN and a == b:
            result.append(True)
        elif (is_literal(b) and b < 0 and dims.is_plain_dim(a)) or (is_literal(a) and a < 0 and dims.is_plain_dim(b)):
            result.append(False)
        else:
            result.append(UNKNOWN)
    return result


def chosen(condition: list | None, left: ShapeValue | None, right: ShapeValue | None) -> ShapeValue | None:
    """`where(condition, left, right)`: only the chosen side of each element must be known."""
    if condition is None:
        return None
    size = max([len(condition)] + [len(side) for side in (left, right) if side is not None])

    def widen(items):
        if items is None:
            return [UNKNOWN] * size
        return list(items) * size if len(items) == 1 else list(items)

    c, a, b = widen(condition), widen(left), widen(right)
    if not len(c) == len(a) == len(b) == size:
        return None
    result = [x if pick is True else y if pick is False else UNKNOWN for pick, x, y in zip(c, a, b)]
    return None if all(element is UNKNOWN for element in result) else result


def as_dims(items: ShapeValue | None, rank: int | None = None) -> tuple[Dim, ...] | None:
    """A shape value read as the dims of a tensor built from it (a fill, a
    reshape): only sizes count, so a negative or zero entry, which some ops
    read as "infer" or "copy", makes the whole thing unknown."""
    if items is None or (rank is not None and len(items) != rank):
        return None
    if any(is_literal(d) and d <= 0 for d in items):
        return None
    return tuple(items)


def refined(inferred: Sequence[Dim] | None, proven: Sequence[Dim] | None) -> tuple[Dim, ...] | None:
    """A backend's inferred dims with what the shape values prove put in where
    inference only had a symbol of its own making or nothing. A literal the
    backend inferred is kept."""
    if proven is None:
        return None if inferred is None else tuple(inferred)
    if inferred is None:
        return tuple(proven)
    if len(inferred) != len(proven):
        return tuple(inferred)
    # Both are true at run time when both are known; a plain symbol (an
    # input's dim, say) proves more equalities than a broadcast expression.
    # An arithmetic one (`(B*2)` of a tile) is canonical: the same sizes give
    # the same expression, where the symbol a backend mints for it (coremltools'
    # `is2`) equals only itself, and a rebuilt op gets another.
    return tuple(
        dim if is_literal(dim) or better is UNKNOWN or not (dims.is_plain_dim(better) or _arithmetic(better))
        else better
        for dim, better in zip(inferred, proven)
    )


def _arithmetic(dim: Dim) -> bool:
    return isinstance(dim, Arithmetic)
