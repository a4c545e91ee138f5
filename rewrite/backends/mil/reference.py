"""A reference evaluator for MIL programs that runs anywhere coremltools imports.

Core ML cannot run a model off macOS, but coremltools computes the value of
every op whose inputs are all constant. So: replace each function input with
a const of a concrete array, re-run type and value inference over the ops in
order (nested blocks first), and read the outputs. Tests and `verify` use it
to compare a program before and after a rewrite.

Some ops coremltools has no value inference for (`silu`, `conv`, `gather_nd`,
the pooling and normalization ops a converted torch model uses, ...); for
those, `KERNELS` holds numpy implementations, keyed by op type, used only
where coremltools leaves an output without a value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

from rewrite.backends.mil.copying import copy_program
from rewrite.backends.mil.pymil import Block, Operation, Program, Var, mb, types


class EvaluationError(RuntimeError):
    """Some output could not be computed (an op without value inference)."""


def evaluate(program: Program, inputs: Mapping[str, np.ndarray], function: str = "main") -> dict[str, np.ndarray]:
    """The outputs of `function` for concrete `inputs`, by name. `program` is not modified.

    A state input's entry in `inputs` is its value when the run starts.
    """
    return evaluate_with_states(program, inputs, function)[0]


def evaluate_with_states(
    program: Program, inputs: Mapping[str, np.ndarray], function: str = "main"
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """`evaluate`'s outputs, and each state input's value when the run ends, by name."""
    program = copy_program(program)
    block = program.functions[function]
    operations = list(block.operations)
    first = operations[0] if operations else None
    states: dict[Var, np.ndarray] = {}
    with block:
        for name, var in list(block.inputs.items()):
            if types.is_state(var.sym_type):
                # A state is no value an op can take: read_state and
                # coreml_update_state read and set it as the run goes.
                states[var] = np.asarray(inputs[name], dtype=types.nptype_from_builtin(var.dtype))
                continue
            array = np.asarray(inputs[name], dtype=types.nptype_from_builtin(var.dtype))
            const = mb.const(val=array, before_op=first, name=name + "__value")
            block.replace_uses_of_var_after_op(anchor_op=None, old_var=var, new_var=const, no_check_var_types=True)
        _infer_block(block, states)
    outputs = {}
    for var in block.outputs:
        if var.val is None:
            producer = var.op.op_type if var.op is not None else "input"
            raise EvaluationError(f"no value for output '{var.name}' (from a {producer} op)")
        outputs[var.name] = np.asarray(var.val)
    return outputs, {var.name: value for var, value in states.items()}


def _infer_block(block: Block, states: dict) -> None:
    for op in block.operations:
        _infer_op(op, states)


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


def _infer_op(op: Operation, states: dict) -> None:
    if op.op_type == "const":
        _plain_bool(op.outputs[0])
        return
    if op.op_type == "read_state":
        _set_value(op.outputs[0], states[op.input])
        return
    if op.op_type == "coreml_update_state":
        if op.value.val is None:
            return  # the value is unknown: so is the state's, and an output read later says so
        states[op.state] = np.array(op.value.val, dtype=types.nptype_from_builtin(op.state.dtype))
        _set_value(op.outputs[0], states[op.state])
        return
    if op.op_type == "while_loop":
        condition_block, body_block = op.blocks
        values = [v.val for v in op.inputs["loop_vars"]]
        for _ in range(1_000_000):
            for var, value in zip(condition_block.inputs, values):
                _set_value(var, value)
            _infer_block(condition_block, states)
            if not bool(condition_block.outputs[0].val):
                break
            for var, value in zip(body_block.inputs, values):
                _set_value(var, value)
            _infer_block(body_block, states)
            values = [np.array(o.val) for o in body_block.outputs]
        for var, value in zip(op.outputs, values):
            _set_value(var, value)
        return
    if op.op_type == "cond":
        taken = 0 if bool(op.pred.val) else 1
        _infer_block(op.blocks[taken], states)
        try:
            # The branch not taken may be ill-defined for these inputs; its
            # values are never read, and the states it would update are not.
            _infer_block(op.blocks[1 - taken], dict(states))
        except Exception:
            pass
        for var, output in zip(op.outputs, op.blocks[taken].outputs):
            _set_value(var, output.val)
        return
    for nested in op.blocks:
        _infer_block(nested, states)
    op.type_value_inference(overwrite_output=True)
    compute = KERNELS.get(op.op_type)
    if op.op_type in IN_OWN_DTYPE and _inputs_known(op):
        _set_value(op.outputs[0], IN_OWN_DTYPE[op.op_type](op))
    elif compute is not None and any(v.val is None for v in op.outputs) and _inputs_known(op):
        values = compute(op)
        for var, value in zip(op.outputs, values if isinstance(values, tuple) else (values,)):
            _set_value(var, value)


def _inputs_known(op: Operation) -> bool:
    return all(v.val is not None for v in op.get_flattened_inputs())


# ---------------------------------------------------------------- numpy kernels
#
# Each takes an op whose inputs all have values and returns its output value
# (a tuple for several outputs), computed as the MIL op specification says.
# Floats are computed in float64 and rounded once, to the output's dtype, by
# `_set_value`: a reference should be at least as exact as the runtime.

KERNELS: dict[str, Callable[[Operation], object]] = {}


def kernel(*op_types: str):
    """Register a numpy implementation for `op_types` in `KERNELS`."""

    def register(function):
        for op_type in op_types:
            KERNELS[op_type] = function
        return function

    return register


# Fused ops evaluated step by step in their own dtype, as coremltools
# decomposes them for targets without the op, instead of by coremltools'
# value inference (which promotes to float64 on the way). A rule that fuses
# the steps is then compared like with like: the fused op rounds where the
# ops it replaced did. In float64, an ill-conditioned sum (scores plus a
# mask of +30000) differed from the fp32 steps by 3e-4, which `verify`
# reported as a changed value.
IN_OWN_DTYPE: dict[str, Callable[[Operation], object]] = {}


def _attention_in_own_dtype(op: Operation):
    query, key, value = (np.asarray(op.inputs[name].val) for name in ("query", "key", "value"))
    kind = query.dtype.type
    scores = np.matmul(query * kind(1.0 / math.sqrt(query.shape[-1])), np.swapaxes(key, -2, -1)).astype(kind)
    mask = op.inputs.get("attn_mask")
    if mask is not None:
        mask = np.asarray(mask.val)
        scores = scores + (np.where(mask, kind(0), kind(-np.inf)) if mask.dtype == bool else mask.astype(kind))
    with np.errstate(invalid="ignore", over="ignore"):
        shifted = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights = (shifted / shifted.sum(axis=-1, keepdims=True)).astype(kind)
    return np.matmul(weights, value).astype(kind)


IN_OWN_DTYPE["scaled_dot_product_attention"] = _attention_in_own_dtype


def _input(op: Operation, name: str, default=None):
    """The value of `op`'s input `name`: given, else the op's declared default, else `default`."""
    var = op.inputs.get(name)
    if var is not None:
        return var.val
    defaults = dict(op.default_inputs().items())
    return defaults.get(name, default)


def _float(value) -> np.ndarray:
    array = np.asarray(value)
    return array.astype(np.float64) if array.dtype.kind == "f" else array


@kernel("silu")
def _silu(op):
    x = _float(_input(op, "x"))
    return x / (1.0 + np.exp(-x))


def _spatial_padding(op, sizes, kernel_sizes, strides, dilations) -> list[tuple[int, int]]:
    """(before, after) padding of each spatial axis by `pad_type` (conv and pooling alike)."""
    pad_type = str(_input(op, "pad_type", "valid"))
    if pad_type == "valid":
        return [(0, 0)] * len(sizes)
    if pad_type == "custom":
        pad = [int(p) for p in np.asarray(_input(op, "pad")).reshape(-1)]
        return [(pad[2 * i], pad[2 * i + 1]) for i in range(len(sizes))]
    padding = []
    for size, k, stride, dilation in zip(sizes, kernel_sizes, strides, dilations):
        effective = (k - 1) * dilation + 1
        total = max((math.ceil(size / stride) - 1) * stride + effective - size, 0)
        small, large = total // 2, total - total // 2
        # "same" puts the odd row at the end, "same_lower" at the start, as
        # coremltools' neuralnetwork backend maps them (BOTTOM_RIGHT_HEAVY,
        # TOP_LEFT_HEAVY) and ONNX's SAME_UPPER/SAME_LOWER do.
        padding.append((small, large) if pad_type == "same" else (large, small))
    return padding


def _windows(x: np.ndarray, kernel_sizes, strides, dilations, out_sizes) -> np.ndarray:
    """x (N, C, *D) -> (N, C, *out, *K): each output position's input window."""
    view = x
    for axis, (k, stride, dilation, out) in enumerate(zip(kernel_sizes, strides, dilations, out_sizes)):
        # Each spatial axis becomes its output positions, and its taps are
        # appended last: after all of them, (N, C, *out, *K).
        taps = [np.take(view, np.arange(out) * stride + tap * dilation, axis=axis + 2) for tap in range(k)]
        view = np.stack(taps, axis=-1)
    return view


def _output_sizes(op) -> tuple[int, ...]:
    # Type inference has already run on concrete inputs: the output shape is known.
    return tuple(int(d) for d in op.outputs[0].shape[2:])


@kernel("conv")
def _conv(op):
    x, weight = _float(_input(op, "x")), _float(_input(op, "weight"))
    spatial = x.ndim - 2
    strides = [int(s) for s in np.asarray(_input(op, "strides", [1] * spatial)).reshape(-1)]
    dilations = [int(d) for d in np.asarray(_input(op, "dilations", [1] * spatial)).reshape(-1)]
    groups = int(_input(op, "groups", 1))
    kernel_sizes = weight.shape[2:]
    padding = _spatial_padding(op, x.shape[2:], kernel_sizes, strides, dilations)
    padded = np.pad(x, [(0, 0), (0, 0), *padding])
    windows = _windows(padded, kernel_sizes, strides, dilations, _output_sizes(op))
    # (N, G, C_in/G, *out, *K) against (G, C_out/G, C_in/G, *K).
    n, c_in = x.shape[:2]
    c_out = weight.shape[0]
    windows = windows.reshape(n, groups, c_in // groups, *windows.shape[2:])
    weight = weight.reshape(groups, c_out // groups, *weight.shape[1:])
    letters = "defghijk"[:spatial]
    kernel_letters = "pqrstuvw"[:spatial]
    result = np.einsum(
        f"ngc{letters}{kernel_letters},gmc{kernel_letters}->ngm{letters}", windows, weight, optimize=True
    ).reshape(n, c_out, *windows.shape[3:3 + spatial])
    bias = _input(op, "bias")
    if bias is not None:
        result = result + _float(bias).reshape((1, c_out) + (1,) * spatial)
    return result


def _pool(op, fill: float):
    x = _float(_input(op, "x"))
    spatial = x.ndim - 2
    kernel_sizes = [int(k) for k in np.asarray(_input(op, "kernel_sizes")).reshape(-1)]
    strides = [int(s) for s in np.asarray(_input(op, "strides", [1] * spatial)).reshape(-1)]
    dilations = [1] * spatial
    out_sizes = _output_sizes(op)
    padding = _spatial_padding(op, x.shape[2:], kernel_sizes, strides, dilations)
    # ceil_mode may need windows past the padded end: pad that far too, with
    # cells that count for nothing.
    padding = [
        (before, max(after, (out - 1) * stride + k - size - before))
        for (before, after), out, stride, k, size in zip(padding, out_sizes, strides, kernel_sizes, x.shape[2:])
    ]
    inside = np.pad(np.ones(x.shape[2:]), padding)
    padded = np.pad(x, [(0, 0), (0, 0), *padding], constant_values=fill)
    windows = _windows(padded, kernel_sizes, strides, dilations, out_sizes)
    mask = _windows(inside[None, None], kernel_sizes, strides, dilations, out_sizes)
    return windows, mask, spatial


@kernel("max_pool")
def _max_pool(op):
    windows, _, spatial = _pool(op, -np.inf)
    return windows.max(axis=tuple(range(-spatial, 0)))


@kernel("avg_pool")
def _avg_pool(op):
    windows, mask, spatial = _pool(op, 0.0)
    axes = tuple(range(-spatial, 0))
    total = windows.sum(axis=axes)
    if bool(_input(op, "exclude_padding_from_average", False)):
        return total / mask.sum(axis=axes)
    # Padding counts, but not the cells ceil_mode reads past it (as in torch).
    return total / np.prod(windows.shape[-spatial:])


@kernel("batch_norm")
def _batch_norm(op):
    x = _float(_input(op, "x"))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    mean, variance = _float(_input(op, "mean")).reshape(shape), _float(_input(op, "variance")).reshape(shape)
    gamma, beta = _input(op, "gamma"), _input(op, "beta")
    result = (x - mean) / np.sqrt(variance + float(_input(op, "epsilon", 1e-5)))
    return _per_channel_affine(result, gamma, beta)


@kernel("instance_norm")
def _instance_norm(op):
    x = _float(_input(op, "x"))
    axes = tuple(range(2, x.ndim))
    centered = x - x.mean(axis=axes, keepdims=True)
    result = centered / np.sqrt((centered**2).mean(axis=axes, keepdims=True) + float(_input(op, "epsilon", 1e-5)))
    return _per_channel_affine(result, _input(op, "gamma"), _input(op, "beta"))


def _per_channel_affine(result, gamma, beta):
    """result·gamma + beta, each optional, one value per channel (axis 1)."""
    shape = (1, -1) + (1,) * (result.ndim - 2)
    if gamma is not None:
        result = result * _float(gamma).reshape(shape)
    if beta is not None:
        result = result + _float(beta).reshape(shape)
    return result


@kernel("gather_nd")
def _gather_nd(op):
    x, indices = np.asarray(_input(op, "x")), np.asarray(_input(op, "indices")).astype(np.int64)
    batch_dims = int(_input(op, "batch_dims", 0))
    depth = indices.shape[-1]
    batch_shape = x.shape[:batch_dims]
    batch = int(np.prod(batch_shape, dtype=np.int64))
    flat_x = x.reshape((batch,) + x.shape[batch_dims:])
    flat_indices = indices.reshape((batch, -1, depth))
    # Negative indices count from the end, as numpy reads them.
    gathered = np.stack([flat_x[b][tuple(flat_indices[b].T)] for b in range(batch)])
    return gathered.reshape(batch_shape + indices.shape[batch_dims:-1] + x.shape[batch_dims + depth:])


@kernel("one_hot")
def _one_hot(op):
    indices = np.asarray(_input(op, "indices")).astype(np.int64)
    depth = int(_input(op, "one_hot_vector_size"))
    axis = int(_input(op, "axis", -1))
    on, off = _input(op, "on_value", 1), _input(op, "off_value", 0)
    hot = np.arange(depth) == indices[..., None]
    result = np.where(hot, on, off)
    return np.moveaxis(result, -1, axis if axis >= 0 else axis + result.ndim)


@kernel("upsample_nearest_neighbor")
def _upsample_nearest_neighbor(op):
    x = np.asarray(_input(op, "x"))
    height, width = op.outputs[0].shape[-2:]
    rows = np.floor(np.arange(height) * x.shape[-2] / height).astype(np.int64)
    columns = np.floor(np.arange(width) * x.shape[-1] / width).astype(np.int64)
    return x[..., rows, :][..., columns]


@kernel("pixel_shuffle")
def _pixel_shuffle(op):
    x = np.asarray(_input(op, "x"))
    factor = int(_input(op, "upscale_factor"))
    n, c, h, w = x.shape
    channels = c // (factor * factor)
    return (
        x.reshape(n, channels, factor, factor, h, w)
        .transpose(0, 1, 4, 2, 5, 3)
        .reshape(n, channels, h * factor, w * factor)
    )
