"""ONNX tensors as arrays: dtype names, and reading initializers and Constant values.

A tensor is read only when a rule asks for its value (`OnnxAdapter.constant`);
reading checks that its bytes hold what its header declares, and says why
not where they do not.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from rewrite.backends.onnx.graph import Node, Value

DTYPE_NAMES = {
    onnx.TensorProto.FLOAT: "fp32", onnx.TensorProto.FLOAT16: "fp16", onnx.TensorProto.DOUBLE: "fp64",
    onnx.TensorProto.BFLOAT16: "bf16", onnx.TensorProto.INT8: "int8", onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.INT16: "int16", onnx.TensorProto.UINT16: "uint16", onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.UINT32: "uint32", onnx.TensorProto.INT64: "int64", onnx.TensorProto.UINT64: "uint64",
    onnx.TensorProto.BOOL: "bool", onnx.TensorProto.STRING: "string",
}


# The element type of each dtype name, for building tensors and types.
ELEMENT_TYPES = {name: code for code, name in DTYPE_NAMES.items()}


def dtype_name(elem_type: int) -> str | None:
    """The engine's name of an ONNX element type (\"fp32\", \"int64\", ...); None for one it has none for."""
    return DTYPE_NAMES.get(elem_type)


# The element types onnx can turn into arrays (its own table, read once).
_NUMPY_TYPES = frozenset(onnx.helper.get_all_tensor_dtypes())
# Those stored two to a byte, whose raw size is not elements times item size.
_PACKED_TYPES = frozenset(
    getattr(onnx.TensorProto, name) for name in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
    if hasattr(onnx.TensorProto, name)
)


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


def constant_attribute(node: Node) -> onnx.AttributeProto | None:
    """The attribute of a Constant node that holds its value; None if it has none of the right type."""
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
    attribute = constant_attribute(node)
    if attribute is None:
        return None
    if attribute.type == onnx.AttributeProto.TENSOR:
        return read_tensor(attribute.t, base_dir)
    found = onnx.helper.get_attribute_value(attribute)
    return np.asarray(found if attribute.type in (onnx.AttributeProto.INT, onnx.AttributeProto.FLOAT) else list(found))
