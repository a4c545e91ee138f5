"""What the shape inference rules read off one node: its inputs' shapes, dtypes and constants, its attributes.

Shared by the shape rules, the rules for values used as shapes and the
provenance of dims; `Context` is all they need of the adapter.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import onnx

from rewrite.backends.onnx.graph import Node, Value
from rewrite.language.logic import UNKNOWN, is_literal

# Beyond any rank a real model has (the contents of shape values stop at 64 too).
MAX_RANK = 64


class Context(Protocol):
    """What inference asks of the model as a whole: the adapter, as the rules see it."""

    opset: int
    model: onnx.ModelProto
    shape_pool: dict[tuple, tuple]

    def constant(self, value: Value) -> np.ndarray | None:
        """The value's compile-time constant, if it has one a rule may read."""


def operand(node: Node, position: int) -> Value | None:
    """The node's input at `position`; None if absent."""
    return node.inputs[position] if position < len(node.inputs) else None


def shape(node: Node, position: int):
    """The shape of the node's input at `position`; None if absent or unknown."""
    value = operand(node, position)
    return None if value is None else value.shape


def dtype(node: Node, position: int = 0):
    """The dtype of the node's input at `position`; None if absent or unknown."""
    value = operand(node, position)
    return None if value is None else value.dtype


def attribute(node: Node, name: str, default=None):
    """The value of the node's attribute `name`, or `default`."""
    for found in node.proto.attribute:
        if found.name == name:
            return onnx.helper.get_attribute_value(found)
    return default


def ints(adapter: Context, node: Node, position: int, name: str | None = None):
    """Int list from an input's constant (newer opsets) or the attribute `name` (older)."""
    value = operand(node, position)
    if value is not None:
        constant = adapter.constant(value)
        return None if constant is None else [int(v) for v in np.asarray(constant).reshape(-1)]
    if name is not None:
        found = attribute(node, name)
        return None if found is None else [int(v) for v in found]
    return None


def values(adapter: Context, node: Node, position: int):
    """What a 1-D (or scalar) int input holds, as dims: its constant, else its
    contents (a shape value: symbols allowed); None if neither is known."""
    value = operand(node, position)
    if value is None:
        return None
    if value.initializer is not None or (value.producer is not None and value.producer.type == "Constant"):
        constant = adapter.constant(value)
        if constant is not None and constant.size <= MAX_RANK:
            return [int(v) for v in np.asarray(constant).reshape(-1)]
    return None if value.contents is None else list(value.contents)


def scalar(adapter: Context, node: Node, position: int):
    """A scalar (or one-element) input's value: a number, a symbol, or UNKNOWN."""
    value = operand(node, position)
    if value is None:
        return UNKNOWN
    if value.initializer is not None or (value.producer is not None and value.producer.type == "Constant"):
        constant = adapter.constant(value)
        if constant is not None and constant.size == 1:
            number = np.asarray(constant).reshape(-1)[0]
            return int(number) if np.issubdtype(np.asarray(constant).dtype, np.integer) else float(number)
    if value.contents is not None and len(value.contents) == 1:
        return value.contents[0]
    return UNKNOWN


def vector_length(value: Value) -> int | None:
    """How many dims a 1-D shape operand holds, if known and plausible as a rank."""
    shape = value.shape
    if shape is None or len(shape) != 1 or not is_literal(shape[0]):
        return None
    # A declared length in the billions is a corrupt declaration, not a rank;
    # taken at its word it would build a tuple that long.
    return int(shape[0]) if 0 <= shape[0] <= MAX_RANK else None


def axes(given, rank):
    """The axes `given` counted from 0 in a rank `rank`, sorted."""
    return sorted(a + rank if a < 0 else a for a in given)


def shape_range(node, rank):
    """A Shape node's (start, end), clamped to `rank`."""
    start = attribute(node, "start", 0)
    end = attribute(node, "end", rank)
    start = max(0, min(rank, start + rank if start < 0 else start))
    end = max(0, min(rank, end + rank if end < 0 else end))
    return start, end


def slice_parameters(adapter, node):
    """starts, ends, axes, steps: lists of dims (a run-time one from its
    contents), None when not known; axes and steps None also when absent."""
    if len(node.inputs) == 1:  # opset < 10: attributes
        return attribute(node, "starts"), attribute(node, "ends"), attribute(node, "axes"), None
    starts, ends = values(adapter, node, 1), values(adapter, node, 2)
    axes = values(adapter, node, 3) if operand(node, 3) is not None else None
    steps = values(adapter, node, 4) if operand(node, 4) is not None else None
    return starts, ends, axes, steps
