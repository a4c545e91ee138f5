"""Real converter output for the rule tests: a JAX function is exported with
`jax.export` and turned into a raw MIL Program by `stablehlo_coreml.convert`.

`convert` runs none of coremltools' MIL passes (it only builds the program
with the MIL builder), so the tiles a converter emits for broadcasts are all
still there. Requires jax and stablehlo_coreml; import this module only after
importing both (which `.[test]` installs).
"""

from __future__ import annotations

import functools
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import stablehlo_coreml  # noqa: E402
from coremltools.converters.mil.converter import _reset_conversion_state  # noqa: E402
from jax._src.interpreters import mlir as jax_mlir  # noqa: E402
from jax._src.lib.mlir import ir  # noqa: E402

from rewrite.backends.mil import Program, copy_program, ct  # noqa: E402

STATIC_BATCH = 4

# ------------------------------------------------------------------ functions


def mean_mul(x):
    return jnp.mean(x, -1, keepdims=True) * x


def rmsnorm(x):
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)


def layernorm(x):
    mean = jnp.mean(x, -1, keepdims=True)
    variance = jnp.mean((x - mean) ** 2, -1, keepdims=True)
    return (x - mean) / jnp.sqrt(variance + 1e-5)


def softmax(x):
    return jax.nn.softmax(x, axis=-1)


def masked_fill(mask, s):
    return jnp.where(mask, s, -1e9)


def where_row_mean(s):
    return jnp.where(s > 0, s, jnp.mean(s, -1, keepdims=True))


# A closed-over numpy array: JAX embeds it in the module, so it is a `const` in MIL.
RMSNORM_WEIGHT = np.random.default_rng(1234).normal(size=(8,)).astype(np.float32)


def rmsnorm_weight(x):
    return rmsnorm(x) * RMSNORM_WEIGHT


def logit_softcap(x):
    return jnp.tanh(x / 30.0) * 30.0


def gelu_tanh(x):
    return jax.nn.gelu(x, approximate=True)


def gelu_erf(x):
    return jax.nn.gelu(x, approximate=False)


def kv_cache_where(mask, value, cache):
    """Write `value` into the cache rows that `mask` selects (a KV-cache update
    spelled as a select: the mask and the value broadcast against the cache)."""
    return jnp.where(mask, value, cache)


def causal_attention(q, k, v):
    """Single-head attention with a causal mask over the (static) sequence axis."""
    sequence, head_dim = q.shape[-2], q.shape[-1]
    scores = q @ jnp.swapaxes(k, -1, -2) / np.float32(np.sqrt(head_dim))
    causal = jnp.tril(jnp.ones((sequence, sequence), dtype=bool))
    scores = jnp.where(causal, scores, -1e9)
    return jax.nn.softmax(scores, axis=-1) @ v


# name -> (function, [(shape, dtype) per argument]). Every dim given as a string
# is symbolic, named by that string ("b" a batch, "L" a cache length, ...); all
# of an entry's named dims take one size at run time (STATIC_BATCH in a static
# conversion, the `batch` of `concrete_arguments`). Names are per entry: one
# name is one dimension across the entry's arguments.
def causal_attention_arange(q, k, v):
    """Causal attention with the mask built from positions, which converts under a symbolic sequence."""
    sequence, head_dim = q.shape[-2], q.shape[-1]
    scores = q @ jnp.swapaxes(k, -1, -2) / np.float32(np.sqrt(head_dim))
    positions = jnp.arange(sequence)
    scores = jnp.where(positions[:, None] >= positions[None, :], scores, -1e9)
    return jax.nn.softmax(scores, axis=-1) @ v


def masked_softmax(x, mask):
    return jax.nn.softmax(jnp.where(mask, x, -jnp.inf), axis=-1, where=mask)


FUNCTIONS = {
    "mean_mul": (mean_mul, [(("b", 8), np.float32)]),
    "rmsnorm": (rmsnorm, [(("b", 8), np.float32)]),
    "layernorm": (layernorm, [(("b", 8), np.float32)]),
    "softmax": (softmax, [(("b", 8), np.float32)]),
    # mask (b, 1) against s (b, 8): the mask is broadcast by a tile that feeds `select`.
    "where_column_mask": (masked_fill, [(("b", 1), np.bool_), (("b", 8), np.float32)]),
    # mask and s both (b, 8): only static shapes make a tile (of the scalar -1e9).
    "where_full_mask": (masked_fill, [(("b", 8), np.bool_), (("b", 8), np.float32)]),
    "where_row_mean": (where_row_mean, [(("b", 8), np.float32)]),
    "rmsnorm_weight": (rmsnorm_weight, [(("b", 8), np.float32)]),
    "logit_softcap": (logit_softcap, [(("b", 8), np.float32)]),
    "gelu_tanh": (gelu_tanh, [(("b", 8), np.float32)]),
    "gelu_erf": (gelu_erf, [(("b", 8), np.float32)]),
    "gelu_erf_lowered": (gelu_erf, [(("b", 8), np.float32)]),
    # Laid out (batch, 1, 1, features), where Core ML's l2_norm can compute RMSNorm.
    "rmsnorm_heads": (rmsnorm, [(("b", 1, 1, 64), np.float32)]),
    # A cache of L rows, 2 heads of 8; the mask picks rows, the value is one row.
    "kv_cache_where": (
        kv_cache_where,
        [((1, "L", 1, 1), np.bool_), ((1, 1, 2, 8), np.float32), ((1, "L", 2, 8), np.float32)],
    ),
    # Static only (see STATIC_ONLY): (b, 8, 16) with sequence 8 and head dim 16.
    "causal_attention": (causal_attention, [(("b", 8, 16), np.float32)] * 3),
    # "s" is the sequence: symbolic, it is the one dim the attention mask depends on.
    "causal_attention_arange": (causal_attention_arange, [((1, "s", 16), np.float32)] * 3),
    "masked_softmax": (masked_softmax, [(("b", 8), np.float32), (("b", 8), np.bool_)]),
}

# Entries stablehlo_coreml cannot convert with symbolic dims, and why. For these
# only `symbolic=False` exists; `modes(name)` lists what does.
STATIC_ONLY = {
    # dot_general with a symbolic batching dim: `int(lhs.shape[d])` raises
    # "Cannot convert symbols to int". A symbolic sequence (1, "S", 16) fails
    # too, on jnp.tril's 2-D iota: "DynamicIotaOp with rank=2, iota_dim=0 is
    # not yet supported (only 1D iota is implemented)".
    "causal_attention": "stablehlo_coreml: dot_general with a symbolic batch dim; 2-D dynamic iota",
    # Lowered (not exported) with a symbolic shape, the dim becomes an extra argument.
    "gelu_erf_lowered": "jit(...).lower passes a symbolic dim as an extra argument",
}


# Converted from `jit(...).lower(...)`, keeping chlo ops (see `convert`).
LOWERED = frozenset({"gelu_erf_lowered"})


def modes(name: str) -> tuple[bool, ...]:
    """The `symbolic` values FUNCTIONS[name] converts with."""
    return (False,) if name in STATIC_ONLY else (True, False)


# ------------------------------------------------------------------ conversion


def abstract_arguments(arguments, symbolic: bool) -> list[jax.ShapeDtypeStruct]:
    """ShapeDtypeStructs for `arguments`. Symbolic dims are made in one
    `symbolic_shape` call, so one name is one dimension across arguments."""
    if not symbolic:
        return [
            jax.ShapeDtypeStruct(tuple(STATIC_BATCH if isinstance(d, str) else d for d in shape), dtype)
            for shape, dtype in arguments
        ]
    flat = [str(d) for shape, _ in arguments for d in shape]
    dims = jax.export.symbolic_shape("(" + ", ".join(flat) + ")")
    structs, start = [], 0
    for shape, dtype in arguments:
        structs.append(jax.ShapeDtypeStruct(tuple(dims[start : start + len(shape)]), dtype))
        start += len(shape)
    return structs


def convert(function, arguments, symbolic: bool, lowered: bool = False) -> Program:
    """The raw MIL program stablehlo_coreml makes of `function`.

    `lowered`: take the module from `jit(...).lower(...)` rather than
    `jax.export`, which decomposes chlo ops such as erfc into polynomials;
    lowering keeps them, so erfc reaches MIL as erf.
    """
    abstract = abstract_arguments(arguments, symbolic)
    if lowered:
        text = str(jax.jit(function).lower(*abstract).compiler_ir("stablehlo"))
    else:
        text = jax.export.export(jax.jit(function))(*abstract).mlir_module()
    module = ir.Module.parse(text, context=jax_mlir.make_ir_context())
    # stablehlo_coreml names its input symbols dim_0, dim_1, ... and coremltools
    # keeps the used symbol names process-wide: without a reset, the second
    # symbolic conversion fails with "Symbol 'dim_0' is used already".
    _reset_conversion_state()
    program = stablehlo_coreml.convert(module, minimum_deployment_target=ct.target.iOS18)
    assert isinstance(program, Program)
    return program


@functools.cache
def _converted(name: str, symbolic: bool) -> Program:
    if symbolic and name in STATIC_ONLY:
        raise ValueError(f"{name} converts only with static shapes: {STATIC_ONLY[name]}")
    function, arguments = FUNCTIONS[name]
    return convert(function, arguments, symbolic, lowered=name in LOWERED)


def converted(name: str, symbolic: bool) -> Program:
    """A fresh copy of the (cached) conversion of FUNCTIONS[name]."""
    return copy_program(_converted(name, symbolic))


def concrete_arguments(name: str, batch: int, seed: int = 0) -> list[np.ndarray]:
    """Random arrays for FUNCTIONS[name] with every symbolic (string) dim set to
    `batch`, whatever its name."""
    rng = np.random.default_rng(seed + batch)
    arrays = []
    for shape, dtype in FUNCTIONS[name][1]:
        concrete = tuple(batch if isinstance(d, str) else d for d in shape)
        if dtype == np.bool_:
            arrays.append(rng.random(concrete) < 0.5)
        else:
            arrays.append(rng.normal(size=concrete).astype(dtype))
    return arrays


def feed(program: Program, arrays) -> dict[str, np.ndarray]:
    """Map arrays to the program's inputs by position (symbolic exports call
    them arg0, arg1, ...; static ones keep the Python names)."""
    names = list(program.functions["main"].inputs)
    assert len(names) == len(arrays)
    return dict(zip(names, arrays))


def jax_result(name: str, arrays) -> np.ndarray:
    return np.asarray(jax.jit(FUNCTIONS[name][0])(*arrays))
