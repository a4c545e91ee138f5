"""The Core ML MIL backend's adapter: coremltools `Program`s as the engine sees them.

`MilAdapter` maps the engine's view onto pymil: ops are `Operation`s, values
are `Var`s, blocks are `Block`s (a `Function` is the outermost block). This
module is the navigation and the questions about values; what is proved of
shapes beyond coremltools' types is `shape_proofs`, and the edits are
`editing` (a base class of the adapter), which go through coremltools' own
block API, so the result is a normal pymil program that validates and
serialises as any other.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from rewrite.backends import pass_groups
from rewrite.backends.mil import shapes as mil_shapes
from rewrite.backends.mil.editing import MilEditing
from rewrite.backends.mil.pymil import (
    Block,
    Function,
    InternalVar,
    Operation,
    Program,
    SSAOpRegistry,
    TupleInputType,
    Var,
    count_ops,
    types,
)
from rewrite.backends.mil.shape_proofs import ShapeProofs
from rewrite.backends.mil.uses import UseLists
from rewrite.backends.mil.vars import dtype_of_type, input_of, shape_of_type
from rewrite.engine.interfaces import (
    Capability,
    OperandRejected,
    TypesUnknown,
    follow_unknown_dim,
)
from rewrite.language.logic import Symbol
from rewrite.language.schema import InputSpec, OpSignature

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


class MilAdapter(MilEditing):
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
        for function in program.functions.values():
            self._index_inputs(function)
        self._proofs = ShapeProofs(program, self._input_symbols)

    def _index_inputs(self, block: Block) -> None:
        inputs = block.inputs.values() if isinstance(block, Function) else block.inputs
        for var in inputs:
            self._input_blocks[id(var)] = block
            shape = shape_of_type(var.sym_type) or ()
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
        return input_of(op, name)

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
        value = input_of(op, name)
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
        return self._proofs.shape(value)

    def stated_shape(self, value: Var):
        """The shape coremltools' own type gives `value`, which its passes and serializer go by
        (`shape` corrects the types coremltools is known to get wrong)."""
        return shape_of_type(value.sym_type)

    def proven_shape(self, value: Var):
        """`shape`, with what the program's shape arithmetic proves (`ShapeProofs.proven_shape`)."""
        return self._proofs.proven_shape(value)

    def shape_value(self, value: Var) -> list | None:
        """The elements of a rank-0 or rank-1 int tensor as dims, or None."""
        return self._proofs.shape_value(value)

    def dim_source(self, dim) -> tuple[Var, int] | None:
        """(function input, axis) that the symbolic dim `dim` is the dim of (`ShapeProofs.dim_source`)."""
        return self._proofs.dim_source(dim)

    def value_bounds(self, value: Var) -> tuple[int | None, int | None]:
        """The least and greatest element an integer or bool value can hold (see `bounds`)."""
        return self._proofs.value_bounds(value)

    def dtype(self, value: Var) -> str | None:
        return dtype_of_type(value.sym_type)

    def broadcast_operands(self, op: Operation) -> list[Var] | None:
        """The operands an elementwise op (or select) broadcasts together into its output."""
        kind = op.op_type
        if kind in mil_shapes.BINARY_BROADCASTING:
            return [input_of(op, "x"), input_of(op, "y")]
        if kind == "select":
            return [input_of(op, "cond"), input_of(op, "a"), input_of(op, "b")]
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
            result.append((dtype, shape_of_type(sym_type)))
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

    def count_ops(self) -> int:
        return count_ops(self.program)

    def unknown_dim_origin(self, value: Var, axis: int) -> Operation | None:
        """The op whose type inference lost dim `axis` of `value` (`Adapter.unknown_dim_origin`).

        Walked through the broadcasting ops' aligned dims, else through any
        operand with an unknown dim or rank.
        """
        return follow_unknown_dim(self, value, axis)
