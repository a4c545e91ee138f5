"""What the language checks rules against: a dialect's ops, their inputs and attributes.

The checker resolves op types and operand names with these when rules load.
They belong to the language, not the engine, so that loading and checking
rules never imports the engine; a backend implements `OpSchema` for its
dialect, and the engine and backends import these types from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class InputSpec:
    """One input of an op's schema."""

    name: str
    optional: bool = False
    variadic: bool = False


@dataclass(frozen=True)
class OpSignature:
    """An op type's inputs, in schema (positional) order, and its attribute names."""

    op_type: str
    inputs: tuple[InputSpec, ...]
    attributes: tuple[str, ...] = ()

    def input(self, name: str) -> InputSpec | None:
        for spec in self.inputs:
            if spec.name == name:
                return spec
        return None


class OpSchema(Protocol):
    """The op registry of one dialect, used to check rules when they load."""

    dialect: str
    # The pass groups a rule may name in its `group` clauses, which the
    # backend places in its pipeline; () where it has none.
    groups: Sequence[str]

    def signature(self, op_type: str) -> OpSignature | None:
        """The signature of `op_type`, or None if the dialect has no such op."""

    def op_types(self) -> Sequence[str]:
        """Every op type of the dialect (for "did you mean" hints)."""
