"""The shape rules of ONNX inference: each op's output shapes and dtypes from its inputs.

`RULES` maps an op type to its rule, `(context, node) -> [(shape, dtype)
per output]`; a rule raises what `shapes.MALFORMED` lists for a node that
breaks its schema. `carried_axes` says which input dims an output dim is
computed from, for the ops whose rules map axes one to one.
"""

from __future__ import annotations

import numpy as np
import onnx

from rewrite.backends.onnx import dim_algebra as algebra
from rewrite.backends.onnx import node_inputs as read
from rewrite.backends.onnx import tensors as onnx_tensors
from rewrite.backends.onnx.graph import Node, Value
from rewrite.engine import shapes as dims
from rewrite.language.logic import UNKNOWN, Term, is_literal


def _same(adapter, node):
    return [(read.shape(node, 0), read.dtype(node))]


def _broadcast(adapter, node):
    shapes = [v.shape for v in node.inputs if v is not None]
    return [(algebra.broadcast_shapes(*shapes), read.dtype(node))]


def _compare(adapter, node):
    shapes = [v.shape for v in node.inputs if v is not None]
    return [(algebra.broadcast_shapes(*shapes), "bool")]


def _where(adapter, node):
    shapes = [v.shape for v in node.inputs if v is not None]
    return [(algebra.broadcast_shapes(*shapes), read.dtype(node, 1))]


def _expand(adapter, node):
    target = read.operand(node, 1)
    shape = read.shape(node, 0)
    if target is None or shape is None:
        return [(None, read.dtype(node))]
    if target.contents is not None:
        return [(algebra.broadcast_shapes(shape, target.contents), read.dtype(node))]
    length = read.vector_length(target)
    if length is not None:
        return [((UNKNOWN,) * max(len(shape), length), read.dtype(node))]
    return [(None, read.dtype(node))]


def _tile(adapter, node):
    shape, repeats = read.shape(node, 0), read.ints(adapter, node, 1)
    if shape is None:
        return [(None, read.dtype(node))]
    if repeats is None:
        # The spec wants one repeat per axis; onnxruntime runs other lengths
        # too and changes the rank, so the rank is known only from a length
        # that matches.
        length = read.shape(node, 1)
        known = length is not None and len(length) == 1 and length[0] == len(shape)
        return [((UNKNOWN,) * len(shape) if known else None, read.dtype(node))]
    if len(repeats) != len(shape):
        return [(None, read.dtype(node))]
    return [(tuple(dims.multiply(d, r) for d, r in zip(shape, repeats)), read.dtype(node))]


def _shape_op(adapter, node):
    shape = read.shape(node, 0)
    if shape is None:
        return [(None, "int64")]
    start, end = read.shape_range(node, len(shape))
    return [((max(end - start, 0),), "int64")]


def _cast(adapter, node):
    return [(read.shape(node, 0), onnx_tensors.dtype_name(read.attribute(node, "to", 0)))]


def _constant(adapter, node):
    # From the header alone: the data is read (and checked) only if its
    # contents are wanted.
    attribute = onnx_tensors.constant_attribute(node)
    if attribute is None:
        return [(None, None)]
    kind = attribute.type
    if kind == onnx.AttributeProto.TENSOR:
        shape = tuple(int(d) for d in attribute.t.dims)
        return [(None if any(d < 0 for d in shape) else shape, onnx_tensors.dtype_name(attribute.t.data_type))]
    if kind == onnx.AttributeProto.INTS:
        return [((len(attribute.ints),), "int64")]
    if kind == onnx.AttributeProto.FLOATS:
        return [((len(attribute.floats),), "fp32")]
    return [((), "int64" if kind == onnx.AttributeProto.INT else "fp32")]


def _constant_of_shape(adapter, node):
    target = read.operand(node, 0)
    value = read.attribute(node, "value")
    dtype = "fp32" if value is None else onnx_tensors.dtype_name(value.data_type)
    if target is not None and target.contents is not None:
        return [(tuple(target.contents), dtype)]
    length = None if target is None else read.vector_length(target)
    return [(None if length is None else (UNKNOWN,) * length, dtype)]


def _unsqueeze(adapter, node):
    shape = read.shape(node, 0)
    axes = read.ints(adapter, node, 1, "axes")
    if shape is None or axes is None:
        return [(None, read.dtype(node))]
    rank = len(shape) + len(axes)
    result, source = [], iter(shape)
    normalized = set(read.axes(axes, rank))
    for axis in range(rank):
        result.append(1 if axis in normalized else next(source))
    return [(tuple(result), read.dtype(node))]


def _squeeze(adapter, node):
    shape = read.shape(node, 0)
    if shape is None:
        return [(None, read.dtype(node))]
    axes = read.ints(adapter, node, 1, "axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
        return [(None, read.dtype(node))]  # axes computed at run time
    if not axes:
        # No axes, or an empty list, which onnxruntime reads as none given
        # (onnx's reference as "squeeze nothing"): every 1 goes, so a dim
        # that might be 1 leaves the rank unknown.
        if any(not is_literal(d) for d in shape):
            return [(None, read.dtype(node))]
        return [(tuple(d for d in shape if d != 1), read.dtype(node))]
    drop = set(read.axes(axes, len(shape)))
    return [(tuple(d for axis, d in enumerate(shape) if axis not in drop), read.dtype(node))]


def _concat(adapter, node):
    shapes = [v.shape for v in node.inputs if v is not None]
    if any(s is None for s in shapes) or not shapes:
        return [(None, read.dtype(node))]
    rank = len(shapes[0])
    axis = read.attribute(node, "axis", 0)
    axis = axis + rank if axis < 0 else axis
    result = list(shapes[0])
    total = 0
    for shape in shapes:
        if len(shape) != rank:
            return [(None, read.dtype(node))]
        total = dims.add(total, shape[axis])
    result[axis] = total
    for other in shapes[1:]:
        for position in range(rank):
            if position != axis and result[position] is UNKNOWN:
                result[position] = other[position]
    return [(tuple(result), read.dtype(node))]


def _gather(adapter, node):
    data, indices = read.shape(node, 0), read.shape(node, 1)
    if data is None or indices is None:
        return [(None, read.dtype(node))]
    axis = read.attribute(node, "axis", 0)
    axis = axis + len(data) if axis < 0 else axis
    return [(tuple(data[:axis]) + tuple(indices) + tuple(data[axis + 1 :]), read.dtype(node))]


def _gather_elements(adapter, node):
    return [(read.shape(node, 1), read.dtype(node))]


def _slice(adapter, node):
    shape = read.shape(node, 0)
    if shape is None:
        return [(None, read.dtype(node))]
    rank = len(shape)
    starts, ends, axes, steps = read.slice_parameters(adapter, node)
    if axes is None:
        if len(node.inputs) > 3 and read.operand(node, 3) is not None:
            return [((UNKNOWN,) * rank, read.dtype(node))]  # run-time axes: any axis may be cut
        count = next((len(known) for known in (starts, ends, steps) if known is not None), None)
        if count is None:
            count = read.vector_length(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
        if count is None:
            return [((UNKNOWN,) * rank, read.dtype(node))]
        axes = list(range(count))
    if any(not is_literal(a) for a in axes):
        return [((UNKNOWN,) * rank, read.dtype(node))]
    axes = [int(a) + rank if a < 0 else int(a) for a in axes]
    if any(not 0 <= a < rank for a in axes) or len(set(axes)) != len(axes):
        return [(None, read.dtype(node))]
    if steps is None and len(node.inputs) > 4 and read.operand(node, 4) is not None:
        steps = [UNKNOWN] * len(axes)
    steps = steps or [1] * len(axes)
    starts = starts if starts is not None else [UNKNOWN] * len(axes)
    ends = ends if ends is not None else [UNKNOWN] * len(axes)
    if not len(starts) == len(ends) == len(steps) == len(axes):
        return [(None, read.dtype(node))]
    result = list(shape)  # the axes not cut keep their dims
    for axis, start, end, step in zip(axes, starts, ends, steps):
        result[axis] = _sliced_dim(shape[axis], start, end, step)
    return [(tuple(result), read.dtype(node))]


# A bound at least this far out clamps to the dim, whatever the dim is.
_FAR = 2**62


def _sliced_dim(dim, start, end, step):
    """The length of dim[start:end:step], ONNX's clamping included; UNKNOWN where not provable."""
    if all(is_literal(v) for v in (dim, start, end, step)):
        if step == 0:
            return UNKNOWN
        return len(range(*slice(int(start), int(end), int(step)).indices(int(dim))))
    if step == -1 and is_literal(start) and is_literal(end) and (start == -1 or start >= _FAR) and end <= -_FAR:
        return dim  # the whole axis, reversed
    if step != 1:
        return UNKNOWN
    # Forward by one: [clamp(start), clamp(end)) with both bounds known not negative.
    if is_literal(end) and end >= _FAR:
        stop = dim
    elif is_literal(end) and end < 0:
        return UNKNOWN  # counts from the end: dim + end may be below zero
    elif algebra.never_negative(end):
        stop = algebra.minimum(dim, end)
    else:
        return UNKNOWN
    if start == 0:
        return stop
    if is_literal(end) and end >= _FAR and not is_literal(start) and algebra.at_least(algebra.negated(start), dim):
        # dim[-p:] with p >= dim: the start clamps to 0 (and -0 is 0), the whole axis. T5's x[:, :, -seq:, :].
        return dim
    if is_literal(end) and end >= _FAR and is_literal(start) and start < 0:
        return algebra.minimum(dim, -int(start))  # dim[-k:] is the last min(k, dim), k >= 1
    if is_literal(start) and start < 0:
        return UNKNOWN
    if not algebra.never_negative(start):
        return UNKNOWN
    # clamp(start) = min(start, dim); when stop >= start (so dim >= start), it is start.
    return algebra.difference(stop, start) if algebra.at_least(stop, start) else UNKNOWN


def _range(adapter, node):
    first, last, step = (read.scalar(adapter, node, position) for position in range(3))
    if all(is_literal(v) for v in (first, last, step)) and step != 0:
        length = max(int(np.ceil((last - first) / step)), 0)
    elif step == 1:
        length = algebra.difference(last, first)
    elif step == -1:
        length = algebra.difference(first, last)
    else:
        length = UNKNOWN
    return [((length,), read.dtype(node))]


def _reshape(adapter, node):
    shape, target = read.shape(node, 0), read.operand(node, 1)
    if target is None or target.contents is None:
        length = None if target is None else read.vector_length(target)
        if length is not None:
            return [((UNKNOWN,) * length, read.dtype(node))]
        return [(None, read.dtype(node))]
    allow_zero = read.attribute(node, "allowzero", 0)
    result = []
    inferred = None  # the position of the -1
    for position, dim in enumerate(target.contents):
        if dim == 0 and not allow_zero:
            result.append(shape[position] if shape is not None and position < len(shape) else UNKNOWN)
        elif is_literal(dim) and dim < 0:
            if dim != -1 or inferred is not None:
                return [(None, read.dtype(node))]  # not valid: the op fails
            inferred = position
            result.append(UNKNOWN)
        else:
            result.append(dim)
    if inferred is not None and shape is not None:
        # The -1 is the input's size over the product of the other dims, when
        # that divides exactly: Reshape(x[batch, seq], [-1, seq]) is [batch, seq].
        others = result[:inferred] + result[inferred + 1 :]
        result[inferred] = algebra.exact_quotient(shape, others)
    return [(tuple(result), read.dtype(node))]


def _flatten(adapter, node):
    shape = read.shape(node, 0)
    if shape is None:
        return [(None, read.dtype(node))]
    axis = read.attribute(node, "axis", 1)
    axis = axis + len(shape) if axis < 0 else axis
    if not 0 <= axis <= len(shape):
        return [(None, read.dtype(node))]
    return [((algebra.product(shape[:axis]), algebra.product(shape[axis:])), read.dtype(node))]


def _size(adapter, node):
    return [((), "int64")]


def _if(adapter, node):
    # Either branch may run: a dim both branches give is the output's.
    branches = {block.attribute: block for block in node.blocks}
    then_branch, else_branch = branches.get("then_branch"), branches.get("else_branch")
    if then_branch is None or else_branch is None:
        return None
    results = []
    for left, right in zip(then_branch.outputs, else_branch.outputs):
        if left is None or right is None:
            results.append((None, None))
            continue
        dtype = left.dtype if left.dtype == right.dtype else None
        if left.shape is None or right.shape is None or len(left.shape) != len(right.shape):
            results.append((None, dtype))
            continue
        shape = tuple(a if a is not UNKNOWN and a == b else UNKNOWN for a, b in zip(left.shape, right.shape))
        results.append((shape, dtype))
    return results


def _loop(adapter, node):
    # Without asking onnx (which would need the body's outer scope): a carried
    # value is its initial value after no iteration and the body's output after
    # the last one, so it keeps the literal dims both have; a scan output is the
    # body's, stacked along a leading axis of the iteration count.
    body = node.blocks[0] if len(node.blocks) == 1 else None
    if body is None:
        return None
    carried = [v for v in node.inputs[2:]]
    results = []
    for position, output in enumerate(body.outputs[1:]):
        if position < len(carried):
            initial = carried[position]
            if initial is None or output is None:
                results.append((None, None))
                continue
            shape = None
            if initial.shape is not None and output.shape is not None and len(initial.shape) == len(output.shape):
                shape = tuple(
                    a if is_literal(a) and is_literal(b) and a == b else UNKNOWN
                    for a, b in zip(initial.shape, output.shape)
                )
            results.append((shape, initial.dtype))
        else:
            shape = None if output is None or output.shape is None else (UNKNOWN,) + tuple(output.shape)
            results.append((shape, None if output is None else output.dtype))
    return results


def _global_pool(adapter, node):
    shape = read.shape(node, 0)
    if shape is None or len(shape) < 2:
        return [(None, read.dtype(node))]
    return [(tuple(shape[:2]) + (1,) * (len(shape) - 2), read.dtype(node))]


def _window(adapter, node):
    """Conv, MaxPool and AveragePool: batch, then channels (Conv: W's first dim), then each
    spatial dim (x + pads - dilation·(k - 1) - 1) / stride + 1, symbolic where the stride is 1
    (the division is exact then) and UNKNOWN where a symbolic dim is divided."""
    x = read.shape(node, 0)
    dtype = read.dtype(node)
    outputs = len(node.outputs)
    if x is None or len(x) < 3:
        return [(None, dtype)] + [(None, "int64")] * (outputs - 1)
    spatial = len(x) - 2
    if node.type == "Conv":
        weight = read.shape(node, 1)
        if weight is None or len(weight) != len(x):
            return [(None, dtype)]
        channels, kernel = weight[0], read.attribute(node, "kernel_shape") or tuple(weight[2:])
    else:
        channels, kernel = x[1], read.attribute(node, "kernel_shape")
    strides = read.attribute(node, "strides") or (1,) * spatial
    dilations = read.attribute(node, "dilations") or (1,) * spatial
    pads = read.attribute(node, "pads") or (0,) * (2 * spatial)
    auto_pad = read.attribute(node, "auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if kernel is None or not (len(kernel) == len(strides) == len(dilations) == spatial == len(pads) // 2):
        return [(None, dtype)] + [(None, "int64")] * (outputs - 1)
    ceil = bool(read.attribute(node, "ceil_mode", 0))
    result = [x[0], channels]
    for axis in range(spatial):
        size, stride = x[axis + 2], strides[axis]
        reach = dilations[axis] * (kernel[axis] - 1) + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            extent, padding, reach = size, 0, 1  # ceil(x / stride): floor((x - 1) / stride) + 1
        else:
            padding = 0 if auto_pad == "VALID" else pads[axis] + pads[axis + spatial]
            extent = size
        if isinstance(extent, int):
            span = extent + padding - reach
            out = (-(-span // stride) if ceil else span // stride) + 1
            result.append(UNKNOWN if out < 0 else out)  # 0 for an empty input under a kernel of 1
        elif stride == 1 and isinstance(extent, Term):
            result.append(dims.add(extent, padding - reach + 1))
        else:
            result.append(UNKNOWN)
    shape = tuple(result)
    return [(shape, dtype)] + [(shape, "int64")] * (outputs - 1)


def _top_k(adapter, node):
    shape = read.shape(node, 0)
    if shape is None:
        return [(None, read.dtype(node)), (None, "int64")]
    axis = read.attribute(node, "axis", -1)
    axis = axis + len(shape) if axis < 0 else axis
    k = read.attribute(node, "k") if len(node.inputs) < 2 else read.scalar(adapter, node, 1)
    if k is None or not (is_literal(k) and k >= 0 or isinstance(k, Term)):
        k = UNKNOWN
    result = tuple(k if position == axis else dim for position, dim in enumerate(shape))
    return [(result, read.dtype(node)), (result, "int64")]


def _transpose(adapter, node):
    shape = read.shape(node, 0)
    if shape is None:
        return [(None, read.dtype(node))]
    perm = read.attribute(node, "perm")
    perm = list(reversed(range(len(shape)))) if perm is None else list(perm)
    return [(tuple(shape[p] for p in perm), read.dtype(node))]


def _matmul(adapter, node):
    left, right = read.shape(node, 0), read.shape(node, 1)
    if left is None or right is None or not left or not right:
        return [(None, read.dtype(node))]
    a = (1,) + tuple(left) if len(left) == 1 else tuple(left)
    b = tuple(right) + (1,) if len(right) == 1 else tuple(right)
    batch = dims.broadcast_shapes(a[:-2], b[:-2])
    result = tuple(batch) + (a[-2], b[-1])
    if len(left) == 1:
        result = result[:-2] + result[-1:]
    if len(right) == 1:
        result = result[:-1]
    return [(result, read.dtype(node))]


def _reduce(adapter, node):
    shape = read.shape(node, 0)
    if shape is None:
        return [(None, read.dtype(node))]
    keepdims = read.attribute(node, "keepdims", 1)
    axes = read.ints(adapter, node, 1, "axes")
    if axes is None:
        if len(node.inputs) > 1 and node.inputs[1] is not None:
            return [(None, read.dtype(node))]
        if read.attribute(node, "noop_with_empty_axes", 0):
            return [(shape, read.dtype(node))]
        axes = list(range(len(shape)))
    reduced = set(read.axes(axes, len(shape)))
    result = []
    for axis, dim in enumerate(shape):
        if axis in reduced:
            if keepdims:
                result.append(1)
        else:
            result.append(dim)
    return [(tuple(result), read.dtype(node))]


_UNARY = (
    "Abs Acos Acosh Asin Asinh Atan Atanh BitwiseNot Ceil Celu Cos Cosh Elu Erf Exp Floor Gelu HardSigmoid "
    "HardSwish Identity IsInf IsNaN LeakyRelu Log LogSoftmax Mish Neg Not Reciprocal Relu Round Selu Shrink "
    "Sigmoid Sign Sin Sinh Softmax Softplus Softsign Sqrt Tan Tanh ThresholdedRelu Hardmax CumSum "
    "LayerNormalization RMSNormalization Dropout PRelu Clip CastLike Trilu MeanVarianceNormalization "
    "GroupNormalization LpNormalization LRN InstanceNormalization"
).split()
_BROADCASTING = "Add Sub Mul Div Pow Mod Max Min Sum Mean BitShift BitwiseAnd BitwiseOr BitwiseXor".split()
_COMPARISONS = "Equal Less LessOrEqual Greater GreaterOrEqual And Or Xor".split()

RULES = {
    **{name: _same for name in _UNARY},
    **{name: _broadcast for name in _BROADCASTING},
    **{name: _compare for name in _COMPARISONS},
    "Where": _where,
    "Expand": _expand,
    "Tile": _tile,
    "Shape": _shape_op,
    "Cast": _cast,
    "Constant": _constant,
    "ConstantOfShape": _constant_of_shape,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": _concat,
    "Gather": _gather,
    "Slice": _slice,
    "Reshape": _reshape,
    "Range": _range,
    "Flatten": _flatten,
    "Size": _size,
    "GatherElements": _gather_elements,
    "If": _if,
    "Loop": _loop,
    "TopK": _top_k,
    **{name: _global_pool for name in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")},
    "Transpose": _transpose,
    "Conv": _window,
    "MaxPool": _window,
    "AveragePool": _window,
    "MatMul": _matmul,
    **{name: _reduce for name in "ReduceMean ReduceSum ReduceMax ReduceMin ReduceProd ReduceL2 ReduceL1 "
       "ReduceLogSum ReduceLogSumExp ReduceSumSquare".split()},
}
RULES["CastLike"] = lambda adapter, node: [(read.shape(node, 0), read.dtype(node, 1))]


# ---------------------------------------------------------------- provenance


def carried_axes(node: Node, axis: int) -> list[tuple[Value, int | None]] | None:
    """The input dims dim `axis` of `node`'s first output is inferred from.

    As (input, axis) pairs, with axis None for an input of unknown rank;
    None where the rules here do not map an output axis to input axes
    (the caller then looks at every input). Used to find the node whose
    inference lost a dim, not to infer anything.
    """
    kind = _AXIS_MAPS.get(node.type)
    if kind is None or not node.outputs or node.outputs[0] is None or node.outputs[0].shape is None:
        return None
    rank = len(node.outputs[0].shape)
    inputs = [v for v in node.inputs if v is not None]
    if kind == "same":
        return [(inputs[0], axis)] if inputs else None
    if kind == "broadcast":
        pairs = []
        for value in inputs:
            if value.shape is None:
                pairs.append((value, None))
            elif axis - (rank - len(value.shape)) >= 0:
                pairs.append((value, axis - (rank - len(value.shape))))
        return pairs
    if kind == "concat":
        return [(value, axis if value.shape is not None else None) for value in inputs]
    if kind == "transpose":
        perm = read.attribute(node, "perm")
        perm = list(reversed(range(rank))) if perm is None else list(perm)
        return [(inputs[0], perm[axis])] if inputs and axis < len(perm) else None
    if kind == "expand":
        # Right-aligned against the input; the target shape is a value, not a dim.
        data = node.inputs[0] if node.inputs else None
        if data is None or data.shape is None:
            return [(data, None)] if data is not None else None
        offset = rank - len(data.shape)
        return [(data, axis - offset)] if axis >= offset else []
    if kind == "gather":
        data, indices = read.operand(node, 0), read.operand(node, 1)
        if data is None or indices is None or data.shape is None or indices.shape is None:
            return None
        gathered = read.attribute(node, "axis", 0)
        gathered = gathered + len(data.shape) if gathered < 0 else gathered
        if axis < gathered:
            return [(data, axis)]
        if axis < gathered + len(indices.shape):
            return [(indices, axis - gathered)]
        return [(data, axis - len(indices.shape) + 1)]
    return None


_AXIS_MAPS = {
    **{name: "same" for name in _UNARY + ["Cast", "CastLike", "Identity", "Slice", "Tile", "TopK"]},
    **{name: "broadcast" for name in _BROADCASTING + _COMPARISONS + ["Where"]},
    "Concat": "concat",
    "Transpose": "transpose",
    "Expand": "expand",
    "Gather": "gather",
}
