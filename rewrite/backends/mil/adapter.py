"""The Core ML MIL backend: coremltools `Program`s and `.mlpackage` files.

`MilAdapter` maps the engine's view onto pymil: ops are `Operation`s, values
are `Var`s, blocks are `Block`s (a `Function` is the outermost block).
Rewrites go through coremltools' own block API, so the result is a normal
pymil program that validates and serialises as any other.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import sympy

from rewrite.backends import pass_groups
from rewrite.backends.mil import shapes as mil_shapes
from rewrite.backends.mil.bounds import BoundsProver
from rewrite.backends.mil.pymil import (
    Block,
    Function,
    InternalVar,
    Operation,
    Program,
    SSAOpRegistry,
    TupleInputType,
    Var,
    block_module,
    count_ops,
    is_symbolic,
    mb,
    types,
)
from rewrite.backends.mil.uses import MANY_USES, UseLists, replace_uses_in_block, truncate_uses
from rewrite.engine import shape_values
from rewrite.engine.interfaces import (
    Capability,
    InputSpec,
    OperandRejected,
    OpSignature,
    TypeChangedError,
    TypesUnknown,
)
from rewrite.engine.logic import UNKNOWN, Symbol
from rewrite.engine.shapes import IncompatibleShapes, broadcast_shapes
from rewrite.engine.shapes import add as dims_add
from rewrite.engine.shapes import multiply as dims_multiply
from rewrite.engine.shapes import subtract as dims_subtract

DIALECT = "mil"

# Ops never removed as dead. A state update's effect is not its output. A
# read_state's only effect is its output, but removing the last read of a
# state leaves a state that no op reads, and whether Core ML accepts that
# cannot be seen off macOS (only Core ML validates a spec), so it stays.
# coremltools' own dead_code_elimination would remove it, but
# `save_mlpackage` converts with the empty pipeline, which drops that pass
# from the backend's too (files.py also keeps a read that the save itself
# would drop: `_keep_reads_back`).
_SIDE_EFFECT_OPS = frozenset({"coreml_update_state", "write_state", "read_state"})


# ---------------------------------------------------------------- op schema


class MilSchema:
    """coremltools' op registry, at the newest opset each op has."""

    dialect = DIALECT
    groups = pass_groups(DIALECT)

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


@functools.lru_cache(maxsize=65536)
def _dtype_of_type(sym_type) -> str | None:
    # Var.dtype asks types.is_tensor, and the guard reads the dtypes of every
    # value a rewrite touches: like shapes, converted once per type.
    try:
        if types.is_tensor(sym_type):
            return types.builtin_to_string(sym_type.get_primitive())
        if types.is_state(sym_type):
            return types.builtin_to_string(sym_type.wrapped_type().get_primitive())
        return types.builtin_to_string(sym_type)
    except Exception:  # list and state types have no element dtype
        return None


def _input(op: Operation, name: str) -> Var | tuple | None:
    """`op.inputs.get(name)`, without the dict `Operation.inputs` builds at every read:
    the engine reads an operand or two of every op it matches."""
    value = op._input_vars.get(name)
    return None if value is None or isinstance(value, InternalVar) else value


def _symbols_renamed(old: Var, new: Var) -> bool:
    """The two types differ only in the names of symbolic dims (same dtype, rank and literals):
    what coremltools' fresh symbols make of one size, `is125` where the query has `is0`."""
    if old.sym_type == new.sym_type or _dtype_of_type(old.sym_type) != _dtype_of_type(new.sym_type):
        return False
    a, b = _shape_of_type(old.sym_type), _shape_of_type(new.sym_type)
    if a is None or b is None or len(a) != len(b):
        return False
    return all(x == y or (not isinstance(x, int) and not isinstance(y, int)) for x, y in zip(a, b))


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
    block_module.BLOCK_STACK.append(block)
    try:
        yield block
    finally:
        block_module.BLOCK_STACK.pop()


class MilAdapter:
    """The engine's view of a pymil `Program`, rewritten in place."""

    dialect = DIALECT
    capabilities = frozenset({
        Capability.USE_INDEX, Capability.USES_VERSION, Capability.BROADCASTING, Capability.TYPE_INFERENCE,
        Capability.STATED_SHAPES, Capability.SHAPE_PROOFS, Capability.SHAPE_VALUES, Capability.DIM_SOURCES,
        Capability.VALUE_BOUNDS, Capability.FILLS, Capability.SCALINGS, Capability.TARGETS,
        Capability.UNKNOWN_DIM_ORIGINS, Capability.COUNT_OPS,
    })

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
        # Child lists of the values with many consumers, made cheap to remove
        # from while the run edits (coremltools' own scan for each removal).
        self._use_lists = UseLists()
        self._accepted_inputs: dict = {}  # (input type, value type) -> taken; see replace_uses_in_block
        # id(var) -> [var, how many edits changed its consumers] (`uses_version`);
        # the var is kept so its id is not reused while it has an entry.
        self._uses_versions: dict[int, list] = {}
        self._input_blocks: dict[int, Block] = {}
        self._input_symbols: set[Symbol] = set()
        # id(var) -> (var, result); the var is kept so its id is not reused.
        # Rewrites replace values by equal ones, so what was proven stays true.
        self._proven_shapes: dict[int, tuple] = {}
        self._shape_values: dict[int, tuple] = {}
        self._bounds = BoundsProver(self._dims_bounds)
        # ids of vars whose stated type may not hold (see _misstated_slice);
        # None until the first shape is asked for.
        self._mistyped: set[int] | None = None
        for function in program.functions.values():
            self._index_inputs(function)

    def dim_source(self, dim) -> tuple[Var, int] | None:
        """(function input, axis) where the symbolic dim `dim` is the input's own, the
        first such in input order; None for a literal, a symbol no input has, or one
        the inputs of several functions have (which one a rule means is not known)."""
        sources = self.__dict__.get("_dim_sources")
        if sources is None:
            sources, seen_in = {}, {}
            for function in self.program.functions.values():
                for var in function.inputs.values():
                    for axis, d in enumerate(_shape_of_type(var.sym_type) or ()):
                        if isinstance(d, Symbol):
                            sources.setdefault(d, (var, axis))
                            seen_in.setdefault(d, set()).add(id(function))
            sources = {d: source for d, source in sources.items() if len(seen_in[d]) == 1}
            self._dim_sources = sources
        return sources.get(dim) if isinstance(dim, Symbol) else None

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
        return _input(op, name)

    def operand_names(self, op: Operation) -> Sequence[str]:
        return list(op.inputs)

    def operands(self, op: Operation) -> Sequence[Var]:
        flat = []
        for value in op._input_vars.values():  # what `op.inputs` holds, in its order
            if value is None or isinstance(value, InternalVar):
                continue
            if isinstance(value, (list, tuple)):
                flat.extend(value)
            else:
                flat.append(value)
        return flat

    def outputs(self, op: Operation) -> Sequence[Var]:
        return op.outputs

    def attribute(self, op: Operation, name: str):
        # MIL has no attributes apart from operands: a constant operand is one.
        value = _input(op, name)
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

    def uses_version(self, value: Var) -> int:
        """Changes whenever an op starts or stops using `value` (`Adapter.uses_version`):
        counted by this adapter's edits, the only ones made while a run decides."""
        entry = self._uses_versions.get(id(value))
        return 0 if entry is None else entry[1]

    def _uses_changed(self, values) -> None:
        versions = self._uses_versions
        for value in values:
            entry = versions.get(id(value))
            if entry is None:
                versions[id(value)] = [value, 1]
            else:
                entry[1] += 1

    def has_uses(self, value: Var) -> bool:
        # O(1): `consumers` de-duplicates every child op, and a value one
        # reduce_mean feeds to every layer has thousands of them.
        return bool(value.child_ops) or bool(value.consuming_blocks)

    def use_count(self, value: Var, limit: int | None = None) -> int:
        """How many distinct ops use `value`, counted no further than `limit`:
        `one_use` asks up to 2 of a value that may feed every layer."""
        children = value.child_ops
        if len(children) < 2:
            return len(children)
        seen: set[int] = set()
        for op in children:
            seen.add(id(op))
            if limit is not None and len(seen) >= limit:
                break
        return len(seen) if limit is None else min(len(seen), limit)

    def shape(self, value: Var):
        mistyped = self._mistyped if self._mistyped is not None else self._find_mistyped()
        if mistyped and id(value) in mistyped:
            return None
        inferred = _shape_of_type(value.sym_type)
        op = value.op
        if op is not None and op.op_type == "select" and inferred is not None:
            # coremltools types a select by a and b alone, but at run time
            # cond broadcasts too: where it widens the type, it is the shape.
            cond = _shape_of_type(_input(op, "cond").sym_type)
            if cond is None:
                return None
            try:
                widened = broadcast_shapes(cond, inferred)
            except IncompatibleShapes:
                return None
            if widened != inferred:
                return widened
        return inferred

    def stated_shape(self, value: Var):
        """The shape coremltools' own type gives `value`, which its passes and serializer go by
        (`shape` corrects the types coremltools is known to get wrong)."""
        return _shape_of_type(value.sym_type)

    def proven_shape(self, value: Var):
        inferred = self.shape(value)
        op = value.op
        if op is None or op.op_type not in mil_shapes.SHAPE_FOLLOWS:
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
            pending = [v for v in mil_shapes.shape_operands(value.op) if self._needs_proof(v)]
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
        if op is None or op.op_type not in mil_shapes.SHAPE_FOLLOWS:
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
        if kind in mil_shapes.UNARY_ELEMENTWISE:
            return self.proven_shape(op.inputs["x"])
        if kind in mil_shapes.BINARY_BROADCASTING or kind == "select":
            operands = mil_shapes.shape_operands(op)
            try:
                return broadcast_shapes(*(self.proven_shape(v) for v in operands))
            except IncompatibleShapes:
                return None
        if kind == "fill_like":
            return self.proven_shape(op.inputs["ref_tensor"])
        if kind in mil_shapes.LAYOUT:
            return self._layout_shape(op)
        if kind == "matmul":
            return self._matmul_shape(op)
        if kind in mil_shapes.SAME_SHAPE:
            return self.proven_shape(op.inputs["x"])
        if kind in mil_shapes.INDICES_SHAPE:
            return self.proven_shape(op.inputs["indices"])
        if kind in mil_shapes.FRONTEND_SHAPES:
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
            # Interleaving reorders the elements along the axis, not their count:
            # the shape is the same either way.
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
        if kind == "stack":
            # The values have one shape at run time (stack requires it), with
            # the new axis of their count put in: take the best-known spelling.
            parts = [self.proven_shape(v) for v in inputs["values"]]
            if not parts or any(part is None for part in parts) or len({len(part) for part in parts}) != 1:
                return None
            axis = inputs["axis"].val
            if axis is None:
                return None
            dims = [min((part[position] for part in parts), key=self._dim_rank) for position in range(len(parts[0]))]
            axis = int(axis) % (len(dims) + 1)
            return (*dims[:axis], len(parts), *dims[axis:])
        if kind == "gather_nd":
            # batch_dims 0: each index vector (the indices' last axis) picks a
            # slice of x's remaining axes, in the indices' leading shape.
            batch_dims = inputs.get("batch_dims")
            x, indices = self.proven_shape(inputs["x"]), self.proven_shape(inputs["indices"])
            if (batch_dims is not None and batch_dims.val) or x is None or not indices:
                return None
            depth = indices[-1]
            if not isinstance(depth, int) or depth > len(x):
                return None
            return (*indices[:-1], *x[depth:])
        if kind == "range_1d":
            start, end, step = (self.shape_value(inputs[name]) for name in ("start", "end", "step"))
            if start is None or end is None or step is None or len(start) != 1 or len(end) != 1:
                return None
            if start == [0] and step == [1] and end[0] is not UNKNOWN:
                if isinstance(end[0], int):
                    return (max(end[0], 0),)
                return (end[0],) if mil_shapes.never_negative(end[0]) else None
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
        if dim not in bounds and isinstance(dim, Symbol) and dim.name.startswith("@"):
            return self.__dict__.get("_value_symbol_bounds", {}).get(dim, (0, None))
        return bounds.get(dim, (0, None))

    def _dims_bounds(self, value: Var) -> list | None:
        """(lowest, highest or None) of each of `value`'s dims; None if its rank is unknown."""
        dims = self.proven_shape(value)
        if dims is None or any(d is UNKNOWN for d in dims):
            return None
        return [self._dim_bounds(d) for d in dims]

    def _at_most(self, small, large) -> bool:
        """small <= large at run time, provably."""
        if small == large and small is not UNKNOWN:
            return True
        if any(dims_add(small, k) == large for k in (1, 2)):
            return True  # an expression made by adding to `small` (a length and one more)
        upper = self._dim_bounds(small)[1]
        return upper is not None and upper <= self._dim_bounds(large)[0]

    # ---- types coremltools states that do not hold
    #
    # coremltools types a slice_by_index whose begin or end is a runtime value
    # as keeping a size-1 axis whole, whatever it takes of it: x[1:] of a
    # (1, n) tensor is stated (1, n) though it is (0, n) at run time, and every
    # type inferred from it downstream is as wrong. Such a var, and everything
    # computed from it, has no shape here (rank unknown): no rule and no guard
    # proof may lean on it. Programs that converters emit slice from the start
    # (x[:n]), which is typed right, so the set is almost always empty.

    def _find_mistyped(self) -> set[int]:
        self._mistyped = found = set()
        for function in self.program.functions.values():
            pending = [iter(function.operations)]
            while pending:  # nested blocks in order, without recursion
                op = next(pending[-1], None)
                if op is None:
                    pending.pop()
                    continue
                if self._taints(op) or (op.op_type == "slice_by_index" and self._misstated_slice(op)):
                    found.update(id(v) for v in op.outputs)
                if op.blocks:
                    pending.extend(iter(b.operations) for b in reversed(op.blocks))
        if found:  # a control-flow op whose blocks computed from one: its outputs too
            for function in self.program.functions.values():
                self._taint_control_flow(function)
        return found

    def _taints(self, op: Operation) -> bool:
        found = self._mistyped
        return bool(found) and any(id(v) in found for v in _vars_in(op.inputs.values()))

    def _taint_control_flow(self, block: Block) -> bool:
        found, tainted = self._mistyped, False
        for op in block.operations:
            inner = any(self._taint_control_flow(b) for b in op.blocks)
            if inner or any(id(v) in found for b in op.blocks for v in b.outputs):
                found.update(id(v) for v in op.outputs)
            tainted = tainted or any(id(v) in found for v in op.outputs)
        return tainted

    def _misstated_slice(self, op: Operation) -> bool:
        inputs = op.inputs
        if inputs["begin"].val is not None and inputs["end"].val is not None:
            return False  # coremltools computed it from the values
        source = _shape_of_type(inputs["x"].sym_type)
        stated = _shape_of_type(op.outputs[0].sym_type)
        if source is None or stated is None or 1 not in source:
            return False
        ours = self._sliced_shape(op)
        if ours is None or len(ours) != len(stated):
            return True
        return any(isinstance(s, int) and o != s for s, o in zip(stated, ours))

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
            elif start == 0 and mil_shapes.never_negative(stop) and self._at_most(stop, d):
                dims.append(stop)  # a prefix no longer than the axis
            elif start == 0 and d == 1 and self._dim_bounds(stop)[0] >= 1:
                dims.append(1)  # x[:n] of one element, n >= 1
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
        numerator = mil_shapes.factors(source)
        denominator = mil_shapes.factors([d for d in shape if d != -1])
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
            if len(inserted) != len(axes):
                return None  # an axis given twice: not followed
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
        if value.dtype not in mil_shapes.SHAPE_DTYPES or value.rank > 1:
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
            if kind == "cast" and inputs["dtype"].val not in mil_shapes.SHAPE_DTYPE_NAMES:
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
        if kind in mil_shapes.SHAPE_ARITHMETIC:
            left, right = self.shape_value(inputs["x"]), self.shape_value(inputs["y"])
            if kind == "sub" and left is not None and right is not None and len(left) == len(right):
                # a dim less itself is 0 (HF's past length: the sequence read twice, subtracted)
                return [0 if a == b and a is not UNKNOWN else dims_subtract(a, b) for a, b in zip(left, right)]
            return shape_values.elementwise(mil_shapes.SHAPE_ARITHMETIC[kind], left, right)
        if kind == "real_div":
            return self._divided(self.shape_value(inputs["x"]), self.shape_value(inputs["y"]))
        if kind == "select":
            # torch's expand(-1): where(equal(size, -1), shape(x), size)
            return shape_values.chosen(
                self._shape_condition(inputs["cond"]), self.shape_value(inputs["a"]), self.shape_value(inputs["b"])
            )
        return self._value_symbol(value)

    def _value_symbol(self, value: Var) -> list | None:
        """A scalar int that shape arithmetic does not follow (a minimum, say), proved
        non-negative, as a symbol of its own: [@n]. It stands for the value at run time,
        as a size symbol stands for a size, so that a range to n and a slice to n are
        proved to have one length; its bounds are the value's (`_dim_bounds`)."""
        if value.rank != 0 or value.dtype not in mil_shapes.SHAPE_DTYPES:
            return None
        low, high = self._bounds.bounds(value)
        if low is None or low < 0:
            return None
        symbols = self.__dict__.setdefault("_value_symbols", {})
        found = symbols.get(id(value))
        if found is None or found[0] is not value:
            # Named by a count of every symbol made, so that no two values share one
            # (an id reused by a new value gets a new name).
            bounds = self.__dict__.setdefault("_value_symbol_bounds", {})
            found = symbols[id(value)] = (value, Symbol(f"@{len(bounds)}"))
            bounds[found[1]] = (low, high)
        return [found[1]]

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
            elif b == 1 and isinstance(b, int) and a is not UNKNOWN:
                quotients.append(a)  # a dim by 1 (a batch repeated: `expand(B, -1, -1)` of a (1, ...) token)
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
        return _dtype_of_type(value.sym_type)

    def broadcast_operands(self, op: Operation) -> list[Var] | None:
        """The operands an elementwise op (or select) broadcasts together into its output."""
        kind = op.op_type
        if kind in mil_shapes.BINARY_BROADCASTING:
            return [_input(op, "x"), _input(op, "y")]
        if kind == "select":
            return [_input(op, "cond"), _input(op, "a"), _input(op, "b")]
        return None

    def output_types_with(self, op: Operation, old: Var, new: Var):
        """The (dtype, dims) of `op`'s outputs were `old` replaced by `new`, by the op's own
        type inference; None if it cannot say. The op is left as it was."""
        if op.blocks:
            # Control flow types its outputs by its blocks, which a new operand does not retype here.
            raise TypesUnknown(f"'{op.op_type}' types its outputs by its blocks, which this does not infer again")
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
        except Exception as error:  # the op rejects the new operand
            raise OperandRejected(str(error).strip().splitlines()[0] if str(error).strip() else "") from None
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

    def value_bounds(self, value: Var) -> tuple[int | None, int | None]:
        """The least and greatest element an integer or bool value can hold (see `bounds`)."""
        return self._bounds.bounds(value)

    # Ops whose every output element is an element of `x`: of a uniform x, uniform.
    _PICKING_OPS = frozenset({
        "slice_by_index", "slice_by_size", "reshape", "expand_dims", "squeeze", "transpose", "tile", "identity",
        "gather", "gather_along_axis", "reverse",
    })

    def fill_value(self, value: Var) -> float | None:
        """The one number every element of `value` holds, for a `fill`/`fill_like`
        of a constant scalar, or a slice, gather, reshape, ... of a value
        uniform so (a constant's elements all equal included)."""
        op = value.op
        for _ in range(64):  # a chain of picks is short; a long one is not worth following
            if op is None or op.op_type not in self._PICKING_OPS:
                break
            source = op.inputs["x"]
            if source.val is not None:
                flat = np.asarray(source.val).reshape(-1)
                if flat.size == 0 or flat.dtype.kind not in "biuf" or not (flat == flat[0]).all():
                    return None
                return flat[0].item() if flat.dtype.kind != "b" else int(flat[0])
            op = source.op
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
            if not narrow and not mil_shapes.provably_same_shape(self.proven_shape(factor), self.proven_shape(scaled)):
                return None
            return float(flat[0])
        filled = self.fill_value(factor)
        if filled is None or not mil_shapes.provably_same_shape(self.proven_shape(factor), self.proven_shape(scaled)):
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
        arguments = {k: mil_shapes.as_mil_constant(v) for k, v in operands.items() if v is not None}
        previous = _op_before(block, before)
        # What a builder that fails its own type checks leaves behind: the ops
        # it read as a consumer of their outputs, and consts it inserted.
        # (Their lengths, not copies: a value may feed every layer.)
        readers = {id(v): (v, len(v._child_ops)) for v in _vars_in(arguments.values())}
        self._uses_changed(var for var, _ in readers.values())
        try:
            with _in_block(block):
                result = builder(**arguments, before_op=before, name=self._unique_name(name))
        except Exception:
            # coremltools inserts an op before its type checks run: a failed
            # one sits in the block without outputs, which remove_ops needs.
            stranded = _ops_between(block, previous, before)
            for op in stranded:
                if op.outputs is None:
                    op._output_vars = []
            block.remove_ops(stranded)
            for var, length in readers.values():
                truncate_uses(var, length)
            raise
        # The new op and the consts the builder made for its constant operands
        # stand for `before`, the op the rule matched: they carry its scopes.
        _inherit_scopes(_ops_between(block, previous, before), before, _rule_of(name))
        if self._mistyped and any(id(v) in self._mistyped for v in _vars_in(arguments.values())):
            self._mistyped.update(id(v) for v in (result if isinstance(result, (list, tuple)) else (result,)))
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
        self._uses_changed((old, new))
        block = self.defining_block(old)
        # A function output is one of its function's consuming blocks: asked of
        # the value, not by listing every output of a model that has thousands.
        is_function_output = any(isinstance(b, Function) for b in old.consuming_blocks)
        if is_function_output:
            function_outputs = {id(v) for f in self.program.functions.values() for v in f.outputs}
            function_inputs = {id(v) for f in self.program.functions.values() for v in f.inputs.values()}
            if id(new) in function_inputs or id(new) in function_outputs:
                # A function output must keep its own name, and an input's or
                # another output's name cannot be given away: bridge with identity.
                previous = _op_before(block, old.op)
                with _in_block(block):
                    new = mb.identity(x=new, before_op=old.op, name=old.name + "_bridge")
                self._uses_changed((new,))
                _inherit_scopes(_ops_between(block, previous, old.op), old.op, None)
        consumers = self.consumers(old)
        anchor = old.op
        stated_apart = old.sym_type != new.sym_type
        renamed = stated_apart and _symbols_renamed(old, new)
        if not replace_uses_in_block(block, old, new, consumers, self._accepted_inputs):
            # coremltools drops the uses one by one; the direct path empties the list at once.
            self._use_lists.prepare(old)
            block.replace_uses_of_var_after_op(
                anchor_op=anchor, old_var=old, new_var=new, no_check_var_types=True
            )
        if is_function_output:
            # coremltools gave `new` the output's name; the old var must not keep it too.
            old.name = old.name + "_replaced"
        if self.check_types:
            self._check_consumers(consumers)
        elif stated_apart:
            self._refresh_consumers(consumers, renamed)

    def _refresh_consumers(self, consumers: Sequence[Operation], renamed: bool) -> None:
        # The guard proved the consumers' outputs unchanged, but coremltools
        # still states the types it inferred from the old operand: a fresh
        # symbol (`is125`) where the new one has the query's `is0`, or a
        # select typed by a scalar branch now widened. Ops built later from
        # those types (an SDPA whose mask's length is is0 and key's is125)
        # would be refused, so the consumers take their types anew, as checked
        # mode has them do. An elementwise op that broadcast the old operand
        # to its output (a bypassed tile: 8 becomes 1 against the other
        # operand's 8) states its output rightly already, and re-typing it
        # would only mint a fresh symbol per fire: it is left, unless the
        # change is a renaming of symbols. One level: the consumers' own
        # consumers' stated types were consistent and stay so up to names.
        for op in consumers:
            if op.enclosing_block is None or (not renamed and op.op_type in mil_shapes.BINARY_BROADCASTING):
                continue
            try:
                with _in_block(op.enclosing_block), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    op.type_value_inference(overwrite_output=True)
            except Exception:  # the stale type stays, as coremltools' own passes leave theirs
                pass

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
                if old_dtype != new_dtype or not mil_shapes.same_known_dims(old_shape, new_shape):
                    raise TypeChangedError(
                        f"op '{op.name}' output '{var.name}' changed from "
                        f"{mil_shapes.describe_type(old_dtype, old_shape)} to "
                        f"{mil_shapes.describe_type(new_dtype, new_shape)}"
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
        self._uses_changed((old, new))
        self._use_lists.prepare(old)
        with _in_block(op.enclosing_block):
            # The new operand differs in type on purpose (it is wider); the op's
            # own output must not change, which checked mode verifies.
            op.set_inputs(no_check_var_types=True, type_inference=False, **changed)
        if self.check_types:
            self._check_consumers([op])
        elif old.sym_type != new.sym_type:
            self._refresh_consumers([op], _symbols_renamed(old, new))

    def remove_op(self, op: Operation) -> None:
        # Ops of its nested blocks go too, and may read an outer value of many uses.
        prepare = self._use_lists.prepare
        pending = [op]
        while pending:
            removed = pending.pop()
            operands = self.operands(removed)
            self._uses_changed(operands)
            for value in operands:
                if len(value._child_ops) >= MANY_USES:  # the one test most operands need
                    prepare(value, removed)
            for block in removed.blocks:
                pending.extend(block.operations)
        op.enclosing_block.remove_ops([op])

    def count_ops(self) -> int:
        return count_ops(self.program)

    def finish(self) -> None:
        self._use_lists.restore()
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


def _vars_in(values) -> list[Var]:
    """The vars among build operands (a tuple operand's items included)."""
    found = []
    for value in values:
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, Var):
                found.append(item)
    return found


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
