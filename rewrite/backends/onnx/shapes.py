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
1-D (or scalar) int value carries, through `Shape` (start, end), `Size`,
`Gather`/`GatherElements`, `Slice`, `Concat`, `Unsqueeze`, `Squeeze`, `Cast`,
`Add`/`Sub`/`Mul`/`Div`, `Range`, `ConstantOfShape`, constants and the
`Where(Equal(s, -1), ..., s)` chain the TorchScript exporter emits for
`expand(-1, ...)`, so that `Expand(x, Shape(y))` is known to produce y's dims.
Reshape's -1, a Slice's extent, Range's length and Flatten's sizes are
worked out symbolically (see "dims as polynomials"): only what holds for
every size the inputs can have, so Reshape(ids[batch, seq], [-1, seq]) is
[batch, seq], and x[:, :t] is [batch, min(seq, t)].

The rules here come first. Every other op of the default domain is typed by
onnx's own per-node inference with our symbols passed through it (see
"onnx's own inference"), cached per kind of node so that the cost stays
linear in the graph.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import numpy_helper

from rewrite.engine import shape_values
from rewrite.engine import shapes as dims
from rewrite.engine.interfaces import ModelError
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


# The most elements a sparse initializer may have to be read as a dense array
# (4 MiB of float32): a rule needs a few; a sparse weight stays sparse.
SPARSE_READ_LIMIT = 1 << 20


def read_sparse_tensor(tensor: onnx.SparseTensorProto, base_dir: str | None) -> np.ndarray | None:
    """A sparse tensor as a dense array, None past `SPARSE_READ_LIMIT` elements;
    `UnreadableTensor` if its indices do not fit its shape."""
    dims = [int(d) for d in tensor.dims]
    size = int(np.prod(dims, dtype=np.int64)) if dims else 1
    if size > SPARSE_READ_LIMIT or any(d < 0 for d in dims):
        return None
    values = read_tensor(tensor.values, base_dir).reshape(-1)
    indices = read_tensor(tensor.indices, base_dir).astype(np.int64) if tensor.indices.dims else np.zeros(
        (0,), np.int64)
    if indices.ndim == 2 and indices.shape[0] == values.size and indices.shape[1] == len(dims):
        flat = np.ravel_multi_index(tuple(indices.T), dims) if values.size else np.zeros((0,), np.int64)
    elif indices.ndim == 1 and indices.size == values.size:
        flat = indices
    else:
        raise UnreadableTensor(f"its indices of shape {list(indices.shape)} do not fit {values.size} values "
                               f"of a tensor of shape {dims}")
    if flat.size and (flat.min() < 0 or flat.max() >= size):
        raise UnreadableTensor(f"an index lies outside its shape {dims}")
    dense = np.zeros(size, dtype=values.dtype)
    dense[flat] = values
    return dense.reshape(dims)


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
        # (One a user may override at run time is indexed as an input alone.)
        if isinstance(value.initializer, onnx.SparseTensorProto):
            return read_sparse_tensor(value.initializer, base_dir)
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
    try:
        results = inferred_outputs(adapter, node)
    except dims.IncompatibleShapes:
        results = None
    outputs = node.outputs
    if None in outputs:
        outputs = tuple(v for v in outputs if v is not None)
    if results is not None:
        pool = adapter.shape_pool
        for value, (shape, dtype) in zip(outputs, results):
            shape = _merge(shape, value.shape)
            # One tuple per distinct shape: a million outputs of a few shapes
            # held a million tuples (55 MB at a million Expands).
            value.shape = shape if shape is None else pool.setdefault(shape, shape)
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


def inferred_outputs(adapter: OnnxAdapter, node: Node) -> list | None:
    """(shape, dtype) of each output `node` has, from its inputs as they are,
    by the rules here or onnx's own inference; None where neither says, and
    nothing is written. Raises `dims.IncompatibleShapes` for inputs whose
    shapes the op cannot combine (operands that do not broadcast)."""
    op_type = node.type  # carries its domain unless it is the default one
    rule = _RULES.get(op_type)
    if rule is not None:
        try:
            return rule(adapter, node)
        except _MALFORMED:
            return None  # a malformed node; its shapes stay unknown
    if "." not in op_type:
        # Every other op of the default domain: onnx's own inference for it.
        return _fallback(adapter, node)
    return None


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
    if value.dtype not in ("int64", "int32", "bool"):
        return
    # Judged from the header, so that no big tensor is read only to be dropped.
    shape = value.shape
    if shape is not None and (len(shape) > 1 or (shape and is_literal(shape[0]) and shape[0] > 64)):
        return
    constant = adapter.constant(value)
    if constant is None or constant.ndim > 1 or constant.size > 64:
        return
    convert = bool if constant.dtype == np.bool_ else int
    value.contents = [convert(v) for v in constant.reshape(-1)]


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


def _values(adapter: OnnxAdapter, node: Node, position: int):
    """What a 1-D (or scalar) int input holds, as dims: its constant, else its
    contents (a shape value: symbols allowed); None if neither is known."""
    value = _in(node, position)
    if value is None:
        return None
    if value.initializer is not None or (value.producer is not None and value.producer.type == "Constant"):
        constant = adapter.constant(value)
        if constant is not None and constant.size <= _MAX_RANK:
            return [int(v) for v in np.asarray(constant).reshape(-1)]
    return None if value.contents is None else list(value.contents)


def _scalar(adapter: OnnxAdapter, node: Node, position: int):
    """A scalar (or one-element) input's value: a number, a symbol, or UNKNOWN."""
    value = _in(node, position)
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


# ---- dims as polynomials
#
# Solving Reshape's -1, Range's length and a Slice's extent needs a little
# algebra on symbolic dims: products that cancel, differences that are
# provably not negative. A dim is read as a polynomial over atoms (integer
# coefficients) when its name is one `rewrite.engine.shapes` builds, such as
# "(batch*seq)" or "(past+seq)", and whose every leaf is a plain name or an
# integer; any other symbol is one atom, named by itself. Nothing is assumed
# about an atom but its name: two atoms are one number only when the names
# are equal. An atom whose name does not start with "(" is a size (the dim
# of some tensor, or an expression of sizes that is one), so never negative.

_MAX_TERMS = 16
_OPERATOR_CHARACTERS = frozenset("()+-*,")


def _poly(dim) -> dict | None:
    """`dim` as {monomial (sorted atom names): coefficient}; None for UNKNOWN or a non-integer."""
    if type(dim) is int or (is_literal(dim) and float(dim).is_integer()):
        return {(): int(dim)} if dim else {}
    if type(dim) is not Symbol:
        return None
    return _poly_of_name(dim.name)


@functools.lru_cache(maxsize=4096)
def _poly_of_name(name: str) -> dict | None:
    if name.startswith("("):
        parsed = _parse_expression(name)
        if parsed is not None:
            return parsed
    return {(name,): 1}


def _parse_expression(name: str) -> dict | None:
    """"(L op R)" as built by `dims.add`/`subtract`/`multiply`; None if it is not one."""
    if not (name.startswith("(") and name.endswith(")")):
        return None
    inner, depth = name[1:-1], 0
    for position, character in enumerate(inner):
        if character == "(":
            depth += 1
        elif character == ")":
            depth -= 1
            if depth < 0:
                return None
        elif depth == 0 and character in "+-*" and position > 0:
            left, right = _parse_operand(inner[:position]), _parse_operand(inner[position + 1 :])
            if left is None or right is None:
                return None
            if character == "+":
                return _poly_add(left, right)
            if character == "-":
                return _poly_add(left, _poly_scale(right, -1))
            return _poly_multiply(left, right)
    return None


def _parse_operand(text: str) -> dict | None:
    if text.startswith("("):
        return _parse_expression(text)
    try:
        number = int(text)
    except ValueError:
        pass
    else:
        return {(): number} if number else {}
    if _CALL.fullmatch(text) and _balanced(text):
        return {(text,): 1}  # min(a,b), broadcast(a,b): one atom, its operators all inside
    if not text or _OPERATOR_CHARACTERS.intersection(text):
        return None  # a leaf that could be read more than one way
    return {(text,): 1}


_CALL = re.compile(r"[A-Za-z_]\w*\(.*\)")


def _balanced(text: str) -> bool:
    """Parentheses that open at the first one and close only at the end."""
    depth = 0
    for position, character in enumerate(text):
        if character == "(":
            depth += 1
        elif character == ")":
            depth -= 1
            if depth < 0 or (depth == 0 and position != len(text) - 1):
                return False
    return depth == 0


def _arguments(name: str) -> list[str] | None:
    """The arguments of a "min(a,b)" atom; None for any other name."""
    if not (name.startswith("min(") and _balanced(name)):
        return None
    parts, depth, start = [], 0, 4
    for position in range(4, len(name) - 1):
        character = name[position]
        if character == "(":
            depth += 1
        elif character == ")":
            depth -= 1
        elif character == "," and depth == 0:
            parts.append(name[start:position])
            start = position + 1
    parts.append(name[start:-1])
    return parts


def _poly_add(left: dict, right: dict) -> dict | None:
    result = dict(left)
    for monomial, coefficient in right.items():
        total = result.get(monomial, 0) + coefficient
        if total:
            result[monomial] = total
        else:
            result.pop(monomial, None)
    return result if len(result) <= _MAX_TERMS else None


def _poly_scale(poly: dict, factor: int) -> dict:
    return {monomial: coefficient * factor for monomial, coefficient in poly.items()} if factor else {}


def _poly_multiply(left: dict | None, right: dict | None) -> dict | None:
    if left is None or right is None or len(left) * len(right) > _MAX_TERMS * _MAX_TERMS:
        return None
    result: dict | None = {}
    for a, x in left.items():
        for b, y in right.items():
            result = _poly_add(result, {tuple(sorted(a + b)): x * y})
            if result is None:
                return None
    return result


def _poly_product(dims_list) -> dict | None:
    result: dict | None = {(): 1}
    for dim in dims_list:
        result = _poly_multiply(result, _poly(dim))
        if result is None:
            return None
    return result


def _poly_quotient(total: dict | None, divisor: dict | None) -> dict | None:
    """total / divisor when the division is exact term by term; None otherwise."""
    if total is None or divisor is None or not divisor:
        return None
    if total == divisor:
        return {(): 1}
    if len(divisor) != 1:
        return None
    ((monomial, coefficient),) = divisor.items()
    result = {}
    for term, value in total.items():
        if value % coefficient:
            return None
        remaining = list(term)
        for atom in monomial:
            if atom not in remaining:
                return None
            remaining.remove(atom)
        result[tuple(remaining)] = value // coefficient
    return result


def _sizes_only(poly: dict) -> bool:
    """Whether every atom of `poly` is a size (never negative)."""
    return all(not atom.startswith("(") for monomial in poly for atom in monomial)


def _nonnegative(poly: dict | None) -> bool:
    """Provably >= 0: non-negative coefficients over atoms that are sizes."""
    return poly is not None and all(c >= 0 for c in poly.values()) and _sizes_only(poly)


def _at_least(left, right) -> bool:
    """Provably left >= right."""
    if is_literal(left) and is_literal(right):
        return left >= right
    if left is UNKNOWN or right is UNKNOWN:
        return False
    if left == right:
        return True
    a, b = _poly(left), _poly(right)
    if a is None or b is None:
        return False
    return _provably_nonnegative(_poly_add(a, _poly_scale(b, -1)), 2)


def _provably_nonnegative(poly: dict | None, depth: int) -> bool:
    """`_nonnegative`, or so once a min(x, y) that is subtracted is replaced by x or by y
    (each at least the min, so the difference only shrinks)."""
    if poly is None:
        return False
    if _nonnegative(poly):
        return True
    if depth == 0:
        return False
    for monomial, coefficient in poly.items():
        if len(monomial) != 1 or coefficient >= 0:
            continue
        arguments = _arguments(monomial[0])
        if arguments is None:
            continue
        rest = {m: c for m, c in poly.items() if m != monomial}
        for argument in arguments:
            bound = _poly(_dim_of_text(argument))
            if bound is not None and _provably_nonnegative(_poly_add(rest, _poly_scale(bound, coefficient)), depth - 1):
                return True
    return False


def _dim_of_text(text: str):
    try:
        return int(text)
    except ValueError:
        return Symbol(text)


def _dim_of_poly(poly: dict | None):
    """The dim a polynomial names, canonically (one atom is that symbol itself)."""
    if poly is None:
        return UNKNOWN
    if not poly:
        return 0
    terms = []
    constant = 0
    for monomial in sorted(poly, key=lambda m: (len(m), m)):
        coefficient = poly[monomial]
        if not monomial:
            constant = coefficient
            continue
        term = Symbol(monomial[0])
        for atom in monomial[1:]:
            term = dims.multiply(term, Symbol(atom))
        terms.append(dims.multiply(coefficient, term) if coefficient != 1 else term)
    result = terms[0] if terms else constant
    for term in terms[1:]:
        result = dims.add(result, term)
    if terms and constant:
        result = dims.add(result, constant)
    return result


def _product(dims_list):
    """The product of some dims, canonically; UNKNOWN if one is unknown."""
    return _dim_of_poly(_poly_product(dims_list))


def _difference(left, right):
    """left - right where that is provably not negative; UNKNOWN otherwise."""
    if is_literal(left) and is_literal(right):
        return left - right if left >= right else UNKNOWN
    a, b = _poly(left), _poly(right)
    if a is None or b is None:
        return UNKNOWN
    difference = _poly_add(a, _poly_scale(b, -1))
    return _dim_of_poly(difference) if _provably_nonnegative(difference, 2) else UNKNOWN


def _minimum(size, other):
    """min(size, other) for a dim `size` and a value `other` proved not negative:
    one of them where that is provable, else a canonical min symbol."""
    if _at_least(size, other):
        return other
    if _at_least(other, size):
        return size
    if size is UNKNOWN or other is UNKNOWN:
        return UNKNOWN
    names = sorted((str(size), str(other)))
    return Symbol(f"min({names[0]},{names[1]})")


def _same(adapter, node):
    return [(_shape(node, 0), _dtype(node))]


def _clamped_to(dim, others):
    """The dim of `others` that `dim` = min(k, x) broadcasts to, if `dim` is one with a literal k >= 1 and x
    among `others`; else `dim` itself.

    broadcast(min(k, x), x) is x wherever broadcasting succeeds, which the broadcast algebra assumes throughout:
    where x <= k the min is x; where x > k the min is k < x, and that broadcasts only if k == 1, giving x.
    (k >= 1 matters: min(0, x) is 0, and broadcast(0, 1) is 0, not 1.) BERT's position and token-type ids are a
    buffer sliced to min(max_positions, seq) that meets seq-long tensors this way.
    """
    if type(dim) is not Symbol:
        return dim
    arguments = _arguments(dim.name)
    if arguments is None or len(arguments) != 2:
        return dim
    for bound, argument in (arguments, arguments[::-1]):
        try:
            if int(bound) < 1:
                continue
        except ValueError:
            continue
        for other in others:
            if type(other) is Symbol and other.name == argument:
                return other
    return dim


def _broadcast_shapes(*shapes):
    """`dims.broadcast_shapes`, with a min(k, x) broadcast against x taken to be x (see `_clamped_to`)."""
    # Plain loops: this runs for every elementwise node at load, and a
    # generator over every dim cost more than the broadcast itself.
    clamped = False
    for shape in shapes:
        if shape is None:
            return None
        for d in shape:
            if type(d) is Symbol and d.name.startswith("min("):
                clamped = True
    if not clamped:
        return dims.broadcast_shapes(*shapes)
    rank = max(len(shape) for shape in shapes)
    columns = [[shape[axis - rank + len(shape)] for shape in shapes if axis - rank + len(shape) >= 0]
               for axis in range(rank)]
    clamped = [
        tuple(_clamped_to(d, columns[position + rank - len(shape)]) for position, d in enumerate(shape))
        for shape in shapes
    ]
    return dims.broadcast_shapes(*clamped)


def _broadcast(adapter, node):
    shapes = [v.shape for v in node.inputs if v is not None]
    return [(_broadcast_shapes(*shapes), _dtype(node))]


def _compare(adapter, node):
    shapes = [v.shape for v in node.inputs if v is not None]
    return [(_broadcast_shapes(*shapes), "bool")]


def _where(adapter, node):
    shapes = [v.shape for v in node.inputs if v is not None]
    return [(_broadcast_shapes(*shapes), _dtype(node, 1))]


def _expand(adapter, node):
    target = _in(node, 1)
    shape = _shape(node, 0)
    if target is None or shape is None:
        return [(None, _dtype(node))]
    if target.contents is not None:
        return [(_broadcast_shapes(shape, target.contents), _dtype(node))]
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
    length = None if target is None else _vector_length(target)
    return [(None if length is None else (UNKNOWN,) * length, dtype)]


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
    if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
        return [(None, _dtype(node))]  # axes computed at run time
    if not axes:
        # No axes, or an empty list, which onnxruntime reads as none given
        # (onnx's reference as "squeeze nothing"): every 1 goes, so a dim
        # that might be 1 leaves the rank unknown.
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
    if data is None or indices is None or data.contents is None:
        return None
    axis = _attr(node, "axis", 0)
    # A shape value is 1-D: its only axis is 0, or -1 once the rank is known.
    if data.shape is not None and len(data.shape) != 1 or not (axis == 0 or axis == -1 and data.shape is not None):
        return None
    picked = _values(adapter, node, 1)
    if picked is None or not all(type(i) is int for i in picked):
        return None
    if indices.shape is not None and len(indices.shape) > 1:
        return None
    return shape_values.gathered(data.contents, picked)


def _gather_elements(adapter, node):
    return [(_shape(node, 1), _dtype(node))]


def _gather_elements_contents(adapter, node):
    # On 1-D values GatherElements is Gather.
    data = _in(node, 0)
    if data is None or data.contents is None or data.shape is None or len(data.shape) != 1:
        return None
    picked = _values(adapter, node, 1)
    if picked is None or not all(type(i) is int for i in picked):
        return None
    return shape_values.gathered(data.contents, picked)


def _slice_parameters(adapter, node):
    """starts, ends, axes, steps: lists of dims (a run-time one from its
    contents), None when not known; axes and steps None also when absent."""
    if len(node.inputs) == 1:  # opset < 10: attributes
        return _attr(node, "starts"), _attr(node, "ends"), _attr(node, "axes"), None
    starts, ends = _values(adapter, node, 1), _values(adapter, node, 2)
    axes = _values(adapter, node, 3) if _in(node, 3) is not None else None
    steps = _values(adapter, node, 4) if _in(node, 4) is not None else None
    return starts, ends, axes, steps


def _slice(adapter, node):
    shape = _shape(node, 0)
    if shape is None:
        return [(None, _dtype(node))]
    rank = len(shape)
    starts, ends, axes, steps = _slice_parameters(adapter, node)
    if axes is None:
        if len(node.inputs) > 3 and _in(node, 3) is not None:
            return [((UNKNOWN,) * rank, _dtype(node))]  # run-time axes: any axis may be cut
        count = next((len(known) for known in (starts, ends, steps) if known is not None), None)
        if count is None:
            count = _vector_length(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
        if count is None:
            return [((UNKNOWN,) * rank, _dtype(node))]
        axes = list(range(count))
    if any(not is_literal(a) for a in axes):
        return [((UNKNOWN,) * rank, _dtype(node))]
    axes = [int(a) + rank if a < 0 else int(a) for a in axes]
    if any(not 0 <= a < rank for a in axes) or len(set(axes)) != len(axes):
        return [(None, _dtype(node))]
    if steps is None and len(node.inputs) > 4 and _in(node, 4) is not None:
        steps = [UNKNOWN] * len(axes)
    steps = steps or [1] * len(axes)
    starts = starts if starts is not None else [UNKNOWN] * len(axes)
    ends = ends if ends is not None else [UNKNOWN] * len(axes)
    if not len(starts) == len(ends) == len(steps) == len(axes):
        return [(None, _dtype(node))]
    result = list(shape)  # the axes not cut keep their dims
    for axis, start, end, step in zip(axes, starts, ends, steps):
        result[axis] = _sliced_dim(shape[axis], start, end, step)
    return [(tuple(result), _dtype(node))]


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
    elif _nonnegative(_poly(end)):
        stop = _minimum(dim, end)
    else:
        return UNKNOWN
    if start == 0:
        return stop
    if is_literal(end) and end >= _FAR and not is_literal(start) and _at_least(_negated(start), dim):
        # dim[-p:] with p >= dim: the start clamps to 0 (and -0 is 0), the whole axis. T5's x[:, :, -seq:, :].
        return dim
    if is_literal(end) and end >= _FAR and is_literal(start) and start < 0:
        return _minimum(dim, -int(start))  # dim[-k:] is the last min(k, dim), k >= 1
    if is_literal(start) and start < 0:
        return UNKNOWN
    if not _nonnegative(_poly(start)):
        return UNKNOWN
    # clamp(start) = min(start, dim); when stop >= start (so dim >= start), it is start.
    return _difference(stop, start) if _at_least(stop, start) else UNKNOWN


def _negated(dim):
    """-dim as a dim (an expression over sizes), or UNKNOWN."""
    poly = _poly(dim)
    return UNKNOWN if poly is None else _dim_of_poly(_poly_scale(poly, -1))


def _slice_contents(adapter, node):
    source = _in(node, 0)
    if source is None:
        return None
    starts, ends, axes, steps = _slice_parameters(adapter, node)
    if starts is None or ends is None or len(starts) != 1 or (axes not in (None, [0], [-1])):
        return None
    start, end, step = starts[0], ends[0], (steps or [1])[0]
    if not (is_literal(start) and is_literal(end) and is_literal(step)):
        return None
    return shape_values.sliced(source.contents, int(start), int(end), int(step))


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
    first, last, step = (_scalar(adapter, node, position) for position in range(3))
    if all(is_literal(v) for v in (first, last, step)) and step != 0:
        length = max(int(np.ceil((last - first) / step)), 0)
    elif step == 1:
        length = _difference(last, first)
    elif step == -1:
        length = _difference(first, last)
    else:
        length = UNKNOWN
    return [((length,), _dtype(node))]


def _range_contents(adapter, node):
    first, last, step = (_scalar(adapter, node, position) for position in range(3))
    if not all(type(v) is int for v in (first, last, step)) or step == 0:
        return None
    values = range(first, last, step)
    return list(values) if len(values) <= _MAX_RANK else None


def _reshape(adapter, node):
    shape, target = _shape(node, 0), _in(node, 1)
    if target is None or target.contents is None:
        length = None if target is None else _vector_length(target)
        if length is not None:
            return [((UNKNOWN,) * length, _dtype(node))]
        return [(None, _dtype(node))]
    allow_zero = _attr(node, "allowzero", 0)
    result = []
    inferred = None  # the position of the -1
    for position, dim in enumerate(target.contents):
        if dim == 0 and not allow_zero:
            result.append(shape[position] if shape is not None and position < len(shape) else UNKNOWN)
        elif is_literal(dim) and dim < 0:
            if dim != -1 or inferred is not None:
                return [(None, _dtype(node))]  # not valid: the op fails
            inferred = position
            result.append(UNKNOWN)
        else:
            result.append(dim)
    if inferred is not None and shape is not None:
        # The -1 is the input's size over the product of the other dims, when
        # that divides exactly: Reshape(x[batch, seq], [-1, seq]) is [batch, seq].
        others = result[:inferred] + result[inferred + 1 :]
        result[inferred] = _dim_of_poly(_poly_quotient(_poly_product(shape), _poly_product(others)))
    return [(tuple(result), _dtype(node))]


def _flatten(adapter, node):
    shape = _shape(node, 0)
    if shape is None:
        return [(None, _dtype(node))]
    axis = _attr(node, "axis", 1)
    axis = axis + len(shape) if axis < 0 else axis
    if not 0 <= axis <= len(shape):
        return [(None, _dtype(node))]
    return [((_product(shape[:axis]), _product(shape[axis:])), _dtype(node))]


def _size(adapter, node):
    return [((), "int64")]


def _size_contents(adapter, node):
    shape = _shape(node, 0)
    if shape is None:
        return None
    total = _product(shape)
    return None if total is UNKNOWN else [total]


def _cast_contents(adapter, node):
    # Ints stay the same ints; a bool becomes 0 or 1. Anything else is not followed.
    source = _in(node, 0)
    to = dtype_name(_attr(node, "to", 0))
    if source is None or source.contents is None or to not in ("int64", "int32"):
        return None
    return [int(v) if type(v) is bool else v for v in source.contents]


def _divide_contents(adapter, node):
    # Integer division of literal dims (ONNX truncates toward zero), and x / 1.
    left, right = _in(node, 0), _in(node, 1)
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
    source = _in(node, 0)
    if source is None or source.contents is None or source.dtype not in ("int64", "int32"):
        return None
    return [-v if type(v) is int else dims.subtract(0, v) if v is not UNKNOWN else UNKNOWN for v in source.contents]


def _not_contents(adapter, node):
    source = _in(node, 0)
    if source is None or source.contents is None:
        return None
    return [(not v) if type(v) is bool else UNKNOWN for v in source.contents]


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
    shape = _shape(node, 0)
    if shape is None or len(shape) < 2:
        return [(None, _dtype(node))]
    return [(tuple(shape[:2]) + (1,) * (len(shape) - 2), _dtype(node))]


def _top_k(adapter, node):
    shape = _shape(node, 0)
    if shape is None:
        return [(None, _dtype(node)), (None, "int64")]
    axis = _attr(node, "axis", -1)
    axis = axis + len(shape) if axis < 0 else axis
    k = _attr(node, "k") if len(node.inputs) < 2 else _scalar(adapter, node, 1)
    if k is None or not (is_literal(k) and k >= 0 or isinstance(k, Symbol)):
        k = UNKNOWN
    result = tuple(k if position == axis else dim for position, dim in enumerate(shape))
    return [(result, _dtype(node)), (result, "int64")]


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
    "LayerNormalization RMSNormalization Dropout PRelu Clip CastLike Trilu MeanVarianceNormalization "
    "GroupNormalization LpNormalization LRN InstanceNormalization"
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
    "Flatten": _flatten,
    "Size": _size,
    "GatherElements": _gather_elements,
    "If": _if,
    "Loop": _loop,
    "TopK": _top_k,
    **{name: _global_pool for name in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")},
    "Transpose": _transpose,
    "MatMul": _matmul,
    **{name: _reduce for name in "ReduceMean ReduceSum ReduceMax ReduceMin ReduceProd ReduceL2 ReduceL1 "
       "ReduceLogSum ReduceLogSumExp ReduceSumSquare".split()},
}
_RULES["CastLike"] = lambda adapter, node: [(_shape(node, 0), _dtype(node, 1))]

# ---------------------------------------------------------------- onnx's own inference
#
# For an op of the default domain with no rule above, onnx's per-node
# inference (the schema's inference function, at the model's opset) is asked.
# Our dims go in as dim_params, one placeholder per symbol, and come back
# mapped to the same symbols: onnx copies a dim_param only where its rule
# proves the output dim equal to that input dim. A dim_param onnx makes up
# becomes a symbol local to the node; a dim it leaves empty is unknown. Small
# constant inputs (and shape values whose elements are all literal) go in as
# data, for the ops whose output shape depends on them (Split, Pad, TopK...).
#
# The answer depends only on the op, the opset, the attributes and the input
# types and data, with symbols numbered in order of appearance, so it is
# cached by those: a chain of ten thousand such ops on [batch, seq] asks onnx
# once.

_ELEMENT_TYPES = {name: code for code, name in _DTYPE_NAMES.items()}
_PLACEHOLDER = "__rewrite_dim_"
# Inputs up to this many elements are passed to onnx as data: the integer
# operands that shape an output (axes, sizes, pads, K) and the float scales of
# Resize and Upsample, never a weight.
_MAX_DATA = {"int64": 256, "int32": 256, "bool": 256, "fp32": 16, "fp16": 16, "fp64": 16}
_FALLBACK_CACHE: dict = {}
_MAX_CACHED = 1 << 16


@functools.cache
def _schema(op_type: str, opset: int):
    try:
        return onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return None


def _fallback(adapter: OnnxAdapter, node: Node):
    proto = node.proto
    schema = _schema(proto.op_type, adapter.opset)
    if schema is None:
        return None
    symbols: dict = {}
    inputs = []
    for value in node.inputs:
        if value is None:
            inputs.append(None)
            continue
        element = _ELEMENT_TYPES.get(value.dtype)
        if element is None:
            return None  # onnx checks input types, so it needs them all
        shape = value.shape
        if shape is not None:
            key = []
            for dim in shape:
                if dim is UNKNOWN:
                    key.append(None)
                elif type(dim) is Symbol:
                    key.append(("s", symbols.setdefault(dim, len(symbols))))
                else:
                    key.append(int(dim))
            shape = tuple(key)
        inputs.append((element, shape, _data_key(adapter, value)))
    attributes = tuple(attribute.SerializeToString() for attribute in proto.attribute)
    outputs = tuple(value is not None for value in node.outputs)
    key = (proto.op_type, adapter.opset, adapter.model.ir_version, attributes, tuple(inputs), outputs)
    answer = _FALLBACK_CACHE.get(key, _FALLBACK_CACHE)
    if answer is _FALLBACK_CACHE:
        answer = _ask_onnx(schema, proto, adapter, inputs, outputs)
        if not node.blocks:  # a subgraph in the key would keep a copy of it
            if len(_FALLBACK_CACHE) >= _MAX_CACHED:
                _FALLBACK_CACHE.clear()
            _FALLBACK_CACHE[key] = answer
    if answer is None:
        return None
    by_index = list(symbols)
    local = next((v.name for v in node.outputs if v is not None), "")
    results = []
    for found in answer:
        if found is None:
            results.append((None, None))
            continue
        element, shape = found
        if shape is not None:
            shape = tuple(
                UNKNOWN if dim is None
                else by_index[dim[1]] if type(dim) is tuple and dim[0] == "s"
                else Symbol(f"{dim[1]}@{local}") if type(dim) is tuple
                else dim
                for dim in shape
            )
        results.append((shape, dtype_name(element)))
    return results


def _data_key(adapter: OnnxAdapter, value: Value):
    """A small input's data, as (dtype, shape, bytes); None if not known or too big."""
    shape = value.shape
    limit = _MAX_DATA.get(value.dtype)
    if shape is None or limit is None or len(shape) > 2:
        return None
    size = 1
    for dim in shape:
        if type(dim) is not int:
            return None
        size *= dim
    if size > limit:
        return None  # judged from the header: a weight is never read here
    array = None
    if value.initializer is not None or (value.producer is not None and value.producer.type == "Constant"):
        try:
            array = adapter.constant(value)
        except ModelError:
            return None  # a corrupt tensor is reported where a rule needs it
    elif value.contents is not None and value.dtype in ("int64", "int32", "bool"):
        if len(value.contents) != size or not all(is_literal(v) or type(v) is bool for v in value.contents):
            return None
        array = np.asarray(value.contents, dtype=onnx.helper.tensor_dtype_to_np_dtype(_ELEMENT_TYPES[value.dtype]))
        array = array.reshape(shape)
    if array is None:
        return None
    array = np.asarray(array)
    return (array.dtype.str, array.shape, array.tobytes())


def _ask_onnx(schema, proto: onnx.NodeProto, adapter: OnnxAdapter, inputs, outputs):
    """onnx's answer for one node, in the cache's terms: per output present,
    (element type, dims) with dims ints, ("s", index) for the index-th input
    symbol, ("p", name) for a dim_param onnx made up, None for unknown."""
    names = [f"i{position}" if found is not None else "" for position, found in enumerate(inputs)]
    node = onnx.NodeProto(op_type=proto.op_type, input=names, output=[
        f"o{position}" if present else "" for position, present in enumerate(outputs)
    ])
    node.attribute.extend(proto.attribute)
    types, data = {}, {}
    for name, found in zip(names, inputs):
        if found is None:
            continue
        element, shape, data_key = found
        if shape is None:
            types[name] = onnx.helper.make_tensor_type_proto(element, None)
        else:
            dims_list = [
                None if dim is None else f"{_PLACEHOLDER}{dim[1]}" if type(dim) is tuple else dim for dim in shape
            ]
            types[name] = onnx.helper.make_tensor_type_proto(element, dims_list)
        if data_key is not None:
            dtype, shape_of_data, raw = data_key
            array = np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape_of_data)
            data[name] = numpy_helper.from_array(array, name)
    try:
        found = onnx.shape_inference.infer_node_outputs(
            schema, node, types, data, opset_imports=[onnx.helper.make_opsetid("", adapter.opset)],
            ir_version=adapter.model.ir_version or onnx.IR_VERSION,
        )
    except Exception:  # onnx's InferenceError, or any other refusal of a node it cannot type
        return None
    answer = []
    for position, present in enumerate(outputs):
        if not present:
            continue
        answer.append(_from_type(found.get(f"o{position}")))
    return answer


def _from_type(found: onnx.TypeProto | None):
    if found is None or not found.HasField("tensor_type"):
        return None
    tensor = found.tensor_type
    if not tensor.HasField("shape"):
        return (tensor.elem_type, None)
    shape = []
    for dim in tensor.shape.dim:
        if dim.HasField("dim_value"):
            shape.append(int(dim.dim_value) if dim.dim_value >= 0 else None)
        elif dim.HasField("dim_param") and dim.dim_param.startswith(_PLACEHOLDER):
            suffix = dim.dim_param[len(_PLACEHOLDER) :]
            shape.append(("s", int(suffix)) if suffix.isdigit() else None)
        elif dim.HasField("dim_param") and dim.dim_param:
            shape.append(("p", dim.dim_param))
        else:
            shape.append(None)
    return (tensor.elem_type, tuple(shape))


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
    if kind == "expand":
        # Right-aligned against the input; the target shape is a value, not a dim.
        data = node.inputs[0] if node.inputs else None
        if data is None or data.shape is None:
            return [(data, None)] if data is not None else None
        offset = rank - len(data.shape)
        return [(data, axis - offset)] if axis >= offset else []
    if kind == "gather":
        data, indices = _in(node, 0), _in(node, 1)
        if data is None or indices is None or data.shape is None or indices.shape is None:
            return None
        gathered = _attr(node, "axis", 0)
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

_CONTENTS = {
    "Shape": _shape_contents,
    "Concat": _concat_contents,
    "Gather": _gather_contents,
    "Slice": _slice_contents,
    "Unsqueeze": _unsqueeze_contents,
    "Squeeze": _squeeze_contents,
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
