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
worked out symbolically (see `dim_algebra`): only what holds for
every size the inputs can have, so Reshape(ids[batch, seq], [-1, seq]) is
[batch, seq], and x[:, :t] is [batch, min(seq, t)].

Where each part lives: this module drives inference and takes declarations;
`shape_rules` types each op, `shape_contents` follows values used as shapes,
`dim_algebra` does the arithmetic on symbolic dims, and every other op of
the default domain is typed by onnx's own per-node inference with our
symbols passed through it (`onnx_inference`), cached per kind of node so
that the cost stays linear in the graph.
"""

from __future__ import annotations

import numpy as np
import onnx

from rewrite.backends.onnx.graph import Graph, Node, Value
from rewrite.backends.onnx.node_inputs import Context
from rewrite.backends.onnx.onnx_inference import infer_by_onnx
from rewrite.backends.onnx.shape_contents import CONTENTS
from rewrite.backends.onnx.shape_rules import RULES
from rewrite.backends.onnx.tensors import dtype_name
from rewrite.engine import shapes as dims
from rewrite.language.logic import UNKNOWN, Local, Symbol, is_literal

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
            # A leaf, whatever characters the name holds: "(a+b)" is a name here, not a sum.
            shape.append(Symbol(dim.dim_param) if trusted else Local(dim.dim_param, f"{value.name}:{axis}"))
        else:
            shape.append(UNKNOWN)
    value.shape = tuple(shape)


# ---------------------------------------------------------------- inference


def infer(adapter: Context, graph: Graph) -> None:
    """Infer shapes, dtypes and contents for every node of `graph`, subgraphs included."""
    for value in graph.values.values():
        if value.initializer is not None and value.contents is None:
            _contents_from_constant(adapter, value)
    for node in graph.nodes:
        for block in node.blocks:
            infer(adapter, block)
        infer_node(adapter, node)


def infer_node(adapter: Context, node: Node) -> None:
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
        contents = CONTENTS.get(op_type)
        if contents is not None and outputs:
            try:
                outputs[0].contents = contents(adapter, node)
            except MALFORMED:
                outputs[0].contents = None


def inferred_outputs(adapter: Context, node: Node) -> list | None:
    """(shape, dtype) of each output `node` has, from its inputs as they are,
    by the rules here or onnx's own inference; None where neither says, and
    nothing is written. Raises `dims.IncompatibleShapes` for inputs whose
    shapes the op cannot combine (operands that do not broadcast)."""
    op_type = node.type  # carries its domain unless it is the default one
    rule = RULES.get(op_type)
    if rule is not None:
        try:
            return rule(adapter, node)
        except MALFORMED:
            return None  # a malformed node; its shapes stay unknown
    if "." not in op_type:
        # Every other op of the default domain: onnx's own inference for it.
        return infer_by_onnx(adapter, node)
    return None


# What a rule meets in a node that breaks its schema (an axis out of range,
# an attribute of the wrong type, too few inputs). A corrupt tensor is not
# among them: the adapter reports that as an `OnnxError` naming the node.
MALFORMED = (ArithmeticError, AttributeError, LookupError, StopIteration, TypeError, ValueError)


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


def _contents_from_constant(adapter: Context, value: Value) -> None:
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
