"""Named predicates that embedders register from Python.

A rules file can call a predicate by name, but it can never define one: the
language stays data. Register before loading the rules that use it:

    from rewrite import register_predicate

    @register_predicate("is_weight", "value")
    def is_weight(context, value):
        return context.adapter.constant(value) is not None and value.name.startswith("w")

The function receives a `PredicateContext` and the evaluated arguments
(graph values come as the backend's own objects) and returns True, False,
or None for "unknown". Only True lets a rule fire.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rewrite.language.types import BUILTINS, Parameter, Signature, Type


@dataclass(frozen=True)
class PredicateContext:
    """What a predicate may look at: the adapter over the program being rewritten."""

    adapter: Any


@dataclass(frozen=True)
class Predicate:
    signature: Signature
    function: Callable[..., bool | None]


_REGISTRY: dict[str, Predicate] = {}


def register_predicate(name: str, parameters: str = "value", *, replace: bool = False):
    """Register `function(context, *args)` as predicate `name`.

    `parameters` lists the argument types, comma separated: `value`, `number`,
    `list`, `string`, `bool` (e.g. "value, number").
    """
    if not name.isidentifier():
        raise ValueError(f"predicate name {name!r} is not an identifier")
    if name in BUILTINS:
        raise ValueError(f"'{name}' is a built-in function")
    types = [part.strip() for part in parameters.split(",") if part.strip()]
    signature = Signature(
        name,
        tuple(Parameter(f"argument{i}", Type(t)) for i, t in enumerate(types)),
        Type.BOOL,
        "registered predicate",
    )

    def decorator(function):
        if name in _REGISTRY and not replace:
            raise ValueError(f"predicate '{name}' is already registered")
        _REGISTRY[name] = Predicate(signature, function)
        return function

    return decorator


def unregister_predicate(name: str) -> None:
    _REGISTRY.pop(name, None)


def registered_predicates() -> dict[str, Predicate]:
    """A snapshot of the registry."""
    return dict(_REGISTRY)
