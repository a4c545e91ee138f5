"""A value's consumers, with removal in O(1) amortized, while a run edits a program.

coremltools keeps the ops that read a `Var` in a plain list (`Var._child_ops`)
and drops one with `list.remove`: a scan from the front. One value may feed
every layer (a mean tiled into each, a mask), and when the consumers removed
are not the first ones (every other tile kept, say) each removal scans past
all those kept before it, so a run's cost grows with the square of the
program. For the values with many consumers the adapter swaps in a `UseList`
while it edits, and `restore` swaps plain lists back in when the run ends, so
nothing outside a run ever sees one.

A `UseList` answers what coremltools asks of a child list (append, remove,
`in`, count, len, iteration, indexing, slicing) as the list would, in the
same order: a removed entry leaves a hole, skipped when iterating, and the
holes are squeezed out once they are half the entries, which keeps every
removal O(1) amortized.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

# Below this many consumers a list scan is as cheap as the bookkeeping.
MANY_USES = 32

# Up to this many, dropping a list's first entry (a memmove of the rest, a
# few microseconds at most) costs less than swapping in a `UseList`.
CHEAP_FRONT = 4096

_HOLE = object()


class UseList:
    """The ops that read one value, in the order they started to (see the module docstring)."""

    __slots__ = ("_entries", "_positions", "_holes")

    def __init__(self, ops: Iterable[Any] = ()):
        self._entries: list[Any] = list(ops)
        self._holes = 0
        self._index()

    def _index(self) -> None:
        # id(op) -> the positions of op's entries, ascending; the entries hold
        # the ops alive, so no id is reused while it is a key.
        positions: dict[int, list[int]] = {}
        for position, op in enumerate(self._entries):
            positions.setdefault(id(op), []).append(position)
        self._positions = positions

    def _squeeze(self) -> None:
        self._entries = [op for op in self._entries if op is not _HOLE]
        self._holes = 0
        self._index()

    def append(self, op: Any) -> None:
        self._positions.setdefault(id(op), []).append(len(self._entries))
        self._entries.append(op)

    def remove(self, op: Any) -> None:
        """Remove the first entry of `op`, as `list.remove` does; ValueError if there is none."""
        positions = self._positions.get(id(op))
        if not positions:
            raise ValueError("UseList.remove(x): x not in list")
        self._entries[positions.pop(0)] = _HOLE
        if not positions:
            del self._positions[id(op)]
        self._holes += 1
        if self._holes * 2 > len(self._entries):
            self._squeeze()

    def truncate(self, length: int) -> None:
        """Drop the last entries until `length` remain, as `del list[length:]`."""
        entries, positions = self._entries, self._positions
        while len(entries) - self._holes > length:
            op = entries.pop()
            if op is _HOLE:
                self._holes -= 1
                continue
            found = positions[id(op)]
            found.pop()
            if not found:
                del positions[id(op)]

    def count(self, op: Any) -> int:
        return len(self._positions.get(id(op), ()))

    def index(self, op: Any) -> int:
        if self._holes:
            self._squeeze()
        positions = self._positions.get(id(op))
        if not positions:
            raise ValueError("UseList.index(x): x not in list")
        return positions[0]

    def __contains__(self, op: Any) -> bool:
        return id(op) in self._positions

    def __len__(self) -> int:
        return len(self._entries) - self._holes

    def __bool__(self) -> bool:
        return len(self._entries) > self._holes

    def __iter__(self) -> Iterator[Any]:
        if not self._holes:
            return iter(self._entries)
        return (op for op in self._entries if op is not _HOLE)

    def __getitem__(self, index):
        if self._holes:
            self._squeeze()
        return self._entries[index]  # a slice is a plain list, as a list's is

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (UseList, list)):
            return self.as_list() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, as a list

    def __repr__(self) -> str:
        return f"UseList({self.as_list()!r})"

    def as_list(self) -> list[Any]:
        """The entries, holes left out: what the plain list would hold."""
        return [op for op in self._entries if op is not _HOLE] if self._holes else list(self._entries)


def truncate_uses(var: Any, length: int) -> None:
    """Drop `var`'s last consumer entries until `length` remain (a failed build's)."""
    children = var._child_ops
    if type(children) is UseList:
        children.truncate(length)
    else:
        del children[length:]


class UseLists:
    """The `UseList`s one adapter swapped in, to swap plain lists back in with `restore`."""

    def __init__(self) -> None:
        self._swapped: list[Any] = []

    def prepare(self, var: Any, removing: Any = None) -> None:
        """Give `var` a `UseList` if it has many consumers, before some may be removed.

        `removing` is the op about to be removed, when that is the edit: a
        list not longer than CHEAP_FRONT whose first entry it is stays a list.
        """
        children = var._child_ops
        if type(children) is not list or len(children) < MANY_USES:
            return
        if removing is not None and children[0] is removing and len(children) <= CHEAP_FRONT:
            return  # consumers removed in the order they were made: the common case
        var._child_ops = UseList(children)
        self._swapped.append(var)

    def restore(self) -> None:
        """Plain lists again, in the same order (a var given a list meanwhile keeps it)."""
        for var in self._swapped:
            children = var._child_ops
            if type(children) is UseList:
                var._child_ops = children.as_list()
        self._swapped.clear()
