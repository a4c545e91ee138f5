"""coremltools, imported once and quietly, and the pymil names the MIL backend uses."""

from __future__ import annotations

import logging

from rewrite.engine.interfaces import ModelError


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

# The pymil names the backend's modules share (re-exported: see __all__).
from coremltools.converters.mil import Builder as mb  # noqa: E402
from coremltools.converters.mil.mil import Block, Function, InternalVar, Operation, Program, Var, types  # noqa: E402
from coremltools.converters.mil.mil import block as block_module  # noqa: E402
from coremltools.converters.mil.mil.input_type import TensorInputType, TupleInputType  # noqa: E402
from coremltools.converters.mil.mil.ops.registry import SSAOpRegistry  # noqa: E402
from coremltools.converters.mil.mil.types.symbolic import is_symbolic  # noqa: E402

__all__ = [
    "Block", "Function", "InternalVar", "MilError", "Operation", "Program", "SSAOpRegistry", "TensorInputType",
    "TupleInputType", "Var",
    "block_module", "count_ops", "ct", "is_symbolic", "mb", "types",
]


class MilError(ModelError):
    """A MIL program or model file could not be read or written; the message names the file."""


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
