"""Values used as shapes in ONNX inference: what a 1-D (or scalar) int value holds, as dims.

`CONTENTS` maps an op type to the rule that gives its first output's
`Value.contents` from its inputs' (see `rewrite.engine.shape_values`): through
`Shape`, `Gather`, `Slice`, `Concat`, arithmetic and the `Where(Equal(s, -1),
..., s)` chain of `expand(-1, ...)`, so that `Expand(x, Shape(y))` is known
to produce y's dims.
"""

from __future__ import annotations

from onnx import numpy_helper

from rewrite.backends.onnx import dim_algebra as algebra
from rewrite.backends.onnx import node_inputs as read
from rewrite.backends.onnx import tensors as onnx_tensors
from rewrite.engine import shape_values
from rewrite.engine import shapes as dims
from rewrite.language.logic import UNKNOWN, is_literal


def _shape_contents(adapter, node):
    shape = read.shape(node, 0)
    if shape is None:
        return None
    start, end = read.shape_range(node, len(shape))
    return list(shape[start:end])


def _unsqueeze_contents(adapter, node):
    # A scalar dim becomes a one-element shape vector; anything else is no
    # longer a flat list of dims.
    source = read.operand(node, 0)
    if source is None or source.contents is None or source.shape != ():
        return None
    return list(source.contents)


def _concat_contents(adapter, node):
    return shape_values.concatenated([None if v is None else v.contents for v in node.inputs])


def _gather_contents(adapter, node):
    data, indices = read.operand(node, 0), read.operand(node, 1)
    if data is None or indices is None or data.contents is None:
        return None
    axis = read.attribute(node, "axis", 0)
    # A shape value is 1-D: its only axis is 0, or -1 once the rank is known.
    if data.shape is not None and len(data.shape) != 1 or not (axis == 0 or axis == -1 and data.shape is not None):
        return None
    picked = read.values(adapter, node, 1)
    if picked is None or not all(type(i) is int for i in picked):
        return None
    if indices.shape is not None and len(indices.shape) > 1:
        return None
    return shape_values.gathered(data.contents, picked)


def _gather_elements_contents(adapter, node):
    # On 1-D values GatherElements is Gather.
    data = read.operand(node, 0)
    if data is None or data.contents is None or data.shape is None or len(data.shape) != 1:
        return None
    picked = read.values(adapter, node, 1)
    if picked is None or not all(type(i) is int for i in picked):
        return None
    return shape_values.gathered(data.contents, picked)


def _slice_contents(adapter, node):
    source = read.operand(node, 0)
    if source is None:
        return None
    starts, ends, axes, steps = read.slice_parameters(adapter, node)
    if starts is None or ends is None or len(starts) != 1 or (axes not in (None, [0], [-1])):
        return None
    start, end, step = starts[0], ends[0], (steps or [1])[0]
    if not (is_literal(start) and is_literal(end) and is_literal(step)):
        return None
    return shape_values.sliced(source.contents, int(start), int(end), int(step))


def _elementwise_contents(operation: str):
    def contents(adapter, node):
        left, right = read.operand(node, 0), read.operand(node, 1)
        if left is None or right is None:
            return None
        return shape_values.elementwise(operation, left.contents, right.contents)

    return contents


def _equal_contents(adapter, node):
    left, right = read.operand(node, 0), read.operand(node, 1)
    if left is None or right is None:
        return None
    return shape_values.equal(left.contents, right.contents)


def _where_contents(adapter, node):
    condition, left, right = read.operand(node, 0), read.operand(node, 1), read.operand(node, 2)
    if condition is None or left is None or right is None:
        return None
    return shape_values.chosen(condition.contents, left.contents, right.contents)


def _constant_of_shape_contents(adapter, node):
    target, value = read.operand(node, 0), read.attribute(node, "value")
    if target is None or target.contents is None or len(target.contents) != 1 or value is None:
        return None
    length, fill = target.contents[0], numpy_helper.to_array(value).reshape(-1)
    if not is_literal(length) or length > 64 or fill.dtype.kind not in "iu":
        return None
    return [int(fill[0])] * int(length)


def _flatten_contents(adapter, node):
    # Reshaping a shape vector to one dimension keeps its elements in order.
    source, output = read.operand(node, 0), node.outputs[0]
    if source is None or source.contents is None or source.shape is None or len(source.shape) > 1:
        return None
    if output.shape is None or len(output.shape) != 1:
        return None
    return list(source.contents)


def _passthrough_contents(adapter, node):
    source = read.operand(node, 0)
    return None if source is None else source.contents


def _range_contents(adapter, node):
    first, last, step = (read.scalar(adapter, node, position) for position in range(3))
    if not all(type(v) is int for v in (first, last, step)) or step == 0:
        return None
    values = range(first, last, step)
    return list(values) if len(values) <= read.MAX_RANK else None


def _size_contents(adapter, node):
    shape = read.shape(node, 0)
    if shape is None:
        return None
    total = algebra.product(shape)
    return None if total is UNKNOWN else [total]


def _cast_contents(adapter, node):
    # Ints stay the same ints; a bool becomes 0 or 1. Anything else is not followed.
    source = read.operand(node, 0)
    to = onnx_tensors.dtype_name(read.attribute(node, "to", 0))
    if source is None or source.contents is None or to not in ("int64", "int32"):
        return None
    return [int(v) if type(v) is bool else v for v in source.contents]


def _divide_contents(adapter, node):
    # Integer division of literal dims (ONNX truncates toward zero), and x / 1.
    left, right = read.operand(node, 0), read.operand(node, 1)
    if left is None or right is None or left.dtype not in ("int64", "int32"):
        return None
    pairs = shape_values.paired(left.contents, right.contents)
    if pairs is None:
        return None
    result = []
    for a, b in pairs:
        if b == 1:
            result.append(a)
        elif type(a) is int and type(b) is int and b != 0:
            quotient = abs(a) // abs(b)
            result.append(quotient if (a >= 0) == (b > 0) else -quotient)
        else:
            result.append(UNKNOWN)
    return result


def _neg_contents(adapter, node):
    source = read.operand(node, 0)
    if source is None or source.contents is None or source.dtype not in ("int64", "int32"):
        return None
    return [-v if type(v) is int else dims.subtract(0, v) if v is not UNKNOWN else UNKNOWN for v in source.contents]


def _not_contents(adapter, node):
    source = read.operand(node, 0)
    if source is None or source.contents is None:
        return None
    return [(not v) if type(v) is bool else UNKNOWN for v in source.contents]


CONTENTS = {
    "Shape": _shape_contents,
    "Concat": _concat_contents,
    "Gather": _gather_contents,
    "Slice": _slice_contents,
    "Unsqueeze": _unsqueeze_contents,
    "Squeeze": _passthrough_contents,
    "Cast": _cast_contents,
    "Identity": _passthrough_contents,
    "Size": _size_contents,
    "GatherElements": _gather_elements_contents,
    "Range": _range_contents,
    "Div": _divide_contents,
    "Not": _not_contents,
    "Neg": _neg_contents,
    "Reshape": _flatten_contents,
    "Add": _elementwise_contents("+"),
    "Sub": _elementwise_contents("-"),
    "Mul": _elementwise_contents("*"),
    "Equal": _equal_contents,
    "Where": _where_contents,
    "ConstantOfShape": _constant_of_shape_contents,
}
