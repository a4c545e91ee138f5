"""Real converter output for the rule tests: a JAX function is exported with
`jax.export` and turned into a raw MIL Program by `stablehlo_coreml.convert`.

`convert` runs none of coremltools' MIL passes (it only builds the program
with the MIL builder), so the tiles a converter emits for broadcasts are all
still there. Requires jax and stablehlo_coreml; import this module only after
`pytest.importorskip` of both.
"""

from __future__ import annotations

import copy
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

from rewrite.backends.mil import Program, ct  # noqa: E402

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


# name -> (function, [(shape, dtype) per argument]); "b" is the symbolic batch.
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
}


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


def convert(function, arguments, symbolic: bool) -> Program:
    """The raw MIL program stablehlo_coreml makes of `function`."""
    exported = jax.export.export(jax.jit(function))(*abstract_arguments(arguments, symbolic))
    module = ir.Module.parse(exported.mlir_module(), context=jax_mlir.make_ir_context())
    # stablehlo_coreml names its input symbols dim_0, dim_1, ... and coremltools
    # keeps the used symbol names process-wide: without a reset, the second
    # symbolic conversion fails with "Symbol 'dim_0' is used already".
    _reset_conversion_state()
    program = stablehlo_coreml.convert(module, minimum_deployment_target=ct.target.iOS18)
    assert isinstance(program, Program)
    return program


@functools.cache
def _converted(name: str, symbolic: bool) -> Program:
    function, arguments = FUNCTIONS[name]
    return convert(function, arguments, symbolic)


def converted(name: str, symbolic: bool) -> Program:
    """A fresh copy of the (cached) conversion of FUNCTIONS[name]."""
    return copy.deepcopy(_converted(name, symbolic))


def concrete_arguments(name: str, batch: int, seed: int = 0) -> list[np.ndarray]:
    """Random arrays for FUNCTIONS[name] with the batch dim set to `batch`."""
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
