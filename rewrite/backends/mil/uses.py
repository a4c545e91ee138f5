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

from rewrite.backends.mil.pymil import TensorInputType

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


def replace_uses_in_block(block: Any, old: Any, new: Any, consumers: list, accepted: dict | None = None) -> bool:
    """Make every consumer of `old` read `new` instead, as
    `block.replace_uses_of_var_after_op(old.op, old, new, no_check_var_types=True)`
    does, at the cost of the uses replaced; False, having changed nothing, where
    that call must do it (see below). `consumers` are `old`'s distinct child ops.

    coremltools re-sets every input of each consumer: it validates them all
    against the op's input spec, compares each old input's type with its
    replacement's (a comparison it then ignores without type checks), and
    detaches and re-attaches the inputs that do not change. That is two
    thirds of a bypass. Here only the inputs that change are validated, by
    the same `InputSpec.validate_inputs`, and only their uses move. The
    inputs that stay keep their place in their values' child lists.
    `accepted`, kept by the caller over a run, remembers which types a
    plain tensor input took: its verdict depends on nothing else.

    Taken only where the replacement is that simple: `old` made by an op of
    `block` and read only by ops of `block` that have no blocks of their own,
    not an output of any block, `new` of `old`'s dtype (so inputs that must
    share a dtype still do) and replaceable for it (constexpr
    bookkeeping). Otherwise coremltools does it, nested blocks and block
    outputs included.
    """
    if old.op is None or old.op.enclosing_block is not block or old.consuming_blocks:
        return False
    if type(new) is not type(old) or not old.can_be_replaced_by_var(new):
        return False
    if old.sym_type is not new.sym_type and _element_type(old.sym_type) is not _element_type(new.sym_type):
        return False
    changes = []
    for op in consumers:
        if op.enclosing_block is not block or op.blocks:
            return False
        changed, occurrences = {}, 0
        for name, value in op._input_vars.items():
            if value is old:
                changed[name] = new
                occurrences += 1
            elif isinstance(value, (list, tuple)) and any(item is old for item in value):
                changed[name] = tuple(new if item is old else item for item in value)
                occurrences += sum(1 for item in value if item is old)
        if not changed:
            return False  # a child op that names `old` in no input: not a state to build on
        _validate(op, changed, {} if accepted is None else accepted)  # raises before anything changes
        changes.append((op, changed, occurrences))
    block._copy_metadata(old, new)
    block._copy_scope_info(old, new)
    uses = new._child_ops
    for op, changed, occurrences in changes:
        for name, value in changed.items():
            op._input_vars[name] = value
            setattr(op, name, value)
        for _ in range(occurrences):  # one use per position, as set_inputs adds them
            uses.append(op)
    # Every use of `old` was one of the consumers', and each has moved.
    if type(old._child_ops) is list:
        old._child_ops.clear()
    else:
        old._child_ops = []
    return True


def _validate(op: Any, changed: dict, accepted: dict) -> None:
    """Raise as `op.set_inputs(**changed)` would for an input its spec refuses."""
    unchecked = {}
    spec = op.input_spec.input_types
    for name, value in changed.items():
        input_type = spec[name]
        # A non-const tensor input's verdict is a function of the value's type
        # alone (coremltools' types are memoized, so one type is one object).
        if type(input_type) is TensorInputType and not input_type.const:
            key = (input_type, value.sym_type)
            verdict = accepted.get(key)
            if verdict is None:
                verdict = accepted[key] = bool(input_type.is_compatible(value))
            if verdict:
                continue
        unchecked[name] = value
    if unchecked:
        op.input_spec.validate_inputs(op.name, op.op_type, unchecked)


def _element_type(sym_type: Any) -> Any:
    # A tensor type's element type; a scalar type is its own.
    primitive = getattr(sym_type, "get_primitive", None)
    return primitive() if primitive is not None else sym_type
