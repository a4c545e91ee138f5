"""A whole-program copy that never recurses along the use-def chain (`copy.deepcopy` does, and fails past ~70 ops)."""

from __future__ import annotations

import copy
import functools
from typing import Any

from rewrite.backends.mil.pymil import (
    Block,
    Operation,
    Program,
    Var,
)


def copy_program(program: Program) -> Program:
    """An independent copy of `program`, as `copy.deepcopy` makes it, at any length.

    `copy.deepcopy` follows a var to its consumers and on, one Python frame per
    op, and fails past ~70-300 ops in a row. Here every graph object (program,
    functions and nested blocks, ops, vars, their op lists) is first found by
    an explicit walk and given an empty twin; then each object's fields are
    deep-copied with all twins already known, so that copying never goes
    further than one object's own fields (types, values, scopes).
    """
    return _copy_graph(program)


def _graph_classes() -> tuple[type, ...]:
    from coremltools.converters.mil.mil.program import Placeholder
    from coremltools.converters.mil.mil.utils import CacheDoublyLinkedList, OpNode

    return (Program, Block, Operation, Var, OpNode, CacheDoublyLinkedList, Placeholder)


@functools.cache
def _slot_names(cls: type) -> tuple[str, ...]:
    return tuple(
        name for klass in cls.__mro__ for name in klass.__dict__.get("__slots__", ())
        if name not in ("__dict__", "__weakref__")
    )


_UNSET = object()


def _fields(obj) -> list[tuple[str, bool, Any]]:
    """(name, is a slot, value) of every field `obj` has set."""
    fields = []
    for name in _slot_names(type(obj)):
        value = getattr(obj, name, _UNSET)
        if value is not _UNSET:
            fields.append((name, True, value))
    state = getattr(obj, "__dict__", None)
    if state is not None:
        fields.extend((name, False, value) for name, value in state.items())
    return fields


def _copy_graph(root):
    from coremltools.converters.mil.mil.utils import CacheDoublyLinkedList

    graph_classes = _graph_classes()
    containers = (list, tuple, set, frozenset, dict)
    found: dict[int, Any] = {}
    pending = [root]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, containers):
            pending.extend(item)
        elif isinstance(item, graph_classes) and not isinstance(item, type) and id(item) not in found:
            found[id(item)] = item
            pending.extend(value for _, _, value in _fields(item))
    # The shared end-of-list sentinel is compared by identity: it stays itself.
    sentinel = CacheDoublyLinkedList.INVALID_NODE
    memo: dict[int, Any] = {id(sentinel): sentinel}
    for key, item in found.items():
        if item is not sentinel:
            memo[key] = object.__new__(type(item))
    for key, item in found.items():
        if item is sentinel:
            continue
        twin = memo[key]
        for name, is_slot, value in _fields(item):
            value = copy.deepcopy(value, memo)
            if is_slot:
                object.__setattr__(twin, name, value)
            else:
                twin.__dict__[name] = value
    return memo[id(root)]
