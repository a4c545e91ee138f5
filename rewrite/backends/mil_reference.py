"""A reference evaluator for MIL programs that runs anywhere coremltools imports.

Core ML cannot run a model off macOS, but coremltools computes the value of
every op whose inputs are all constant. So: replace each function input with
a const of a concrete array, re-run type and value inference over the ops in
order (nested blocks first), and read the outputs. Tests and `verify` use it
to compare a program before and after a rewrite.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import numpy as np

from rewrite.backends.mil import Block, Operation, Program, mb, types


class EvaluationError(RuntimeError):
    """Some output could not be computed (an op without value inference)."""


def evaluate(program: Program, inputs: Mapping[str, np.ndarray], function: str = "main") -> dict[str, np.ndarray]:
    """The outputs of `function` for concrete `inputs`, by name. `program` is not modified."""
    program = copy.deepcopy(program)
    block = program.functions[function]
    operations = list(block.operations)
    first = operations[0] if operations else None
    with block:
        for name, var in list(block.inputs.items()):
            array = np.asarray(inputs[name], dtype=types.nptype_from_builtin(var.dtype))
            const = mb.const(val=array, before_op=first, name=name + "__value")
            block.replace_uses_of_var_after_op(anchor_op=None, old_var=var, new_var=const, no_check_var_types=True)
        _infer_block(block)
    outputs = {}
    for var in block.outputs:
        if var.val is None:
            producer = var.op.op_type if var.op is not None else "input"
            raise EvaluationError(f"no value for output '{var.name}' (from a {producer} op)")
        outputs[var.name] = np.asarray(var.val)
    return outputs


def _infer_block(block: Block) -> None:
    for op in block.operations:
        _infer_op(op)


def _plain_bool(var) -> None:
    # Programs read back from an .mlpackage hold scalar bools as numpy.bool_,
    # which coremltools' reduce kernels pass to numpy >= 2 as `keepdims=`,
    # where numpy rejects it. A Python bool means the same and is accepted.
    if types.is_scalar(var.sym_type) and var.dtype == types.bool and var.val is not None:
        var._sym_val.val = bool(var.val)


def _set_value(var, value) -> None:
    value = np.asarray(value, dtype=types.nptype_from_builtin(var.dtype))
    if types.is_tensor(var.sym_type):
        var._sym_type = types.tensor(var.dtype, value.shape)
        var._sym_val = var._sym_type()
        var._sym_val.val = value
    else:
        var._sym_val = var.sym_type()
        var._sym_val.val = value[()]


def _infer_op(op: Operation) -> None:
    if op.op_type == "const":
        _plain_bool(op.outputs[0])
        return
    if op.op_type == "while_loop":
        condition_block, body_block = op.blocks
        values = [v.val for v in op.inputs["loop_vars"]]
        for _ in range(1_000_000):
            for var, value in zip(condition_block.inputs, values):
                _set_value(var, value)
            _infer_block(condition_block)
            if not bool(condition_block.outputs[0].val):
                break
            for var, value in zip(body_block.inputs, values):
                _set_value(var, value)
            _infer_block(body_block)
            values = [np.array(o.val) for o in body_block.outputs]
        for var, value in zip(op.outputs, values):
            _set_value(var, value)
        return
    if op.op_type == "cond":
        taken = 0 if bool(op.pred.val) else 1
        _infer_block(op.blocks[taken])
        try:
            # The branch not taken may be ill-defined for these inputs; its
            # values are never read.
            _infer_block(op.blocks[1 - taken])
        except Exception:
            pass
        for var, output in zip(op.outputs, op.blocks[taken].outputs):
            _set_value(var, output.val)
        return
    for nested in op.blocks:
        _infer_block(nested)
    op.type_value_inference(overwrite_output=True)
