"""onnx's own shape inference, for the ONNX ops the shape rules do not cover.

For an op of the default domain with no rule of ours, onnx's per-node
inference (the schema's inference function, at the model's opset) is asked.
Our dims go in as dim_params, one placeholder per symbol, and come back
mapped to the same symbols: onnx copies a dim_param only where its rule
proves the output dim equal to that input dim. A dim_param onnx makes up
becomes a symbol local to the node; a dim it leaves empty is unknown. Small
constant inputs (and shape values whose elements are all literal) go in as
data, for the ops whose output shape depends on them (Split, Pad, TopK...).

The answer depends only on the op, the opset, the attributes and the input
types and data, with symbols numbered in order of appearance, so it is
cached by those: a chain of ten thousand such ops on [batch, seq] asks onnx
once.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
from onnx import numpy_helper

from rewrite.backends.onnx.graph import Node, Value
from rewrite.backends.onnx.node_inputs import Context
from rewrite.backends.onnx.tensors import ELEMENT_TYPES, dtype_name
from rewrite.engine.interfaces import ModelError
from rewrite.language.logic import UNKNOWN, Local, Term, is_literal

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


def infer_by_onnx(adapter: Context, node: Node) -> list | None:
    """(shape, dtype) of each output of `node`, by onnx's inference of its op; None if onnx cannot say."""
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
        element = ELEMENT_TYPES.get(value.dtype)
        if element is None:
            return None  # onnx checks input types, so it needs them all
        shape = value.shape
        if shape is not None:
            key = []
            for dim in shape:
                if dim is UNKNOWN:
                    key.append(None)
                elif isinstance(dim, Term):
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
                else Local(dim[1], local) if type(dim) is tuple
                else dim
                for dim in shape
            )
        results.append((shape, dtype_name(element)))
    return results


def _data_key(adapter: Context, value: Value):
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
        array = np.asarray(value.contents, dtype=onnx.helper.tensor_dtype_to_np_dtype(ELEMENT_TYPES[value.dtype]))
        array = array.reshape(shape)
    if array is None:
        return None
    array = np.asarray(array)
    return (array.dtype.str, array.shape, array.tobytes())


def _ask_onnx(schema, proto: onnx.NodeProto, adapter: Context, inputs, outputs):
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
