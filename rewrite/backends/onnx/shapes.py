"""Symbolic shape inference for ONNX graphs, onnx-light's semantics.

What is trusted, and why:

* Graph inputs: their `dim_param`s are the user's declaration, so a name
  shared by two inputs means one size.
* Everything else is inferred here, forward, in graph order, with the dim
  algebra of `rewrite.engine.shapes`. Shapes written into `value_info` by an
  exporter fill in only where inference knows nothing: their literal dims are
  taken, but their `dim_param`s become symbols local to that value and axis,
  because exporters reuse placeholder names across unrelated nodes.

Values used as shapes are followed too: `Value.contents` holds the dims a
1-D (or scalar) int value carries, through `Shape`, `Gather`, `Slice`,
`Concat`, `Unsqueeze`, `Squeeze`, `Cast`, `Add`/`Sub`/`Mul`, constants and
the `Where(Equal(s, -1), ..., s)` chain the TorchScript exporter emits for
`expand(-1, ...)`, so that `Expand(x, Shape(y))` is known to produce y's dims.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import numpy_helper

from rewrite.engine import shape_values
from rewrite.engine import shapes as dims
from rewrite.engine.logic import UNKNOWN, Symbol, is_literal

if TYPE_CHECKING:  # pragma: no cover
    from rewrite.backends.onnx.adapter import Graph, Node, OnnxAdapter, Value

_DTYPE_NAMES = {
    onnx.TensorProto.FLOAT: "fp32", onnx.TensorProto.FLOAT16: "fp16", onnx.TensorProto.DOUBLE: "fp64",
    onnx.TensorProto.BFLOAT16: "bf16", onnx.TensorProto.INT8: "int8", onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.INT16: "int16", onnx.TensorProto.UINT16: "uint16", onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.UINT32: "uint32", onnx.TensorProto.INT64: "int64", onnx.TensorProto.UINT64: "uint64",
    onnx.TensorProto.BOOL: "bool", onnx.TensorProto.STRING: "string",
}


def dtype_name(elem_type: int) -> str | None:
    return _DTYPE_NAMES.get(elem_type)


# The element types onnx can turn into arrays (its own table, read once).
_NUMPY_TYPES = frozenset(onnx.helper.get_all_tensor_dtypes())
# Those stored two to a byte, whose raw size is not elements times item size.
_PACKED_TYPES = frozenset(
    getattr(onnx.TensorProto, name) for name in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
    if hasattr(onnx.TensorProto, name)
)


# ---------------------------------------------------------------- declarations


def declare(value: Value, info: onnx.ValueInfoProto, trusted: bool) -> None:
    """Take what a ValueInfoProto says about `value` (before inference runs)."""
    tensor = info.type.tensor_type if info.type.HasField("tensor_type") else None
    if tensor is None:
        return
    if value.dtype is None and tensor.elem_type:
        value.dtype = dtype_name(tensor.elem_type)
    if value.shape is not None or not tensor.HasField("shape"):
        return
    shape = []
    for axis, dim in enumerate(tensor.shape.dim):
        if dim.HasField("dim_value") and dim.dim_value >= 0:
            shape.append(int(dim.dim_value))
        elif dim.HasField("dim_param") and dim.dim_param:
            name = dim.dim_param if trusted else f"{dim.dim_param}@{value.name}:{axis}"
            shape.append(Symbol(name))
        else:
            shape.append(UNKNOWN)
    value.shape = tuple(shape)


class UnreadableTensor(Exception):
    """A tensor whose bytes do not hold what its header declares; the message says why."""


def read_tensor(tensor: onnx.TensorProto, base_dir: str | None) -> np.ndarray:
    """The tensor's array; `UnreadableTensor` if its data type or size is not what it claims."""
    if tensor.data_type not in _NUMPY_TYPES:
        raise UnreadableTensor(f"unknown data type {tensor.data_type}")
    try:
        return numpy_helper.to_array(tensor, base_dir or "")
    except Exception as error:  # onnx and numpy raise several kinds for corrupt data
        raise UnreadableTensor(_why_unreadable(tensor, error)) from None


def _why_unreadable(tensor: onnx.TensorProto, error: Exception) -> str:
    # numpy's own words ("buffer size must be a multiple of element size")
    # do not say which sizes disagree; for plain raw data they can be told.
    plain = tensor.data_type not in _PACKED_TYPES and tensor.data_type != onnx.TensorProto.STRING
    if plain and tensor.HasField("raw_data") and tensor.data_location != onnx.TensorProto.EXTERNAL:
        if any(d < 0 for d in tensor.dims):
            return f"its shape {list(tensor.dims)} has a negative dimension"
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        needed = int(np.prod(tensor.dims, dtype=np.int64)) * itemsize
        if len(tensor.raw_data) != needed:
            return f"its raw data holds {len(tensor.raw_data)} bytes where its shape and type need {needed}"
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


# The Constant attributes that hold a number or tensor, with the type each must have.
_CONSTANT_ATTRIBUTES = {
    "value": onnx.AttributeProto.TENSOR,
    "value_int": onnx.AttributeProto.INT,
    "value_float": onnx.AttributeProto.FLOAT,
    "value_ints": onnx.AttributeProto.INTS,
    "value_floats": onnx.AttributeProto.FLOATS,
}


def _constant_attribute(node: Node) -> onnx.AttributeProto | None:
    # One of the wrong type breaks the schema; not understanding it, the
    # engine treats the value as unknown and leaves it alone.
    for attribute in node.proto.attribute:
        if _CONSTANT_ATTRIBUTES.get(attribute.name) == attribute.type:
            return attribute
    return None


def constant_of(value: Value, base_dir: str | None) -> np.ndarray | None:
    """The value's compile-time constant: an initializer or a Constant node's value.

    Raises `UnreadableTensor` for a tensor whose data is corrupt.
    """
    if value.initializer is not None:
        # An initializer of the main graph that is also a graph input can be
        # overridden at run time: not a constant.
        if any(info.name == value.name for info in value.graph.proto.input):
            return None
        return read_tensor(value.initializer, base_dir)
    node = value.producer
    if node is None or node.type != "Constant":
        return None
    attribute = _constant_attribute(node)
    if attribute is None:
        return None
    if attribute.type == onnx.AttributeProto.TENSOR:
        return read_tensor(attribute.t, base_dir)
    found = onnx.helper.get_attribute_value(attribute)
    return np.asarray(found if attribute.type in (onnx.AttributeProto.INT, onnx.AttributeProto.FLOAT) else list(found))


# ---------------------------------------------------------------- inference


def infer(adapter: OnnxAdapter, graph: Graph) -> None:
    """Infer shapes, dtypes and contents for every node of `graph`, subgraphs included."""
    for value in graph.values.values():
        if value.initializer is not None and value.contents is None:
            _contents_from_constant(adapter, value)
    for node in graph.nodes:
        for block in node.blocks:
            infer(adapter, block)
        infer_node(adapter, node)


def infer_node(adapter: OnnxAdapter, node: Node) -> None:
    """Infer one node's outputs from its inputs; keep what declarations add."""
    op_type = node.type  # carries its domain unless it is the default one
    rule = _RULES.get(op_type)
    results = None
    if rule is not None:
        try:
            results = rule(adapter, node)
        except dims.IncompatibleShapes:
            results = None
        except _MALFORMED:
            results = None  # a malformed node; its shapes stay unknown
    outputs = node.outputs
    if None in outputs:
        outputs = tuple(v for v in outputs if v is not None)
    if results is not None:
        for value, (shape, dtype) in zip(outputs, results):
            value.shape = _merge(shape, value.shape)
            if dtype is not None:
                value.dtype = dtype
    if op_type == "Constant" and outputs:
        _contents_from_constant(adapter, outputs[0])
    else:
        contents = _CONTENTS.get(op_type)
        if contents is not None and outputs:
            try:
                outputs[0].contents = contents(adapter, node)
            except _MALFORMED:
                outputs[0].contents = None


# What a rule meets in a node that breaks its schema (an axis out of range,
# an attribute of the wrong type, too few inputs). A corrupt tensor is not
# among them: the adapter reports that as an `OnnxError` naming the node.
_MALFORMED = (ArithmeticError, AttributeError, LookupError, StopIteration, TypeError, ValueError)

# Beyond any rank a real model has (the contents of shape values stop at 64 too).
_MAX_RANK = 64


def _merge(inferred, declared):
    if inferred is None:
        return declared
    if declared is None or len(declared) != len(inferred):
        return inferred if type(inferred) is tuple else tuple(inferred)
    merged = []
    for ours, theirs in zip(inferred, declared):
        if ours is UNKNOWN:
            merged.append(theirs)  # a declared literal, or a value-local symbol
        else:
            merged.append(ours)
    return tuple(merged)


def _contents_from_constant(adapter: OnnxAdapter, value: Value) -> None:
    if value.dtype not in ("int64", "int32"):
        return
    # Judged from the header, so that no big tensor is read only to be dropped.
    shape = value.shape
    if shape is not None and (len(shape) > 1 or (shape and is_literal(shape[0]) and shape[0] > 64)):
        return
    constant = adapter.constant(value)
    if constant is None or constant.ndim > 1 or constant.size > 64:
        return
    value.contents = [int(v) for v in constant.reshape(-1)]
    if constant.ndim == 0:
        value.contents = [int(constant)]


# ---- helpers

def _in(node: Node, position: int) -> Value | None:
    return node.inputs[position] if position < len(node.inputs) else None


def _shape(node: Node, position: int):
    value = _in(node, position)
    return None if value is None else value.shape


def _dtype(node: Node, position: int = 0):
    value = _in(node, position)
    return None if value is None else value.dtype


def _attr(node: Node, name: str, default=None):
    for attribute in node.proto.attribute:
        if attribute.name == name:
            return onnx.helper.get_attribute_value(attribute)
    return default


def _ints(adapter: OnnxAdapter, node: Node, position: int, attribute: str | None = None):
    """Int list from an input's constant (newer opsets) or an attribute (older)."""
    value = _in(node, position)
    if value is not None:
        constant = adapter.constant(value)
        return None if constant is None else [int(v) for v in np.asarray(constant).reshape(-1)]
    if attribute is not None:
        found = _attr(node, attribute)
        return None if found is None else [int(v) for v in found]
    return None


def _same(adapter, node):
    return [(_shape(node, 0), _dtype(node))]


def _broadcast(adapter, node):
    shapes = [v.shape for v in node.inputs if v is not None]
    return [(dims.broadcast_shapes(*shapes), _dtype(node))]


def _compare(adapter, node):
    shapes = [v.shape for v in node.inputs if v is not None]
    return [(dims.broadcast_shapes(*shapes), "bool")]


def _where(adapter, node):
    shapes = [v.shape for v in node.inputs if v is not None]
    return [(dims.broadcast_shapes(*shapes), _dtype(node, 1))]


def _expand(adapter, node):
    target = _in(node, 1)
    shape = _shape(node, 0)
    if target is None or shape is None:
        return [(None, _dtype(node))]
    if target.contents is not None:
        return [(dims.broadcast_shapes(shape, target.contents), _dtype(node))]
    length = _vector_length(target)
    if length is not None:
        return [((UNKNOWN,) * max(len(shape), length), _dtype(node))]
    return [(None, _dtype(node))]


def _vector_length(value: Value) -> int | None:
    """How many dims a 1-D shape operand holds, if known and plausible as a rank."""
    shape = value.shape
    if shape is None or len(shape) != 1 or not is_literal(shape[0]):
        return None
    # A declared length in the billions is a corrupt declaration, not a rank;
    # taken at its word it would build a tuple that long.
    return int(shape[0]) if 0 <= shape[0] <= _MAX_RANK else None


def _tile(adapter, node):
    shape, repeats = _shape(node, 0), _ints(adapter, node, 1)
    if shape is None:
        return [(None, _dtype(node))]
    if repeats is None:
        # The spec wants one repeat per axis; onnxruntime runs other lengths
        # too and changes the rank, so the rank is known only from a length
        # that matches.
        length = _shape(node, 1)
        known = length is not None and len(length) == 1 and length[0] == len(shape)
        return [((UNKNOWN,) * len(shape) if known else None, _dtype(node))]
    if len(repeats) != len(shape):
        return [(None, _dtype(node))]
    return [(tuple(dims.multiply(d, r) for d, r in zip(shape, repeats)), _dtype(node))]


def _shape_op(adapter, node):
    shape = _shape(node, 0)
    if shape is None:
        return [(None, "int64")]
    start, end = _shape_range(node, len(shape))
    return [((max(end - start, 0),), "int64")]


def _shape_range(node, rank):
    start = _attr(node, "start", 0)
    end = _attr(node, "end", rank)
    start = max(0, min(rank, start + rank if start < 0 else start))
    end = max(0, min(rank, end + rank if end < 0 else end))
    return start, end


def _shape_contents(adapter, node):
    shape = _shape(node, 0)
    if shape is None:
        return None
    start, end = _shape_range(node, len(shape))
    return list(shape[start:end])


def _cast(adapter, node):
    return [(_shape(node, 0), dtype_name(_attr(node, "to", 0)))]


def _constant(adapter, node):
    # From the header alone: the data is read (and checked) only if its
    # contents are wanted.
    attribute = _constant_attribute(node)
    if attribute is None:
        return [(None, None)]
    kind = attribute.type
    if kind == onnx.AttributeProto.TENSOR:
        shape = tuple(int(d) for d in attribute.t.dims)
        return [(None if any(d < 0 for d in shape) else shape, dtype_name(attribute.t.data_type))]
    if kind == onnx.AttributeProto.INTS:
        return [((len(attribute.ints),), "int64")]
    if kind == onnx.AttributeProto.FLOATS:
        return [((len(attribute.floats),), "fp32")]
    return [((), "int64" if kind == onnx.AttributeProto.INT else "fp32")]


def _constant_of_shape(adapter, node):
    target = _in(node, 0)
    value = _attr(node, "value")
    dtype = "fp32" if value is None else dtype_name(value.data_type)
    if target is not None and target.contents is not None:
        return [(tuple(target.contents), dtype)]
    return [(None, dtype)]


def _axes(axes, rank):
    return sorted(a + rank if a < 0 else a for a in axes)


def _unsqueeze(adapter, node):
    shape = _shape(node, 0)
    axes = _ints(adapter, node, 1, "axes")
    if shape is None or axes is None:
        return [(None, _dtype(node))]
    rank = len(shape) + len(axes)
    result, source = [], iter(shape)
    normalized = set(_axes(axes, rank))
    for axis in range(rank):
        result.append(1 if axis in normalized else next(source))
    return [(tuple(result), _dtype(node))]


def _squeeze(adapter, node):
    shape = _shape(node, 0)
    if shape is None:
        return [(None, _dtype(node))]
    axes = _ints(adapter, node, 1, "axes")
    if axes is None:
        if len(node.inputs) > 1 and node.inputs[1] is not None:
            return [(None, _dtype(node))]
        if any(not is_literal(d) for d in shape):
            return [(None, _dtype(node))]
        return [(tuple(d for d in shape if d != 1), _dtype(node))]
    drop = set(_axes(axes, len(shape)))
    return [(tuple(d for axis, d in enumerate(shape) if axis not in drop), _dtype(node))]


def _unsqueeze_contents(adapter, node):
    # A scalar dim becomes a one-element shape vector; anything else is no
    # longer a flat list of dims.
    source = _in(node, 0)
    if source is None or source.contents is None or source.shape != ():
        return None
    return list(source.contents)


def _squeeze_contents(adapter, node):
    source = _in(node, 0)
    return None if source is None else source.contents


def _concat(adapter, node):
    shapes = [v.shape for v in node.inputs if v is not None]
    if any(s is None for s in shapes) or not shapes:
        return [(None, _dtype(node))]
    rank = len(shapes[0])
    axis = _attr(node, "axis", 0)
    axis = axis + rank if axis < 0 else axis
    result = list(shapes[0])
    total = 0
    for shape in shapes:
        if len(shape) != rank:
            return [(None, _dtype(node))]
        total = dims.add(total, shape[axis])
    result[axis] = total
    for other in shapes[1:]:
        for position in range(rank):
            if position != axis and result[position] is UNKNOWN:
                result[position] = other[position]
    return [(tuple(result), _dtype(node))]


def _concat_contents(adapter, node):
    return shape_values.concatenated([None if v is None else v.contents for v in node.inputs])


def _gather(adapter, node):
    data, indices = _shape(node, 0), _shape(node, 1)
    if data is None or indices is None:
        return [(None, _dtype(node))]
    axis = _attr(node, "axis", 0)
    axis = axis + len(data) if axis < 0 else axis
    return [(tuple(data[:axis]) + tuple(indices) + tuple(data[axis + 1 :]), _dtype(node))]


def _gather_contents(adapter, node):
    data, indices = _in(node, 0), _in(node, 1)
    if data is None or indices is None or _attr(node, "axis", 0) != 0:
        return None
    constant = adapter.constant(indices)
    if constant is None:
        return None
    return shape_values.gathered(data.contents, [int(i) for i in np.asarray(constant).reshape(-1)])


def _slice_parameters(adapter, node):
    if len(node.inputs) == 1:  # opset < 10: attributes
        return _attr(node, "starts"), _attr(node, "ends"), _attr(node, "axes"), None
    starts, ends = _ints(adapter, node, 1), _ints(adapter, node, 2)
    axes = _ints(adapter, node, 3) if _in(node, 3) is not None else None
    steps = _ints(adapter, node, 4) if _in(node, 4) is not None else None
    return starts, ends, axes, steps


def _slice(adapter, node):
    shape = _shape(node, 0)
    if shape is None:
        return [(None, _dtype(node))]
    starts, ends, axes, steps = _slice_parameters(adapter, node)
    if starts is None or ends is None:
        return [((UNKNOWN,) * len(shape), _dtype(node))]
    axes = list(range(len(starts))) if axes is None else [a + len(shape) if a < 0 else a for a in axes]
    steps = steps or [1] * len(starts)
    result = list(shape)
    for axis, start, end, step in zip(axes, starts, ends, steps):
        dim = shape[axis]
        if is_literal(dim):
            result[axis] = len(range(*slice(start, end, step).indices(int(dim))))
        elif start == 0 and step == 1 and end >= 2**62:
            result[axis] = dim
        else:
            result[axis] = UNKNOWN
    return [(tuple(result), _dtype(node))]


def _slice_contents(adapter, node):
    source = _in(node, 0)
    if source is None:
        return None
    starts, ends, axes, steps = _slice_parameters(adapter, node)
    if starts is None or ends is None or len(starts) != 1 or (axes not in (None, [0], [-1])):
        return None
    return shape_values.sliced(source.contents, starts[0], ends[0], (steps or [1])[0])


def _elementwise_contents(operation: str):
    def contents(adapter, node):
        left, right = _in(node, 0), _in(node, 1)
        if left is None or right is None:
            return None
        return shape_values.elementwise(operation, left.contents, right.contents)

    return contents


def _equal_contents(adapter, node):
    left, right = _in(node, 0), _in(node, 1)
    if left is None or right is None:
        return None
    return shape_values.equal(left.contents, right.contents)


def _where_contents(adapter, node):
    condition, left, right = _in(node, 0), _in(node, 1), _in(node, 2)
    if condition is None or left is None or right is None:
        return None
    return shape_values.chosen(condition.contents, left.contents, right.contents)


def _constant_of_shape_contents(adapter, node):
    target, value = _in(node, 0), _attr(node, "value")
    if target is None or target.contents is None or len(target.contents) != 1 or value is None:
        return None
    length, fill = target.contents[0], numpy_helper.to_array(value).reshape(-1)
    if not is_literal(length) or length > 64 or fill.dtype.kind not in "iu":
        return None
    return [int(fill[0])] * int(length)


def _flatten_contents(adapter, node):
    # Reshaping a shape vector to one dimension keeps its elements in order.
    source, output = _in(node, 0), node.outputs[0]
    if source is None or source.contents is None or source.shape is None or len(source.shape) > 1:
        return None
    if output.shape is None or len(output.shape) != 1:
        return None
    return list(source.contents)


def _passthrough_contents(adapter, node):
    source = _in(node, 0)
    return None if source is None else source.contents


def _range(adapter, node):
    start, limit, delta = (_in(node, position) for position in range(3))
    known = [
        v.contents[0] if v is not None and v.contents and v.shape == () else UNKNOWN for v in (start, limit, delta)
    ]
    first, last, step = known
    if first == 0 and step == 1 and last is not UNKNOWN:
        length = last if not is_literal(last) else max(int(last), 0)
    elif all(is_literal(v) for v in known) and step != 0:
        length = max(int(np.ceil((last - first) / step)), 0)
    else:
        length = UNKNOWN
    return [((length,), _dtype(node))]


def _reshape(adapter, node):
    shape, target = _shape(node, 0), _in(node, 1)
    if target is None or target.contents is None:
        length = None if target is None else _vector_length(target)
        if length is not None:
            return [((UNKNOWN,) * length, _dtype(node))]
        return [(None, _dtype(node))]
    allow_zero = _attr(node, "allowzero", 0)
    result = []
    for position, dim in enumerate(target.contents):
        if dim == 0 and not allow_zero:
            result.append(shape[position] if shape is not None and position < len(shape) else UNKNOWN)
        elif is_literal(dim) and dim < 0:
            result.append(UNKNOWN)
        else:
            result.append(dim)
    if UNKNOWN in result and shape is not None and all(is_literal(d) for d in shape):
        known = [d for d in result if d is not UNKNOWN]
        if result.count(UNKNOWN) == 1 and all(is_literal(d) for d in known):
            total = int(np.prod(shape)) if shape else 1
            rest = int(np.prod(known)) if known else 1
            if rest and total % rest == 0:
                result[result.index(UNKNOWN)] = total // rest
    return [(tuple(result), _dtype(node))]


def _transpose(adapter, node):
    shape = _shape(node, 0)
    if shape is None:
        return [(None, _dtype(node))]
    perm = _attr(node, "perm")
    perm = list(reversed(range(len(shape)))) if perm is None else list(perm)
    return [(tuple(shape[p] for p in perm), _dtype(node))]


def _matmul(adapter, node):
    left, right = _shape(node, 0), _shape(node, 1)
    if left is None or right is None or not left or not right:
        return [(None, _dtype(node))]
    a = (1,) + tuple(left) if len(left) == 1 else tuple(left)
    b = tuple(right) + (1,) if len(right) == 1 else tuple(right)
    batch = dims.broadcast_shapes(a[:-2], b[:-2])
    result = tuple(batch) + (a[-2], b[-1])
    if len(left) == 1:
        result = result[:-2] + result[-1:]
    if len(right) == 1:
        result = result[:-1]
    return [(result, _dtype(node))]


def _reduce(adapter, node):
    shape = _shape(node, 0)
    if shape is None:
        return [(None, _dtype(node))]
    keepdims = _attr(node, "keepdims", 1)
    axes = _ints(adapter, node, 1, "axes")
    if axes is None:
        if len(node.inputs) > 1 and node.inputs[1] is not None:
            return [(None, _dtype(node))]
        if _attr(node, "noop_with_empty_axes", 0):
            return [(shape, _dtype(node))]
        axes = list(range(len(shape)))
    reduced = set(_axes(axes, len(shape)))
    result = []
    for axis, dim in enumerate(shape):
        if axis in reduced:
            if keepdims:
                result.append(1)
        else:
            result.append(dim)
    return [(tuple(result), _dtype(node))]


_UNARY = (
    "Abs Acos Acosh Asin Asinh Atan Atanh BitwiseNot Ceil Celu Cos Cosh Elu Erf Exp Floor Gelu HardSigmoid "
    "HardSwish Identity IsInf IsNaN LeakyRelu Log LogSoftmax Mish Neg Not Reciprocal Relu Round Selu Shrink "
    "Sigmoid Sign Sin Sinh Softmax Softplus Softsign Sqrt Tan Tanh ThresholdedRelu Hardmax CumSum "
    "LayerNormalization RMSNormalization Dropout PRelu Clip CastLike"
).split()
_BROADCASTING = "Add Sub Mul Div Pow Mod Max Min Sum Mean BitShift BitwiseAnd BitwiseOr BitwiseXor".split()
_COMPARISONS = "Equal Less LessOrEqual Greater GreaterOrEqual And Or Xor".split()

_RULES = {
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
    "Transpose": _transpose,
    "MatMul": _matmul,
    **{name: _reduce for name in "ReduceMean ReduceSum ReduceMax ReduceMin ReduceProd ReduceL2 ReduceL1 "
       "ReduceLogSum ReduceLogSumExp ReduceSumSquare".split()},
}
_RULES["CastLike"] = lambda adapter, node: [(_shape(node, 0), _dtype(node, 1))]

# ---------------------------------------------------------------- provenance


def carried_axes(node: Node, axis: int) -> list[tuple[Value, int | None]] | None:
    """The input dims dim `axis` of `node`'s first output is inferred from.

    As (input, axis) pairs, with axis None for an input of unknown rank;
    None where the rules above do not map an output axis to input axes
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
        perm = _attr(node, "perm")
        perm = list(reversed(range(rank))) if perm is None else list(perm)
        return [(inputs[0], perm[axis])] if inputs and axis < len(perm) else None
    return None


_AXIS_MAPS = {
    **{name: "same" for name in _UNARY + ["Cast", "CastLike", "Identity"]},
    **{name: "broadcast" for name in _BROADCASTING + _COMPARISONS + ["Where"]},
    "Concat": "concat",
    "Transpose": "transpose",
}

_CONTENTS = {
    "Shape": _shape_contents,
    "Concat": _concat_contents,
    "Gather": _gather_contents,
    "Slice": _slice_contents,
    "Unsqueeze": _unsqueeze_contents,
    "Squeeze": _squeeze_contents,
    "Cast": _passthrough_contents,
    "Identity": _passthrough_contents,
    "Reshape": _flatten_contents,
    "Add": _elementwise_contents("+"),
    "Sub": _elementwise_contents("-"),
    "Mul": _elementwise_contents("*"),
    "Equal": _equal_contents,
    "Where": _where_contents,
    "ConstantOfShape": _constant_of_shape_contents,
}
