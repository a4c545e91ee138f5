"""What a pymil `Var` holds, in the engine's terms: its dims, its dtype, an op's operands.

Shared by the adapter's navigation, its shape proofs and its editing, each
of which reads types and operands at every op it looks at: the conversions
here are cached per (immutable, shared) coremltools type.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import sympy

from rewrite.backends.mil.pymil import InternalVar, Operation, Var, is_symbolic, types
from rewrite.language.logic import UNKNOWN, Symbol


def engine_dim(dim) -> Any:
    """One dim of a coremltools shape as the engine's dim: an int, a `Symbol` or `UNKNOWN`."""
    if isinstance(dim, (int, np.integer)):
        return UNKNOWN if dim < 0 else int(dim)
    if isinstance(dim, sympy.Symbol):
        return Symbol(dim.name)  # str() would run sympy's printer: ~150 µs a call
    if is_symbolic(dim):
        return Symbol(_expression_name(dim))
    return UNKNOWN


@functools.lru_cache(maxsize=65536)
def shape_of_type(sym_type):
    """The dims of a coremltools type: a tuple for a tensor, () for a scalar, None for anything else."""
    # Type classes are immutable and shared, and types.is_tensor is slow
    # (it builds a type-info record each call): convert each type once.
    if types.is_tensor(sym_type):
        return tuple(engine_dim(d) for d in sym_type.get_shape())
    if types.is_scalar(sym_type):
        return ()
    return None


@functools.lru_cache(maxsize=65536)
def dtype_of_type(sym_type) -> str | None:
    """The element dtype's name of a coremltools type (a state's wrapped one); None for a list."""
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


@functools.lru_cache(maxsize=4096)
def _expression_name(expression) -> str:
    return str(expression)


def input_of(op: Operation, name: str) -> Var | tuple | None:
    """`op.inputs.get(name)`, without the dict `Operation.inputs` builds at every read:
    the engine reads an operand or two of every op it matches."""
    value = op._input_vars.get(name)
    return None if value is None or isinstance(value, InternalVar) else value


def vars_in(values) -> list[Var]:
    """The vars among build operands (a tuple operand's items included)."""
    found = []
    for value in values:
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, Var):
                found.append(item)
    return found


def symbols_renamed(old: Var, new: Var) -> bool:
    """The two types differ only in the names of symbolic dims (same dtype, rank and literals):
    what coremltools' fresh symbols make of one size, `is125` where the query has `is0`."""
    if old.sym_type == new.sym_type or dtype_of_type(old.sym_type) != dtype_of_type(new.sym_type):
        return False
    a, b = shape_of_type(old.sym_type), shape_of_type(new.sym_type)
    if a is None or b is None or len(a) != len(b):
        return False
    return all(x == y or (not isinstance(x, int) and not isinstance(y, int)) for x, y in zip(a, b))
