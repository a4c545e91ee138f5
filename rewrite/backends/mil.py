"""The Core ML MIL backend: coremltools `Program`s and `.mlpackage` files.

`MilAdapter` maps the engine's view onto pymil: ops are `Operation`s, values
are `Var`s, blocks are `Block`s (a `Function` is the outermost block).
Rewrites go through coremltools' own block API, so the result is a normal
pymil program that validates and serialises as any other.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import logging
import os
import shutil
import stat
import tempfile
import uuid
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import sympy

from rewrite.engine import shape_values
from rewrite.engine.interfaces import InputSpec, ModelError, NamedValue, OpSignature, TypeChangedError
from rewrite.engine.logic import UNKNOWN, Symbol, Truth, equal
from rewrite.engine.shapes import IncompatibleShapes, broadcast_shapes
from rewrite.engine.shapes import add as dims_add
from rewrite.engine.shapes import multiply as dims_multiply
from rewrite.engine.shapes import subtract as dims_subtract


def _import_coremltools():
    # coremltools logs "Failed to load _MLModelProxy" and friends at import on
    # Linux; they say nothing useful to a user of this tool.
    logger = logging.getLogger("coremltools")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        import coremltools
    finally:
        logger.setLevel(level)
    return coremltools


ct = _import_coremltools()

from coremltools.converters.mil import Builder as mb  # noqa: E402
from coremltools.converters.mil.mil import Block, Function, Operation, Program, Var, types  # noqa: E402
from coremltools.converters.mil.mil import block as _block_module  # noqa: E402
from coremltools.converters.mil.mil.input_type import TupleInputType  # noqa: E402
from coremltools.converters.mil.mil.ops.registry import SSAOpRegistry  # noqa: E402
from coremltools.converters.mil.mil.types.symbolic import is_symbolic  # noqa: E402

DIALECT = "mil"

# Ops whose effect is not (only) their outputs; never removed as dead.
_SIDE_EFFECT_OPS = frozenset({"coreml_update_state", "write_state"})


class MilError(ModelError):
    """A MIL program or model file could not be read or written; the message names the file."""


# ---------------------------------------------------------------- op schema


class MilSchema:
    """coremltools' op registry, at the newest opset each op has."""

    dialect = DIALECT

    @functools.cached_property
    def _registry(self) -> dict[str, Any]:
        ops = {}
        for name, by_target in SSAOpRegistry.core_ops.items():
            if not name.startswith("_") and by_target:
                ops[name] = by_target[max(by_target)]
        for name, op_class in SSAOpRegistry.dialect_ops.items():
            ops.setdefault(name, op_class)
        return ops

    def signature(self, op_type: str) -> OpSignature | None:
        if op_type not in self._signatures:
            self._signatures[op_type] = self._read_signature(op_type)
        return self._signatures[op_type]

    @functools.cached_property
    def _signatures(self) -> dict[str, OpSignature | None]:
        return {}

    def _read_signature(self, op_type: str) -> OpSignature | None:
        op_class = self._registry.get(op_type)
        if op_class is None:
            return None
        inputs = []
        for name, input_type in op_class.input_spec.input_types.items():
            if name.startswith("_"):
                continue  # python-side plumbing (cond's _true_fn), not an operand
            inputs.append(
                InputSpec(name, bool(input_type.optional), isinstance(input_type, TupleInputType))
            )
        return OpSignature(op_type, tuple(inputs))

    def op_types(self) -> Sequence[str]:
        return sorted(self._registry)


SCHEMA = MilSchema()


# ---------------------------------------------------------------- adapter


def _dim(dim) -> Any:
    if isinstance(dim, (int, np.integer)):
        return UNKNOWN if dim < 0 else int(dim)
    if isinstance(dim, sympy.Symbol):
        return Symbol(dim.name)  # str() would run sympy's printer: ~150 µs a call
    if is_symbolic(dim):
        return Symbol(_expression_name(dim))
    return UNKNOWN


@functools.lru_cache(maxsize=65536)
def _shape_of_type(sym_type):
    # Type classes are immutable and shared, and types.is_tensor is slow
    # (it builds a type-info record each call): convert each type once.
    if types.is_tensor(sym_type):
        return tuple(_dim(d) for d in sym_type.get_shape())
    if types.is_scalar(sym_type):
        return ()
    return None


@functools.lru_cache(maxsize=4096)
def _expression_name(expression) -> str:
    return str(expression)


@contextlib.contextmanager
def _in_block(block: Block):
    """Make `block` the builder's current block, like `with block:` but cheap.

    Leaving a `with block:` walks every op of the block to refresh
    coremltools' non-replaceable-var marks; doing that per rewrite makes a
    run quadratic. `MilAdapter.finish` refreshes them once instead.
    """
    _block_module.BLOCK_STACK.append(block)
    try:
        yield block
    finally:
        _block_module.BLOCK_STACK.pop()


class MilAdapter:
    """The engine's view of a pymil `Program`, rewritten in place."""

    dialect = DIALECT

    def __init__(self, program: Program, check_types: bool = False):
        """`check_types`: after each replacement, re-infer the consumers and
        raise `TypeChangedError` if an output's dtype, rank or a literal dim
        changed. A sound rule never trips it; rule tests turn it on."""
        self.program = program
        self.check_types = check_types
        self._names: set[str] | None = None
        # coremltools marks vars downstream of constexpr_* ops as
        # non-replaceable; with no such op the marks are all empty and need
        # no refresh after a rewrite.
        self._has_constexpr = False
        self._changed = False
        self._input_blocks: dict[int, Block] = {}
        self._input_symbols: set[Symbol] = set()
        # id(var) -> (var, result); the var is kept so its id is not reused.
        # Rewrites replace values by equal ones, so what was proven stays true.
        self._proven_shapes: dict[int, tuple] = {}
        self._shape_values: dict[int, tuple] = {}
        for function in program.functions.values():
            self._index_inputs(function)

    def _index_inputs(self, block: Block) -> None:
        inputs = block.inputs.values() if isinstance(block, Function) else block.inputs
        for var in inputs:
            self._input_blocks[id(var)] = block
            shape = _shape_of_type(var.sym_type) or ()
            self._input_symbols.update(d for d in shape if isinstance(d, Symbol))
        for op in block.operations:
            if op.op_type.startswith("constexpr_"):
                self._has_constexpr = True
            for nested in op.blocks:
                self._index_inputs(nested)

    # ---- structure

    def top_blocks(self) -> Sequence[Block]:
        return list(self.program.functions.values())

    def operations(self, block: Block) -> Sequence[Operation]:
        return list(block.operations)

    def block_outputs(self, block: Block) -> Sequence[Var]:
        return list(block.outputs)

    def nested_blocks(self, op: Operation) -> Sequence[Block]:
        return op.blocks

    def is_live(self, op: Operation) -> bool:
        return op.enclosing_block is not None

    def op_type(self, op: Operation) -> str:
        return op.op_type

    def op_name(self, op: Operation) -> str:
        return op.name

    def block_of(self, op: Operation) -> Block:
        return op.enclosing_block

    def has_side_effects(self, op: Operation) -> bool:
        return op.op_type in _SIDE_EFFECT_OPS or not op.outputs

    def operand(self, op: Operation, name: str):
        return op.inputs.get(name)

    def operand_names(self, op: Operation) -> Sequence[str]:
        return list(op.inputs)

    def operands(self, op: Operation) -> Sequence[Var]:
        flat = []
        for value in op.inputs.values():
            if isinstance(value, (list, tuple)):
                flat.extend(value)
            else:
                flat.append(value)
        return flat

    def outputs(self, op: Operation) -> Sequence[Var]:
        return op.outputs

    def attribute(self, op: Operation, name: str):
        # MIL has no attributes apart from operands: a constant operand is one.
        value = op.inputs.get(name)
        if value is None or isinstance(value, (list, tuple)) or value.val is None:
            return None
        constant = np.asarray(value.val)
        return constant.tolist()

    # ---- values

    def producer(self, value: Var) -> Operation | None:
        return value.op

    def defining_block(self, value: Var) -> Block | None:
        if value.op is not None:
            return value.op.enclosing_block
        return self._input_blocks.get(id(value))

    def consumers(self, value: Var) -> Sequence[Operation]:
        children = value.child_ops
        if len(children) < 2:
            return list(children)
        seen, distinct = set(), []
        for op in children:
            if id(op) not in seen:
                seen.add(id(op))
                distinct.append(op)
        return distinct

    def is_block_output(self, value: Var) -> bool:
        return bool(value.consuming_blocks)

    def has_uses(self, value: Var) -> bool:
        # O(1): `consumers` de-duplicates every child op, and a value one
        # reduce_mean feeds to every layer has thousands of them.
        return bool(value.child_ops) or bool(value.consuming_blocks)

    def shape(self, value: Var):
        inferred = _shape_of_type(value.sym_type)
        op = value.op
        if op is not None and op.op_type == "select" and inferred is not None:
            # coremltools types a select by a and b alone, but at run time
            # cond broadcasts too: where it widens the type, it is the shape.
            cond = _shape_of_type(op.inputs["cond"].sym_type)
            if cond is None:
                return None
            try:
                widened = broadcast_shapes(cond, inferred)
            except IncompatibleShapes:
                return None
            if widened != inferred:
                return widened
        return inferred

    def proven_shape(self, value: Var):
        inferred = self.shape(value)
        op = value.op
        if op is None or op.op_type not in _SHAPE_FOLLOWS:
            return inferred
        if inferred is not None and self._settled(inferred):
            return inferred
        cached = self._proven_shapes.get(id(value))
        if cached is not None and cached[0] is value:
            return cached[1]
        return self._prove_shapes(value)

    def _settled(self, dims) -> bool:
        # Literals and the inputs' own symbols are as good as a proof gets;
        # only a symbol coremltools made up along the way is worth following.
        return all(isinstance(d, int) or d in self._input_symbols for d in dims)

    def _prove_shapes(self, root: Var):
        # Producers first, with an explicit stack: a chain of a million
        # elementwise ops must not recurse a million deep.
        stack = [root]
        while stack:
            value = stack[-1]
            key = id(value)
            cached = self._proven_shapes.get(key)
            if cached is not None and cached[0] is value:
                stack.pop()
                continue
            pending = [v for v in _shape_operands(value.op) if self._needs_proof(v)]
            if pending:
                stack.extend(pending)
                continue
            inferred = self.shape(value)
            proven = shape_values.refined(inferred, self._proven_shape(value.op, inferred))
            self._proven_shapes[key] = (value, proven)
            stack.pop()
        return self._proven_shapes[id(root)][1]

    def _needs_proof(self, value: Var) -> bool:
        op = value.op
        if op is None or op.op_type not in _SHAPE_FOLLOWS:
            return False
        inferred = self.shape(value)
        if inferred is not None and self._settled(inferred):
            return False
        cached = self._proven_shapes.get(id(value))
        return cached is None or cached[0] is not value

    # ---- values used as shapes
    #
    # coremltools infers a fresh symbol for a dim read from a runtime shape
    # once a `cast` drops its symbolic value, which converters put in every
    # shape computation. Following the shape arithmetic (engine.shape_values)
    # proves those dims: a fill of concat(shape(x)[0:1], [8]) has x's first dim.

    def _proven_shape(self, op: Operation, inferred):
        # Types are not re-inferred after every rewrite (coremltools' own
        # passes skip it too), so a dim may be a stale fresh symbol; the
        # operands' shapes say what it is.
        kind = op.op_type
        if kind in _UNARY_ELEMENTWISE:
            return self.proven_shape(op.inputs["x"])
        if kind in _BINARY_BROADCASTING or kind == "select":
            operands = _shape_operands(op)
            try:
                return broadcast_shapes(*(self.proven_shape(v) for v in operands))
            except IncompatibleShapes:
                return None
        if kind == "fill_like":
            return self.proven_shape(op.inputs["ref_tensor"])
        if kind in _LAYOUT:
            return self._layout_shape(op)
        if kind == "matmul":
            return self._matmul_shape(op)
        if kind in _SAME_SHAPE:
            return self.proven_shape(op.inputs["x"])
        if kind in _FRONTEND_SHAPES:
            return self._frontend_shape(op, inferred)
        rank = None if inferred is None else len(inferred)
        shape = self.shape_value(op.inputs["shape"])
        if kind == "reshape" and shape is not None and sum(1 for d in shape if d == -1) == 1:
            return self._reshaped(self.proven_shape(op.inputs["x"]), shape)
        return shape_values.as_dims(shape, rank)

    # Ops coremltools' torch frontend puts between a flexible input and the
    # values whose shapes the rules ask about (a linear layer, an embedding
    # lookup, a slice of a buffer by the sequence length, ...): each gets a
    # fresh symbol from coremltools' type inference where its operands' dims
    # say which dim it is.

    def _frontend_shape(self, op: Operation, inferred):
        kind = op.op_type
        inputs = op.inputs
        if kind == "linear":
            x = self.proven_shape(inputs["x"])
            if x is None or inferred is None or not inferred or not isinstance(inferred[-1], int):
                return None
            return (*x[:-1], inferred[-1])
        if kind == "scaled_dot_product_attention":
            query, value = self.proven_shape(inputs["query"]), self.proven_shape(inputs["value"])
            return None if query is None or value is None or not value else (*query[:-1], value[-1])
        if kind == "split":
            x, axis = self.proven_shape(inputs["x"]), inputs["axis"].val
            if x is None or inferred is None or axis is None or len(x) != len(inferred):
                return None
            axis = int(axis) % len(x)
            if not isinstance(inferred[axis], int):
                return None  # the split axis' own size is the split's business
            return tuple(inferred[axis] if position == axis else d for position, d in enumerate(x))
        if kind == "gather":
            x, indices = self.proven_shape(inputs["x"]), self.proven_shape(inputs["indices"])
            axis = inputs["axis"].val
            batch_dims = inputs.get("batch_dims")
            if x is None or indices is None or axis is None or (batch_dims is not None and batch_dims.val):
                return None
            axis = int(axis) % len(x) if x else 0
            return (*x[:axis], *indices, *x[axis + 1:])
        if kind == "concat":
            interleave = inputs.get("interleave")
            if interleave is not None and (interleave.val is None or interleave.val):
                return None
            parts = [self.proven_shape(v) for v in inputs["values"]]
            if any(part is None for part in parts) or not parts or len({len(part) for part in parts}) != 1:
                return None
            rank = len(parts[0])
            if rank == 0 or inputs["axis"].val is None:
                return None
            axis = int(inputs["axis"].val) % rank
            dims = []
            for position in range(rank):
                if position == axis:
                    total = 0
                    for part in parts:
                        total = dims_add(total, part[position])
                    dims.append(total)
                else:
                    # Every part has the same size there at run time: take the
                    # best-known spelling of it (a literal, an input's symbol).
                    candidates = [part[position] for part in parts]
                    dims.append(min(candidates, key=self._dim_rank))
            return tuple(dims)
        if kind == "range_1d":
            start, end, step = (self.shape_value(inputs[name]) for name in ("start", "end", "step"))
            if start is None or end is None or step is None or len(start) != 1 or len(end) != 1:
                return None
            if start == [0] and step == [1] and end[0] is not UNKNOWN:
                if isinstance(end[0], int):
                    return (max(end[0], 0),)
                return (end[0],) if _never_negative(end[0]) else None
            if all(isinstance(v, int) for v in (start[0], end[0], step[0])) and step[0]:
                return (len(range(start[0], end[0], step[0])),)
            return None
        if kind == "slice_by_index":
            return self._sliced_shape(op)
        return None

    def _dim_rank(self, dim) -> int:
        """How well a dim is known: a literal, an input's symbol, another symbol, unknown."""
        if isinstance(dim, int):
            return 0
        if dim in self._input_symbols:
            return 1
        return 2 if dim is not UNKNOWN else 3

    def _dim_bounds(self, dim) -> tuple[int, int | None]:
        """(lowest, highest or None) a dim takes at run time: a literal's value, an input
        symbol's RangeDim bounds (the model accepts no other size), else (0, None)."""
        if isinstance(dim, int):
            return dim, dim
        bounds = self.__dict__.get("_input_dim_bounds")
        if bounds is None:
            bounds = {}
            for function in self.program.functions.values():
                for input_type in getattr(function, "input_types", None) or ():
                    for d in getattr(getattr(input_type, "shape", None), "shape", None) or ():
                        symbol = getattr(d, "symbol", None)
                        if symbol is None or not hasattr(d, "lower_bound"):
                            continue
                        lower = max(int(d.lower_bound), 0)
                        upper = int(d.upper_bound) if int(d.upper_bound) >= 0 else None
                        key = Symbol(str(symbol))
                        if key in bounds:  # one symbol in two functions: what both allow
                            old_lower, old_upper = bounds[key]
                            lower = min(lower, old_lower)
                            upper = None if upper is None or old_upper is None else max(upper, old_upper)
                        bounds[key] = (lower, upper)
            self._input_dim_bounds = bounds
        return bounds.get(dim, (0, None))

    def _at_most(self, small, large) -> bool:
        """small <= large at run time, provably."""
        if small == large and small is not UNKNOWN:
            return True
        if any(dims_add(small, k) == large for k in (1, 2)):
            return True  # an expression made by adding to `small` (a length and one more)
        upper = self._dim_bounds(small)[1]
        return upper is not None and upper <= self._dim_bounds(large)[0]

    def _sliced_shape(self, op: Operation):
        """slice_by_index's output dims, from x's and the values of begin and end (runtime ones too)."""
        inputs = op.inputs
        source = self.proven_shape(inputs["x"])
        if source is None:
            return None
        rank = len(source)

        def values(name, default):
            var = inputs.get(name)
            if var is None:
                return [default] * rank
            found = self.shape_value(var) if var.val is None else np.asarray(var.val).reshape(-1).tolist()
            return found if found is not None and len(found) == rank else None

        begin, end, stride = values("begin", 0), values("end", 0), values("stride", 1)
        begin_mask, end_mask, squeeze_mask = values("begin_mask", False), values("end_mask", False), \
            values("squeeze_mask", False)
        if any(v is None for v in (begin, end, stride, begin_mask, end_mask, squeeze_mask)):
            return None
        dims = []
        for d, b, e, step, whole_start, whole_end, squeeze in zip(
            source, begin, end, stride, begin_mask, end_mask, squeeze_mask
        ):
            if squeeze:
                continue
            start = 0 if whole_start else b
            stop = d if whole_end else e
            if all(isinstance(v, int) for v in (d, start, stop, step)) and step:
                dims.append(len(range(d)[slice(start, stop, step)]))
            elif step != 1 or start is UNKNOWN or stop is UNKNOWN:
                dims.append(UNKNOWN)
            elif start == 0 and stop == d:
                dims.append(d)
            elif start == 0 and _never_negative(stop) and self._at_most(stop, d):
                dims.append(stop)  # a prefix no longer than the axis
            elif whole_end and isinstance(start, int) and start >= 0 and self._dim_bounds(d)[0] >= start:
                dims.append(dims_subtract(d, start))
            else:
                dims.append(UNKNOWN)
        return tuple(dims)

    def _reshaped(self, source, shape):
        """A reshape's dims where its shape holds one -1: the element count of `source`
        divided by the other dims, cancelled symbol by symbol."""
        if source is None or any(d is UNKNOWN for d in (*source, *shape)):
            return None
        if any(isinstance(d, int) and (d == 0 or d < -1) for d in shape):
            return None  # 0 copies a dim of x: not followed here
        numerator = _factors(source)
        denominator = _factors([d for d in shape if d != -1])
        if numerator is None or denominator is None or denominator[0] == 0:
            return None
        coefficient, symbols = numerator
        if coefficient % denominator[0]:
            return None
        remaining = symbols.copy()
        remaining.subtract(denominator[1])
        if any(count < 0 for count in remaining.values()):
            return None
        inferred = coefficient // denominator[0]
        for symbol, count in sorted(remaining.items(), key=lambda item: item[0].name):
            for _ in range(count):
                inferred = dims_multiply(inferred, symbol)
        return tuple(inferred if d == -1 else d for d in shape)

    def _matmul_shape(self, op: Operation):
        """A matmul's output dims: its operands' batch axes broadcast, then rows of x by columns of y."""
        x, y = self.proven_shape(op.inputs["x"]), self.proven_shape(op.inputs["y"])
        if x is None or y is None or len(x) < 2 or len(y) < 2:
            return None  # a vector operand: rare enough to leave to coremltools' own type
        transpose_x = op.inputs.get("transpose_x")
        transpose_y = op.inputs.get("transpose_y")
        rows = x[-1] if transpose_x is not None and transpose_x.val else x[-2]
        columns = y[-2] if transpose_y is not None and transpose_y.val else y[-1]
        try:
            return (*broadcast_shapes(x[:-2], y[:-2]), rows, columns)
        except IncompatibleShapes:
            return None

    def _layout_shape(self, op: Operation):
        """The output dims of a reduction, expand_dims, squeeze, tile or transpose from x's."""
        inputs = op.inputs
        source = self.proven_shape(inputs["x"])
        if source is None:
            return None
        kind = op.op_type
        rank = len(source)
        if kind == "tile":
            reps = inputs["reps"].val
            reps = self.shape_value(inputs["reps"]) if reps is None else [int(r) for r in reps]
            if reps is None or len(reps) != rank or any(r is UNKNOWN for r in reps):
                return None
            return tuple(dims_multiply(d, r) for d, r in zip(source, reps))
        if kind == "transpose":
            perm = inputs["perm"].val
            return None if perm is None or len(perm) != rank else tuple(source[int(p)] for p in perm)
        axes_var = inputs.get("axes")
        axes = None if axes_var is None else axes_var.val
        if kind == "expand_dims":
            if axes is None:
                return None
            out_rank = rank + len(axes)
            inserted = {int(a) % out_rank for a in axes}
            rest = iter(source)
            return tuple(1 if position in inserted else next(rest) for position in range(out_rank))
        if axes is None:  # a reduction or squeeze over every axis (squeeze: every size-1 axis)
            if kind == "squeeze":
                return None
            axes = range(rank)
        positions = {int(a) % rank for a in axes} if rank else set()
        if kind == "squeeze" or not (inputs.get("keep_dims") is not None and inputs["keep_dims"].val):
            return tuple(d for position, d in enumerate(source) if position not in positions)
        return tuple(1 if position in positions else d for position, d in enumerate(source))

    def shape_value(self, value: Var) -> list | None:
        """The elements of a rank-0 or rank-1 int tensor as dims, or None."""
        key = id(value)
        cached = self._shape_values.get(key)
        if cached is not None and cached[0] is value:
            return cached[1]
        self._shape_values[key] = (value, None)  # a cycle, if any, stays unknown
        result = self._compute_shape_value(value)
        self._shape_values[key] = (value, result)
        return result

    def _compute_shape_value(self, value: Var) -> list | None:
        if value.dtype not in _SHAPE_DTYPES or value.rank > 1:
            return None
        if value.val is not None:
            return [int(v) for v in np.asarray(value.val).reshape(-1)]
        op = value.op
        if op is None:
            return None
        kind = op.op_type
        inputs = op.inputs
        if kind == "shape":
            return shape_values.shape_of(self.proven_shape(inputs["x"]))
        if kind in ("cast", "identity", "reshape", "expand_dims", "squeeze"):
            # A rank-0/1 int tensor keeps its elements in order through these.
            if kind == "cast" and inputs["dtype"].val not in _SHAPE_DTYPE_NAMES:
                return None
            return self.shape_value(inputs["x"])
        if kind == "concat":
            if inputs["axis"].val not in (0, -1):
                return None
            return shape_values.concatenated([self.shape_value(v) for v in inputs["values"]])
        if kind == "gather":
            indices = inputs["indices"].val
            if indices is None or inputs["axis"].val not in (0, -1):
                return None
            return shape_values.gathered(self.shape_value(inputs["x"]), np.asarray(indices).reshape(-1).tolist())
        if kind == "slice_by_index":
            return self._sliced(op)
        if kind in _SHAPE_ARITHMETIC:
            left, right = self.shape_value(inputs["x"]), self.shape_value(inputs["y"])
            if kind == "sub" and left is not None and right is not None and len(left) == len(right):
                # a dim less itself is 0 (HF's past length: the sequence read twice, subtracted)
                return [0 if a == b and a is not UNKNOWN else dims_subtract(a, b) for a, b in zip(left, right)]
            return shape_values.elementwise(_SHAPE_ARITHMETIC[kind], left, right)
        if kind == "real_div":
            return self._divided(self.shape_value(inputs["x"]), self.shape_value(inputs["y"]))
        if kind == "select":
            # torch's expand(-1): where(equal(size, -1), shape(x), size)
            return shape_values.chosen(
                self._shape_condition(inputs["cond"]), self.shape_value(inputs["a"]), self.shape_value(inputs["b"])
            )
        return None

    def _shape_condition(self, value: Var) -> list | None:
        """A bool vector compared out of shape values (equal / not_equal), elementwise."""
        if value.val is not None:
            return [bool(v) for v in np.asarray(value.val).reshape(-1)]
        op = value.op
        if op is None or op.op_type not in ("equal", "not_equal"):
            return None
        found = shape_values.equal(self.shape_value(op.inputs["x"]), self.shape_value(op.inputs["y"]))
        if found is None or op.op_type == "equal":
            return found
        return [UNKNOWN if v is UNKNOWN else not v for v in found]

    def _divided(self, left: list | None, right: list | None) -> list | None:
        """An int real_div of shape values, where it is exact: a literal quotient, or a dim by
        itself, 1 (the torch frontend's tile reps for an expand). At a size 0 the latter
        divides by zero, which leaves the original no defined value to keep."""
        pairs = shape_values.paired(left, right)
        if pairs is None:
            return None
        quotients = []
        for a, b in pairs:
            if isinstance(a, int) and isinstance(b, int) and b != 0 and a % b == 0:
                quotients.append(a // b)
            elif a == b and a is not UNKNOWN:
                quotients.append(1)
            else:
                quotients.append(UNKNOWN)
        return quotients

    def _sliced(self, op: Operation) -> list | None:
        inputs = op.inputs
        source = self.shape_value(inputs["x"])
        if source is None or inputs["x"].rank != 1:
            return None

        unknown = object()

        def first(name, default):
            var = inputs.get(name)
            if var is None:
                return default
            return unknown if var.val is None else np.asarray(var.val).reshape(-1)[0].item()

        begin, end, stride = first("begin", 0), first("end", None), first("stride", 1)
        begin_mask, end_mask = first("begin_mask", False), first("end_mask", False)
        if unknown in (begin, end, stride, begin_mask, end_mask) or not stride:
            return None
        if first("squeeze_mask", False):
            # one element, at begin (end is not read): x[begin]
            if begin is unknown or begin_mask or not -len(source) <= begin < len(source):
                return None
            return [source[begin]]
        begin = None if begin_mask else begin
        end = None if end_mask else end
        return shape_values.sliced(source, begin, end, stride)

    def dtype(self, value: Var) -> str | None:
        try:
            return types.builtin_to_string(value.dtype)
        except Exception:  # list and state types have no element dtype
            return None

    def broadcast_operands(self, op: Operation) -> list[Var] | None:
        """The operands an elementwise op (or select) broadcasts together into its output."""
        kind = op.op_type
        if kind in _BINARY_BROADCASTING:
            return [op.inputs["x"], op.inputs["y"]]
        if kind == "select":
            return [op.inputs["cond"], op.inputs["a"], op.inputs["b"]]
        return None

    def output_types_with(self, op: Operation, old: Var, new: Var):
        """The (dtype, dims) of `op`'s outputs were `old` replaced by `new`, by the op's own
        type inference; None if it cannot say. The op is left as it was."""
        if op.blocks:
            return None  # control flow types its outputs by its blocks, which do not change here
        inputs = op._input_vars
        swapped = {
            name: (tuple(new if v is old else v for v in value) if isinstance(value, (list, tuple))
                   else (new if value is old else value))
            for name, value in inputs.items()
        }
        # An op reads its inputs as attributes (`self.x`), which coremltools
        # sets beside `_input_vars`: both must see the new operand, or the
        # op infers its old type and any change passes unnoticed.
        changed = {name: value for name, value in swapped.items() if value is not inputs[name]}
        try:
            op._input_vars = swapped
            for name, value in changed.items():
                setattr(op, name, value)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                inferred = op.type_inference()
        except Exception:  # the op rejects the new operand: not provably the same
            return None
        finally:
            op._input_vars = inputs
            for name in changed:
                setattr(op, name, inputs[name])
        inferred = inferred if isinstance(inferred, tuple) else (inferred,)
        result = []
        for sym_type in inferred:
            try:
                dtype = types.builtin_to_string(sym_type.get_primitive() if types.is_tensor(sym_type) else sym_type)
            except Exception:
                dtype = None
            result.append((dtype, _shape_of_type(sym_type)))
        return result

    def constant(self, value: Var):
        val = value.val
        if val is None:
            return None
        return np.asarray(val)

    def value_name(self, value: Var) -> str:
        return value.name

    def op_available(self, op_type: str) -> bool | None:
        versions = SSAOpRegistry.core_ops.get(op_type)
        if not versions:
            return None
        targets = [function.opset_version for function in self.program.functions.values()]
        if any(target is None for target in targets):
            return None
        return all(min(versions) <= target for target in targets)

    def fill_value(self, value: Var) -> float | None:
        """The value of a `fill`/`fill_like` with a constant scalar `value`."""
        op = value.op
        if op is None or op.op_type not in ("fill", "fill_like"):
            return None
        filled = op.inputs.get("value")
        if filled is None or filled.val is None or np.asarray(filled.val).size != 1:
            return None
        return np.asarray(filled.val).reshape(-1)[0].item()

    def _uniform_scalar(self, factor: Var, scaled: Var) -> float | None:
        """The one float `factor` holds everywhere, if broadcasting it against
        `scaled` cannot widen `scaled`: it has one element and no more axes,
        or its shape is `scaled`'s (a full-size constant or a fill like it)."""
        if factor.val is not None:
            constant = np.asarray(factor.val)
            if constant.dtype.kind != "f" or constant.size == 0:
                return None
            flat = constant.reshape(-1)
            if not (flat == flat[0]).all():
                return None
            narrow = constant.size == 1 and constant.ndim <= len(scaled.shape)
            if not narrow and not _provably_same_shape(self.proven_shape(factor), self.proven_shape(scaled)):
                return None
            return float(flat[0])
        filled = self.fill_value(factor)
        if filled is None or not _provably_same_shape(self.proven_shape(factor), self.proven_shape(scaled)):
            return None
        return float(filled)

    def scaling(self, op: Operation) -> tuple[Var, float] | None:
        """(x, k) when `op` computes k * x for a finite k: a `mul` or `real_div`
        by a float constant (or fill) that holds k everywhere and does not widen
        x, or `sub(0, x)` (k = -1)."""
        if op.op_type not in ("mul", "real_div", "sub"):
            return None
        x, y = op.inputs["x"], op.inputs["y"]
        if op.op_type == "sub":
            # 0 - y is y scaled by -1, when the 0 does not widen y.
            if y.val is None and self._uniform_scalar(x, y) == 0.0:
                return y, -1.0
            return None
        candidates = [(x, y)] if op.op_type == "real_div" else [(x, y), (y, x)]
        for scaled, factor in candidates:
            if scaled.val is not None or self.dtype(scaled) != self.dtype(op.outputs[0]):
                continue
            k = self._uniform_scalar(factor, scaled)
            if k is None or not np.isfinite(k):
                continue  # inf·x is no scaling one could fold: 0·inf is NaN
            if op.op_type == "real_div":
                if k == 0.0 or not np.isfinite(k):
                    continue
                k = 1.0 / k
            return scaled, k
        return None

    # ---- mutation

    def build(self, op_type: str, operands: dict[str, Any], before: Operation, name: str) -> Var:
        block = before.enclosing_block
        builder = getattr(mb, op_type)
        self._changed = True
        self._has_constexpr = self._has_constexpr or op_type.startswith("constexpr_")
        arguments = {k: _operand(v) for k, v in operands.items() if v is not None}
        previous = _op_before(block, before)
        with _in_block(block):
            result = builder(**arguments, before_op=before, name=self._unique_name(name))
        # The new op and the consts the builder made for its constant operands
        # stand for `before`, the op the rule matched: they carry its scopes.
        _inherit_scopes(_ops_between(block, previous, before), before, _rule_of(name))
        return result[0] if isinstance(result, (list, tuple)) else result

    def _unique_name(self, name: str) -> str:
        # The engine's names are unique within one run; a second run over the
        # same program must not reuse a name still in it.
        if self._names is None:
            self._names = set()
            for function in self.program.functions.values():
                self._collect_names(function)
        candidate, serial = name, 0
        while candidate in self._names:
            serial += 1
            candidate = f"{name}_{serial}"
        self._names.add(candidate)
        return candidate

    def _collect_names(self, block: Block) -> None:
        for op in block.operations:
            self._names.add(op.name)
            self._names.update(v.name for v in op.outputs)
            for nested in op.blocks:
                self._collect_names(nested)

    def replace_all_uses(self, old: Var, new: Var) -> None:
        self._changed = True
        block = self.defining_block(old)
        function_outputs = {
            id(v) for f in self.program.functions.values() for v in f.outputs
        }
        if id(old) in function_outputs:
            function_inputs = {id(v) for f in self.program.functions.values() for v in f.inputs.values()}
            if id(new) in function_inputs or id(new) in function_outputs:
                # A function output must keep its own name, and an input's or
                # another output's name cannot be given away: bridge with identity.
                previous = _op_before(block, old.op)
                with _in_block(block):
                    new = mb.identity(x=new, before_op=old.op, name=old.name + "_bridge")
                _inherit_scopes(_ops_between(block, previous, old.op), old.op, None)
        consumers = self.consumers(old)
        anchor = old.op
        block.replace_uses_of_var_after_op(
            anchor_op=anchor, old_var=old, new_var=new, no_check_var_types=True
        )
        if id(old) in function_outputs:
            # coremltools gave `new` the output's name; the old var must not keep it too.
            old.name = old.name + "_replaced"
        if self.check_types:
            self._check_consumers(consumers)

    def _check_consumers(self, consumers: Sequence[Operation]) -> None:
        # The rule's conditions are what prove that consumers compute the same
        # thing; this re-derives their output types to catch a rule whose
        # conditions do not. Symbol names may change; nothing else may.
        for op in consumers:
            if op.enclosing_block is None:
                continue
            before = [(self.dtype(v), self.shape(v)) for v in op.outputs]
            with _in_block(op.enclosing_block):
                op.type_value_inference(overwrite_output=True)
            after = [(self.dtype(v), self.shape(v)) for v in op.outputs]
            for (old_dtype, old_shape), (new_dtype, new_shape), var in zip(before, after, op.outputs):
                if old_dtype != new_dtype or not _same_known_dims(old_shape, new_shape):
                    raise TypeChangedError(
                        f"op '{op.name}' output '{var.name}' changed from "
                        f"{_describe(old_dtype, old_shape)} to {_describe(new_dtype, new_shape)}"
                    )

    def replace_operand(self, op: Operation, old: Var, new: Var) -> None:
        self._changed = True
        changed = {}
        for name, value in op.inputs.items():
            if isinstance(value, (list, tuple)) and any(v is old for v in value):
                changed[name] = tuple(new if v is old else v for v in value)
            elif value is old:
                changed[name] = new
        if not changed:
            return
        with _in_block(op.enclosing_block):
            # The new operand differs in type on purpose (it is wider); the op's
            # own output must not change, which checked mode verifies.
            op.set_inputs(no_check_var_types=True, type_inference=False, **changed)
        if self.check_types:
            self._check_consumers([op])

    def remove_op(self, op: Operation) -> None:
        op.enclosing_block.remove_ops([op])

    def count_ops(self) -> int:
        return count_ops(self.program)

    def finish(self) -> None:
        if self._changed and self._has_constexpr:
            for function in self.program.functions.values():
                function._propagate_nonreplaceable_vars()
        self._changed = False

    def unknown_dim_origin(self, value: Var, axis: int) -> Operation | None:
        """The op whose type inference lost dim `axis` of `value` (`Adapter.unknown_dim_origin`).

        Walked through the broadcasting ops' aligned dims, else through any
        operand with an unknown dim or rank.
        """
        from rewrite.engine.interfaces import follow_unknown_dim

        return follow_unknown_dim(self, value, axis)


# ---------------------------------------------------------------- scopes
#
# coremltools records where each op came from in `op.scopes`: the torch
# module (TORCHSCRIPT_MODULE_NAME/TYPE), the torch.export stack trace
# (EXIR_STACK_TRACE, EXIR_DEBUG_HANDLE), and the graph passes that made it
# (COREMLTOOLS_GRAPH_PASS). A torch conversion declares the frontend's
# sources essential and checks every op has them after each
# dead_code_elimination. coremltools' own passes give an op they create the
# scopes of the var it replaces (`Block._copy_scope_info`), but only through
# `replace_uses_of_var_after_op`, and only for ops made under a graph-pass
# scope alone; a rule also widens operands in place and runs outside any
# pass. So the adapter sets the scopes itself, the same way.


def _op_before(block: Block, op: Operation) -> Operation | None:
    """The op right before `op` in `block`, or None if `op` is first."""
    operations = block.operations
    if isinstance(operations, list):
        index = operations.index(op)
        return operations[index - 1] if index else None
    node = operations._get_node_from_op(op).prev
    return None if node is None else node.op


def _ops_between(block: Block, previous: Operation | None, op: Operation) -> list[Operation]:
    """The ops now between `previous` (None: the block's start) and `op`: those just inserted before `op`."""
    operations = block.operations
    if isinstance(operations, list):
        end = operations.index(op)
        start = 0 if previous is None else operations.index(previous) + 1
        return operations[start:end]
    inserted = []
    node = operations._get_node_from_op(op).prev
    while node is not None and node.op is not previous:
        inserted.append(node.op)
        node = node.prev
    return inserted


def _rule_of(name: str) -> str:
    # The engine names a new op "<rule>_<serial>" (before `_unique_name` may add
    # a suffix of its own, which `name` here does not have yet).
    rule, _, serial = name.rpartition("_")
    return rule if rule and serial.isdigit() else name


def _inherit_scopes(ops: Sequence[Operation], source: Operation, rule: str | None) -> None:
    """Give `ops` the scopes of `source`, with the graph pass running (if any)
    and `rule` appended to its COREMLTOOLS_GRAPH_PASS history, as coremltools'
    `add_graph_pass_scope` records a pass."""
    from coremltools.converters.mil.mil.scope import (
        SCOPE_STACK,
        VALID_OPS_TO_COPY_SCOPE_INFO,
        ScopeSource,
        add_graph_pass_scope,
    )

    current = SCOPE_STACK.get_curr_scopes()
    history = list(current.get(ScopeSource.COREMLTOOLS_GRAPH_PASS, ()))
    if rule is not None:
        history.append(rule)
    for op in ops:
        scopes = add_graph_pass_scope(
            source.scopes, {ScopeSource.COREMLTOOLS_GRAPH_PASS: history} if history else {}
        )
        # A scope the caller opened around the run, that `source` has no entry of.
        for key, value in current.items():
            if key not in scopes and value:
                scopes[key] = list(value)
        op.scopes = scopes
        # Inside a pass coremltools would merge the replaced var's scopes into
        # these once more when a use is replaced (and assert on the result):
        # they are final already.
        if VALID_OPS_TO_COPY_SCOPE_INFO:
            VALID_OPS_TO_COPY_SCOPE_INFO[-1].discard(op)


# Ops whose output shape follows from their operands' shapes or values.
_UNARY_ELEMENTWISE = frozenset(
    "abs acos asin atan atanh ceil clip cos cosh erf exp exp2 floor inverse log logical_not relu relu6 round "
    "rsqrt sigmoid sigmoid_hard sign silu sin sinh softplus softsign sqrt square tan tanh threshold gelu "
    "elu leaky_relu linear_activation scaled_tanh softmax cast identity".split()
)
_BINARY_BROADCASTING = frozenset(
    "add sub mul real_div pow maximum minimum floor_div mod equal not_equal less less_equal greater "
    "greater_equal logical_and logical_or logical_xor".split()
)
_REDUCTIONS = frozenset(
    "reduce_sum reduce_mean reduce_max reduce_min reduce_prod reduce_l1_norm reduce_l2_norm reduce_log_sum "
    "reduce_log_sum_exp reduce_sum_square".split()
)
_LAYOUT = _REDUCTIONS | {"expand_dims", "squeeze", "tile", "transpose"}
# Ops whose output has x's shape.
_SAME_SHAPE = frozenset({"layer_norm", "batch_norm", "instance_norm", "l2_norm", "local_response_norm", "band_part"})
# Ops the torch frontend puts on a flexible sequence's way (see MilAdapter._frontend_shape).
_FRONTEND_SHAPES = frozenset(
    {"linear", "scaled_dot_product_attention", "split", "gather", "concat", "range_1d", "slice_by_index"}
)
_SHAPE_FOLLOWS = (
    _UNARY_ELEMENTWISE | _BINARY_BROADCASTING | _LAYOUT | _SAME_SHAPE | _FRONTEND_SHAPES
    | {"select", "fill", "fill_like", "reshape", "matmul"}
)


def _shape_operands(op: Operation) -> list:
    """The operands whose shapes an op's output shape follows from."""
    kind = op.op_type
    inputs = op.inputs
    if kind in _UNARY_ELEMENTWISE:
        return [inputs["x"]]
    if kind in _BINARY_BROADCASTING or kind == "select":
        return [inputs[name] for name in ("cond", "a", "b", "x", "y") if name in inputs]
    if kind == "fill_like":
        return [inputs["ref_tensor"]]
    if kind in _LAYOUT:
        return [inputs["x"]]
    if kind == "matmul":
        return [inputs["x"], inputs["y"]]
    if kind in _SAME_SHAPE or kind in ("linear", "split", "slice_by_index"):
        return [inputs["x"]]
    if kind == "reshape":
        return [inputs["x"]]
    if kind == "gather":
        return [inputs["x"], inputs["indices"]]
    if kind == "concat":
        return list(inputs["values"])
    if kind == "scaled_dot_product_attention":
        return [inputs["query"], inputs["value"]]
    return []


def _never_negative(dim) -> bool:
    """A literal >= 0, or a symbol for a size or a sum or product of sizes (not a difference)."""
    if isinstance(dim, int):
        return dim >= 0
    return isinstance(dim, Symbol) and "-" not in dim.name


def _factors(dims) -> tuple[int, Counter] | None:
    """A product of dims as (literal coefficient, symbols with their powers); None if a dim is unknown."""
    coefficient, symbols = 1, Counter()
    for d in dims:
        if isinstance(d, int):
            coefficient *= d
        elif isinstance(d, Symbol):
            symbols[d] += 1
        else:
            return None
    return coefficient, symbols
_SHAPE_DTYPES = frozenset({types.int32, types.int64, types.int16, types.uint16, types.int8, types.uint8})
_SHAPE_DTYPE_NAMES = frozenset({"int32", "int64", "int16", "uint16", "int8", "uint8"})
_SHAPE_ARITHMETIC = {"add": "+", "sub": "-", "mul": "*"}


def _provably_same_shape(left, right) -> bool:
    if left is None or right is None or len(left) != len(right):
        return False
    return all(equal(a, b) is Truth.YES for a, b in zip(left, right))


def _same_known_dims(left, right) -> bool:
    if left is None or right is None:
        return left is right
    if len(left) != len(right):
        return False
    return all(not (isinstance(a, int) and isinstance(b, int)) or a == b for a, b in zip(left, right))


def _describe(dtype, shape) -> str:
    dims = "?" if shape is None else ", ".join(str(d) for d in shape)
    return f"{dtype}({dims})"


def _operand(value):
    if isinstance(value, list):
        array = np.asarray(value)
        if array.dtype == np.int64:
            array = array.astype(np.int32)
        elif array.dtype == np.float64:
            array = array.astype(np.float32)
        return array
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return np.int32(value)
    if isinstance(value, float):
        return np.float32(value)
    return value


# ---------------------------------------------------------------- files

_MANIFEST = "Manifest.json"
_WEIGHTS = "weights"  # beside the root model file, where "@model_path/weights/..." points


@dataclass(frozen=True, eq=False)
class MilSource:
    """Where a loaded program came from: what `save_mlpackage` keeps of it.

    `path` is the `.mlpackage` folder or `.mlmodel` file (absolute, as given:
    symlinks not resolved). `spec` is its model specification (`Model_pb2.Model`).
    `files` lists every file inside it (absolute, under `path`; folders not
    listed, a symlink listed as itself), so that a caller can make sure an
    output never overwrites one of them. `manifest` holds Manifest.json's bytes
    as read and `root_model` the root model file's path relative to `Data/`
    (both None for an `.mlmodel`).
    """

    path: Path
    spec: Any
    files: tuple[Path, ...]
    manifest: bytes | None = None
    root_model: str | None = None

    @property
    def package(self) -> bool:
        """Whether the source is an `.mlpackage` (rather than an `.mlmodel` file)."""
        return self.manifest is not None


@dataclass(frozen=True)
class _Package:
    """An `.mlpackage` read without changing a byte of it."""

    root: Path
    manifest: bytes
    entries: dict
    root_model: PurePosixPath  # relative to Data/
    files: tuple[Path, ...]
    folders: tuple[Path, ...]

    @property
    def model_file(self) -> Path:
        return self.root / "Data" / self.root_model

    @property
    def weights_dir(self) -> Path:
        return self.model_file.parent / _WEIGHTS


def load_mlpackage(path: str | os.PathLike) -> tuple[Program, MilSource]:
    """Read an `.mlpackage` (or an `.mlmodel` file) into a pymil Program, strictly read-only.

    Returns the program and a `MilSource` to pass to `save_mlpackage`, which
    keeps the deployment target, input shapes, model description and the
    package's other contents. Nothing of the input is written, not even
    Manifest.json (coremltools' ModelPackage rewrites it on opening, so it is
    not used). A missing or malformed model, a Manifest path or a symlink
    leading out of the package, raise `MilError` with a one-line message
    naming the file.
    """
    path = Path(path).absolute()
    if not path.exists():
        raise MilError(f"{path}: no such file or directory")
    if path.is_dir():
        package = _read_package(path)
        model_file, weights_dir, files = package.model_file, str(package.weights_dir), package.files
        manifest, root_model = package.manifest, str(package.root_model)
    else:
        model_file, weights_dir, files, manifest, root_model = path, "", (path,), None, None
    spec = _read_spec(model_file)
    from coremltools.converters.mil.frontend.milproto.load import load as milproto_load

    try:
        program = milproto_load(spec, spec.specificationVersion, file_weights_dir=weights_dir)
    except Exception as error:
        raise MilError(f"{model_file}: could not read its MIL program ({_first_line(error)})") from None
    _share_weights_across_functions(program, spec)
    return program, MilSource(path, spec, files, manifest, root_model)


def _share_weights_across_functions(program: Program, spec) -> None:
    """Mark consts that read one stored weight in several functions, as
    coremltools' save_multifunction does, so that saving writes it once.

    The milproto frontend gives each function its own const; a
    multifunction model (say, adapters over one base model) would otherwise
    come out with its shared weights once per function.
    """
    if len(spec.mlProgram.functions) < 2:
        return
    readers: dict[tuple, list[tuple[str, str]]] = {}
    for function_name, function in spec.mlProgram.functions.items():
        pending = list(function.block_specializations.values())
        while pending:
            for op in pending.pop().operations:
                pending.extend(op.blocks)
                value = op.attributes["val"] if op.type == "const" and "val" in op.attributes else None
                if value is not None and value.WhichOneof("value") == "blobFileValue" and op.outputs:
                    blob = (value.blobFileValue.fileName, value.blobFileValue.offset)
                    readers.setdefault(blob, []).append((function_name, op.outputs[0].name))
    shared = {
        reader: f"{name}:{offset}"
        for (name, offset), found in readers.items() if len({f for f, _ in found}) > 1
        for reader in found
    }
    if not shared:
        return
    for function_name, function in program.functions.items():
        pending = [function]
        while pending:
            for op in pending.pop().operations:
                pending.extend(op.blocks)
                weight = shared.get((function_name, op.outputs[0].name)) if op.op_type == "const" else None
                if weight is not None and op.weight_id is None:
                    op.weight_id = weight


def _read_package(root: Path) -> _Package:
    files, folders = _package_tree(root)
    manifest_file = root / _MANIFEST
    try:
        data = manifest_file.read_bytes()
    except FileNotFoundError:
        raise MilError(f"{manifest_file}: no such file (not a Core ML model package)") from None
    except OSError as error:
        raise MilError(f"{manifest_file}: not a Core ML model package ({error.strerror})") from None
    try:
        manifest = json.loads(data)
    except ValueError as error:  # also UnicodeDecodeError
        raise MilError(f"{manifest_file}: not a Core ML model package (invalid JSON: {error})") from None
    entries = manifest.get("itemInfoEntries") if isinstance(manifest, dict) else None
    identifier = manifest.get("rootModelIdentifier") if isinstance(manifest, dict) else None
    entry = entries.get(identifier) if isinstance(entries, dict) and isinstance(identifier, str) else None
    relative = entry.get("path") if isinstance(entry, dict) else None
    if not isinstance(relative, str) or not PurePosixPath(relative).parts:
        raise MilError(f"{manifest_file}: not a Core ML model package (no root model entry)")
    root_model = PurePosixPath(relative)
    if root_model.is_absolute() or ".." in root_model.parts or "\\" in relative or "\0" in relative:
        raise MilError(f"{manifest_file}: the root model path '{relative}' leads out of the package")
    return _Package(root, data, entries, root_model, files, folders)


def _package_tree(root: Path) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """Every file and folder under `root`, refusing what could read outside it."""
    inside = root.resolve()
    files, folders = [], []

    def fail(error: OSError):
        raise MilError(f"{error.filename}: cannot read it ({error.strerror})")

    for folder, subfolders, names in os.walk(root, onerror=fail):
        for name in sorted(subfolders + names):
            entry = Path(folder) / name
            try:
                mode = entry.lstat().st_mode
            except OSError as error:
                fail(error)
            if stat.S_ISLNK(mode):
                try:
                    target = entry.resolve(strict=True)
                except (OSError, RuntimeError):
                    raise MilError(f"{entry}: a symbolic link that leads nowhere") from None
                if not target.is_relative_to(inside):
                    raise MilError(f"{entry}: a symbolic link out of the package (to {target})")
                files.append(entry)
            elif stat.S_ISDIR(mode):
                folders.append(entry)
            elif stat.S_ISREG(mode):
                files.append(entry)
            else:
                raise MilError(f"{entry}: not a regular file")
    return tuple(files), tuple(folders)


def _read_spec(model_file: Path):
    try:
        data = model_file.read_bytes()
    except FileNotFoundError:
        raise MilError(f"{model_file}: no such file (the package's root model)") from None
    except OSError as error:
        raise MilError(f"{model_file}: cannot read it ({error.strerror})") from None
    spec = ct.proto.Model_pb2.Model()
    try:
        spec.ParseFromString(data)
    except Exception:
        raise MilError(f"{model_file}: not a Core ML model (corrupt model specification)") from None
    kind = spec.WhichOneof("Type")
    if kind != "mlProgram":
        what = f"it is a {kind} model" if kind else "no model type in it"
        raise MilError(f"{model_file}: not an ML program ({what})")
    return spec


def save_mlpackage(program: Program, path: str | os.PathLike, source: MilSource | None = None) -> None:
    """Write `program` as a complete `.mlpackage` at `path`, which must not exist yet.

    Runs none of coremltools' graph passes. With `source` (from
    `load_mlpackage`) the output is the source package with its model
    replaced: the deployment target, the input shapes (ranges with their
    defaults, enumerated shapes), all of the model description the program
    does not determine (metadata, feature descriptions, input and output
    types such as images) and every other item of the package (other
    Manifest entries and their files, custom Manifest keys) are kept, and
    Manifest.json stays byte-identical unless a weights entry has to be
    added. The source is only read.

    `program` may be modified: coremltools' backend passes (which e.g. fuse
    x * sigmoid(x) into silu and sanitise names) run on it in place. To keep
    it, save a `copy_program` of it (not a `copy.deepcopy`, which recurses
    along the use-def chain and fails past ~70-300 ops in a row).

    A `path` ending in `.mlmodel` gets a bare model file, which only a
    program without weight files fits in. Folders are created with mode
    0o777 and files with 0o666, less the umask. Anything that goes wrong
    raises `MilError` and leaves nothing at `path`.
    """
    path = Path(path).absolute()
    if os.path.lexists(path):
        raise MilError(f"{path}: already exists")
    spec = source.spec if source is not None else None
    _silence_pass_progress()
    if spec is not None:
        try:
            target = ct.target(spec.specificationVersion)
        except ValueError:
            raise MilError(f"{source.path}: specification version {spec.specificationVersion} "
                           f"is unknown to coremltools {ct.__version__}") from None
        inputs = _input_types(spec, program)
        if spec.description.functions:
            # coremltools writes a multifunction model only when told to, and
            # takes input types for "main" alone; the function descriptions
            # are carried over after conversion.
            program.default_function_name = spec.description.defaultFunctionName
            program.export_as_multifunction = True
            inputs = None
    else:
        target = max((f.opset_version for f in program.functions.values()), default=None)
        inputs = _default_input_types(program)
    # Beside `path`, so that the weights move into place by a rename.
    try:
        scratch = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    except OSError as error:
        raise MilError(f"{path}: cannot write there ({error.strerror})") from None
    try:
        converted = scratch / "converted.mlpackage"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = ct.convert(
                    program,
                    convert_to="mlprogram",
                    pass_pipeline=ct.PassPipeline.EMPTY,
                    minimum_deployment_target=target,
                    inputs=inputs,
                    skip_model_load=True,
                    package_dir=str(converted),
                )
        except Exception as error:
            raise MilError(f"{path}: could not convert the program ({_first_line(error)})") from None
        built = _read_package(converted)
        # Not the package's model file: coremltools adds its build metadata
        # to the spec in memory only, after writing the package.
        new_spec = model.get_spec()
        if spec is not None:
            _keep_description(new_spec, spec)
        if path.suffix == ".mlmodel":
            _write_model_file(path, new_spec, built.weights_dir)
        else:
            template = _read_package(source.path) if source is not None and source.package else built
            _write_package(path, template, new_spec, built.weights_dir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _write_model_file(path: Path, spec, weights_dir: Path) -> None:
    if weights_dir.is_dir() and any(weights_dir.iterdir()):
        raise MilError(f"{path}: a program with weight files can only be saved as an .mlpackage")
    try:
        file = open(path, "xb")
    except OSError as error:
        raise MilError(f"{path}: could not write it ({error})") from None
    try:
        with file:
            file.write(spec.SerializeToString())
    except BaseException as error:
        path.unlink()
        if isinstance(error, OSError):
            raise MilError(f"{path}: could not write it ({error})") from None
        raise


def _write_package(path: Path, template: _Package, spec, weights_dir: Path) -> None:
    """`template`'s tree with its root model file and weights folder replaced."""
    data = Path("Data")
    model_file = data / template.root_model
    weights = model_file.parent / _WEIGHTS
    has_weights = weights_dir.is_dir() and any(p.is_file() for p in weights_dir.rglob("*"))
    listed = any(
        isinstance(entry, dict) and isinstance(entry.get("path"), str)
        and PurePosixPath(entry["path"]) == PurePosixPath(weights.relative_to(data))
        for entry in template.entries.values()
    )
    try:
        os.mkdir(path)
    except OSError as error:
        raise MilError(f"{path}: could not write the package ({error})") from None
    try:
        # What mkdir made of 0o777 is 0o777 less the umask (asking the umask
        # itself means setting it, which races with other threads).
        folder_mode = stat.S_IMODE(path.stat().st_mode)
        for folder in template.folders:
            relative = folder.relative_to(template.root)
            if not relative.is_relative_to(weights):
                (path / relative).mkdir(parents=True, exist_ok=True)
        for file in template.files:
            relative = file.relative_to(template.root)
            if relative in (Path(_MANIFEST), model_file) or relative.is_relative_to(weights):
                continue
            (path / relative).parent.mkdir(parents=True, exist_ok=True)
            if file.is_dir():  # a symlink to a folder inside the package: copy what it holds
                shutil.copytree(file, path / relative)
            else:
                shutil.copyfile(file, path / relative)
        manifest = template.manifest
        if has_weights and not listed:
            manifest = _manifest_with_weights(manifest, weights.relative_to(data))
        (path / _MANIFEST).write_bytes(manifest)
        (path / model_file).parent.mkdir(parents=True, exist_ok=True)
        (path / model_file).write_bytes(spec.SerializeToString())
        if has_weights or listed:
            if weights_dir.is_dir():
                os.replace(weights_dir, path / weights)
            else:
                (path / weights).mkdir()
        # coremltools makes its folders with mkdtemp (0o700) and copies modes
        # along; the output should look like any other folder the user makes.
        for folder, _, names in os.walk(path):
            os.chmod(folder, folder_mode)
            for name in names:
                if not os.path.islink(os.path.join(folder, name)):
                    os.chmod(os.path.join(folder, name), folder_mode & 0o666)
    except BaseException as error:
        shutil.rmtree(path, ignore_errors=True)
        if isinstance(error, OSError):
            raise MilError(f"{path}: could not write the package ({error})") from None
        raise


def _manifest_with_weights(manifest: bytes, weights: PurePosixPath) -> bytes:
    document = json.loads(manifest)
    document["itemInfoEntries"][str(uuid.uuid4())] = {
        "author": "com.apple.CoreML",
        "description": "CoreML Model Weights",
        "name": _WEIGHTS,
        "path": weights.as_posix(),
    }
    return (json.dumps(document, indent=4) + "\n").encode()


def _keep_description(new, old) -> None:
    """Carry over into `new` what of `old`'s description the program does not determine."""
    description, original = new.description, old.description
    # coremltools' own keys (version, source "milinternal", date) describe
    # this save, not the model: the original's say where the model came from.
    if original.HasField("metadata"):
        description.metadata.CopyFrom(original.metadata)
    else:
        description.ClearField("metadata")
    _keep_interface(description, original)
    functions = {function.name: function for function in original.functions}
    for function in description.functions:
        if function.name in functions:
            _keep_interface(function, functions[function.name])
    # The program's functions come in the order of a protobuf map, which is none.
    order = {name: index for index, name in enumerate(functions)}
    ordered = sorted(description.functions, key=lambda f: order.get(f.name, len(order)))
    if [f.name for f in ordered] != [f.name for f in description.functions]:
        ordered = [type(f).FromString(f.SerializeToString()) for f in ordered]  # copies: clearing frees them
        del description.functions[:]
        description.functions.extend(ordered)
    if original.defaultFunctionName in {f.name for f in description.functions}:
        description.defaultFunctionName = original.defaultFunctionName
    if not description.trainingInput:
        description.trainingInput.extend(original.trainingInput)


def _keep_interface(new, old) -> None:
    """Feature descriptions (a ModelDescription's or FunctionDescription's) matched by name."""
    for field in ("input", "output", "state"):
        originals = {feature.name: feature for feature in getattr(old, field)}
        for feature in getattr(new, field):
            original = originals.get(feature.name)
            if original is None:
                continue
            feature.shortDescription = original.shortDescription
            # The program sees tensors only: what the description says beyond
            # that (an image, shape ranges and their defaults, optional inputs'
            # default values) is not in it to be derived again.
            if _fits(feature.type, original.type):
                feature.type.CopyFrom(original.type)
    outputs = {feature.name for feature in new.output}
    for field in ("predictedFeatureName", "predictedProbabilitiesName"):
        if getattr(old, field) in outputs and not getattr(new, field):
            setattr(new, field, getattr(old, field))


def _fits(new, old) -> bool:
    """Whether feature type `old` describes the same program value as `new` does."""
    kind, original_kind = new.WhichOneof("Type"), old.WhichOneof("Type")
    if original_kind == "imageType" and kind == "multiArrayType":
        array = new.multiArrayType
        return array.dataType in (array.FLOAT32, array.FLOAT16) and len(_array_ranges(array)) in (0, 4)
    if kind != original_kind:
        return False
    if kind == "stateType":
        new, old, kind = new.stateType, old.stateType, "arrayType"
    if kind not in ("multiArrayType", "arrayType"):
        return True
    new_array, old_array = getattr(new, kind), getattr(old, kind)
    if new_array.dataType != old_array.dataType:
        return False
    new_ranges, old_ranges = _array_ranges(new_array), _array_ranges(old_array)
    if not new_ranges or not old_ranges:
        return True
    return len(new_ranges) == len(old_ranges) and all(
        low != high or (old_low <= low and (old_high < 0 or low <= old_high))
        for (low, high), (old_low, old_high) in zip(new_ranges, old_ranges)
    )


def _array_ranges(array) -> list[tuple[int, int]]:
    """(lower, upper) per axis of an ArrayFeatureType; upper -1 is unbounded."""
    if array.shapeRange.sizeRanges:
        return [(int(r.lowerBound), int(r.upperBound)) for r in array.shapeRange.sizeRanges]
    if array.enumeratedShapes.shapes:
        shapes = [tuple(s.shape) for s in array.enumeratedShapes.shapes]
        return [(int(min(axis)), int(max(axis))) for axis in zip(*shapes)]
    return [(int(d), int(d)) for d in array.shape]


# Core ML needs a finite upper bound for a flexible dim; without a model spec
# to copy bounds from, a symbolic dim may take any size up to this.
DEFAULT_UPPER_BOUND = 65536


def _default_input_types(program: Program):
    function = program.functions.get("main")
    if function is None or len(program.functions) != 1:
        return None
    inputs = []
    for name, var in function.inputs.items():
        if not types.is_tensor(var.sym_type):
            return None
        inputs.append(_tensor_type(name, var))
    return inputs


def _tensor_type(name: str, var):
    dims = tuple(ct.RangeDim(1, DEFAULT_UPPER_BOUND) if is_symbolic(d) else int(d) for d in var.shape)
    return ct.TensorType(name=name, shape=ct.Shape(dims))


def _silence_pass_progress() -> None:
    # ct.convert draws a tqdm bar per pass pipeline, even for the empty one;
    # a save is not a step the user asked to watch.
    from coremltools.converters.mil.mil.passes import pass_pipeline

    pass_pipeline.tqdm = lambda iterable, *args, **kwargs: iterable


def _input_types(spec, program: Program):
    """ct.TensorType inputs that reproduce the spec's (possibly flexible) input shapes."""
    function = program.functions.get("main")
    inputs = []
    for feature in spec.description.input:
        if feature.type.WhichOneof("Type") == "multiArrayType":
            inputs.append(ct.TensorType(name=feature.name, shape=_array_shape(feature.type.multiArrayType)))
            continue
        # An image is a tensor to the program; the description says "image"
        # again once the original feature type is copied over.
        var = function.inputs.get(feature.name) if function is not None else None
        if var is None or not types.is_tensor(var.sym_type):
            return None  # let coremltools derive them all from the program
        inputs.append(_tensor_type(feature.name, var))
    return inputs


def _array_shape(array):
    default = [int(d) for d in array.shape]
    ranges = array.shapeRange.sizeRanges
    if ranges:
        if len(default) != len(ranges):
            default = [int(size.lowerBound) for size in ranges]
        dims = []
        for size, value in zip(ranges, default):
            if size.lowerBound == size.upperBound:
                dims.append(int(size.lowerBound))
            else:
                upper = int(size.upperBound) if size.upperBound > 0 else -1
                dims.append(ct.RangeDim(int(size.lowerBound), upper, default=value))
        return ct.Shape(tuple(dims))
    if array.enumeratedShapes.shapes:
        return ct.EnumeratedShapes([tuple(s.shape) for s in array.enumeratedShapes.shapes], default=tuple(default))
    return tuple(default)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def count_ops(program: Program, op_type: str | None = None) -> int:
    """The number of ops (of `op_type`, if given) in every block of `program`."""

    def count(block: Block) -> int:
        total = 0
        for op in block.operations:
            if op_type is None or op.op_type == op_type:
                total += 1
            for nested in op.blocks:
                total += count(nested)
        return total

    return sum(count(f) for f in program.functions.values())


def register_graph_pass(rules, name: str, *, override: bool = True) -> str:
    """Register a `RuleSet` as a coremltools graph pass named `name`.

    `name` is "namespace::pass_name" (e.g. "common::remove_broadcast_tiles");
    the pass can then be inserted into a `ct.PassPipeline` like any other:

        register_graph_pass(rewrite.load_rules("tiles.rules"), "common::remove_broadcast_tiles")
        pipeline = ct.PassPipeline.DEFAULT
        pipeline.insert_pass(0, "common::remove_broadcast_tiles")
    """
    from coremltools.converters.mil.mil.passes.graph_pass import AbstractGraphPass
    from coremltools.converters.mil.mil.passes.pass_registry import register_pass

    namespace, separator, pass_name = name.partition("::")
    if not separator or not namespace or not pass_name.isidentifier():
        raise ValueError(f"pass name {name!r} must look like 'namespace::pass_name'")

    class RuleSetPass(AbstractGraphPass):
        __doc__ = f"The rules {', '.join(r.name for r in rules.rules)} as a graph pass."
        rule_set = rules
        last_statistics = None

        def apply(self, program):
            type(self).last_statistics = self.rule_set.apply(program)

    RuleSetPass.__name__ = pass_name
    RuleSetPass.__qualname__ = pass_name
    register_pass(namespace=namespace, override=override)(RuleSetPass)
    return name


# ---------------------------------------------------------------- examples


def build_example(inputs, ops, outputs, nested_by: str | None = None, opset: str | None = None) -> Program:
    """A program from a rule example: `inputs` are (name, dtype, dims) with
    named dims symbolic, `ops` are (name, op type, operands), operands being
    `NamedValue`s or constants; `outputs` are names.

    With `nested_by` (an fp32[1] input), the ops go into both branches of a
    `cond` on that input being positive, so they live in nested blocks.
    `opset` names the deployment target (`iOS15` to `iOS18`, the default).
    """
    from coremltools.converters.mil.mil import Function, get_new_symbol

    symbols: dict[str, Any] = {}

    def dim(d):
        return symbols.setdefault(d, get_new_symbol()) if isinstance(d, str) else int(d)

    placeholders = {
        name: mb.placeholder(shape=tuple(dim(d) for d in dims), dtype=types.string_to_builtin(dtype))
        for name, dtype, dims in inputs
    }
    program = Program()
    target = getattr(ct.target, opset or "iOS18", None)
    if target is None or not str(opset or "iOS18").startswith("iOS"):
        raise MilError(f"unknown deployment target '{opset}' (iOS15 to iOS18)")
    with Function(placeholders, opset_version=target) as function:
        inputs_by_name = {name: function.inputs[name] for name in placeholders}

        def body(suffix: str = ""):
            values = dict(inputs_by_name)
            for name, op_type, operands in ops:
                def resolve(value):
                    if isinstance(value, NamedValue):
                        return values[value.name]
                    if isinstance(value, tuple):  # a variadic operand: `values=(%a, %b)`
                        return tuple(resolve(item) for item in value)
                    return _operand(value)

                arguments = {key: resolve(value) for key, value in operands.items()}
                result = getattr(mb, op_type)(**arguments, name=name + suffix)
                values[name] = result[0] if isinstance(result, (list, tuple)) else result
            return tuple(values[name] for name in outputs)

        if nested_by is None:
            results = body()
        else:
            predicate = mb.squeeze(x=mb.greater(x=inputs_by_name[nested_by], y=np.float32(0)))
            results = mb.cond(pred=predicate, _true_fn=lambda: body("_then"), _false_fn=lambda: body("_else"))
            results = tuple(results) if isinstance(results, (list, tuple)) else (results,)
        function.set_outputs(list(results))
    program.add_function("main", function)
    return program


def copy_program(program: Program) -> Program:
    """An independent copy of `program`, as `copy.deepcopy` makes it, at any length.

    `copy.deepcopy` follows a var to its consumers and on, one Python frame per
    op, and fails past ~70-300 ops in a row. Here every graph object (program,
    functions and nested blocks, ops, vars, their op lists) is first found by
    an explicit walk and given an empty twin; then each object's fields are
    deep-copied with all twins already known, so that copying never goes
    further than one object's own fields (types, values, scopes).
    """
    return _copy_graph(program)


def _graph_classes() -> tuple[type, ...]:
    from coremltools.converters.mil.mil.program import Placeholder
    from coremltools.converters.mil.mil.utils import CacheDoublyLinkedList, OpNode

    return (Program, Block, Operation, Var, OpNode, CacheDoublyLinkedList, Placeholder)


@functools.cache
def _slot_names(cls: type) -> tuple[str, ...]:
    return tuple(
        name for klass in cls.__mro__ for name in klass.__dict__.get("__slots__", ())
        if name not in ("__dict__", "__weakref__")
    )


_UNSET = object()


def _fields(obj) -> list[tuple[str, bool, Any]]:
    """(name, is a slot, value) of every field `obj` has set."""
    fields = []
    for name in _slot_names(type(obj)):
        value = getattr(obj, name, _UNSET)
        if value is not _UNSET:
            fields.append((name, True, value))
    state = getattr(obj, "__dict__", None)
    if state is not None:
        fields.extend((name, False, value) for name, value in state.items())
    return fields


def _copy_graph(root):
    from coremltools.converters.mil.mil.utils import CacheDoublyLinkedList

    graph_classes = _graph_classes()
    containers = (list, tuple, set, frozenset, dict)
    found: dict[int, Any] = {}
    pending = [root]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, containers):
            pending.extend(item)
        elif isinstance(item, graph_classes) and not isinstance(item, type) and id(item) not in found:
            found[id(item)] = item
            pending.extend(value for _, _, value in _fields(item))
    # The shared end-of-list sentinel is compared by identity: it stays itself.
    sentinel = CacheDoublyLinkedList.INVALID_NODE
    memo: dict[int, Any] = {id(sentinel): sentinel}
    for key, item in found.items():
        if item is not sentinel:
            memo[key] = object.__new__(type(item))
    for key, item in found.items():
        if item is sentinel:
            continue
        twin = memo[key]
        for name, is_slot, value in _fields(item):
            value = copy.deepcopy(value, memo)
            if is_slot:
                object.__setattr__(twin, name, value)
            else:
                twin.__dict__[name] = value
    return memo[id(root)]


def evaluate_example(program: Program, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from rewrite.backends.mil_reference import evaluate

    return evaluate(program, feeds)


@dataclass(frozen=True)
class SemanticProblem:
    """An objection to a program; `key` names the place, so that one that was
    there before a rewrite is recognized after it."""

    key: tuple
    message: str


def semantic_problems(program: Program) -> list[SemanticProblem]:
    """What Core ML's runtime refuses although the values would be right.

    A `select` whose operand broadcasts implicitly (its shape is not the
    output's) fails to load in a multifunction model ("Failed to
    PropagateInputTensorShapes ... select").
    """
    adapter = MilAdapter(program)
    problems = []

    def walk(block):
        for op in block.operations:
            for nested in op.blocks:
                walk(nested)
            if op.op_type != "select":
                continue
            output = adapter.proven_shape(op.outputs[0])
            for name in ("cond", "a", "b"):
                shape = adapter.proven_shape(op.inputs[name])
                if shape is None or output is None:
                    continue
                # Provably widened: fewer axes, a literal of another size, or a
                # literal 1 against a symbol. Two symbols may be one size.
                if len(shape) != len(output) or any(
                    (isinstance(x, int) and isinstance(y, int) and x != y) or (x == 1 and not isinstance(y, int))
                    for x, y in zip(shape, output)
                ):
                    problems.append(SemanticProblem(
                        # By the operand value, not the op: a rule that rebuilds
                        # the select under a new name did not add the problem.
                        (op.inputs[name].name, name, tuple(map(str, output))),
                        f"select '{op.name}' broadcasts its operand '{name}' implicitly "
                        f"{tuple(map(str, shape))} -> {tuple(map(str, output))}; Core ML refuses that",
                    ))

    for function in program.functions.values():
        walk(function)
    return problems
