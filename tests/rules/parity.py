"""Parity with stablehlo_coreml: its pass pipeline against ours on real converter output.

Both pipelines are coremltools' default pipeline with hand-placed additions:
stablehlo_coreml's hand-written passes (`stablehlo_coreml.build_pass_pipeline`)
or our rule groups (`rewrite.mil.build_pass_pipeline`). They are applied to a
MIL Program directly, off macOS, and made fp32 the way `ct.convert(...,
compute_precision=ct.precision.FLOAT32)` makes its pipeline: without
`common::add_fp16_cast` and `common::add_int16_cast` (the latter would cast
the int32 shape arithmetic of a symbolic program to int16).

`ct.convert(program, convert_to="milinternal", pass_pipeline=p, ...)` would do
the same: its `milinternal` frontend pipeline is empty, and it returns before
the backend (`mlprogram`) pipeline. Applying the pipeline here, one pass at a
time, tells which pass failed when one does.

Used by bench/parity_stablehlo.py (which puts this folder on sys.path) and
meant for pytest tests. Import only after importing jax and
stablehlo_coreml.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass

import numpy as np
import stablehlo_coreml
from coremltools.converters.mil.mil.passes.pass_pipeline import PassPipelineManager
from jax_programs import STATIC_BATCH, concrete_arguments, feed, jax_result
from mil_cases import SIZES, op_counts

from rewrite.backends.mil import Program, copy_program, ct, evaluate_example
from rewrite.mil import build_pass_pipeline as build_our_pass_pipeline

# What ct.convert drops for compute_precision=FLOAT32.
FP16_PASSES = frozenset({"common::add_fp16_cast", "common::add_int16_cast"})

# Tolerances against JAX's result.
RTOL, ATOL = 1e-4, 1e-5


# ------------------------------------------------------------------ pipelines


def fp32(pipeline: ct.PassPipeline) -> ct.PassPipeline:
    """`pipeline` without the fp16 passes (a copy; `pipeline` is not changed)."""
    pipeline = copy.deepcopy(pipeline)
    pipeline.remove_passes(FP16_PASSES)
    return pipeline


def their_pipeline() -> ct.PassPipeline:
    """stablehlo_coreml's pipeline, fp32."""
    return fp32(stablehlo_coreml.build_pass_pipeline())


def our_pipeline() -> ct.PassPipeline:
    """rewrite's pipeline, fp32."""
    return fp32(build_our_pass_pipeline())


class PassFailed(RuntimeError):
    """A pass of a pipeline raised; `pass_name` and `index` say which."""

    def __init__(self, pass_name: str, index: int, error: BaseException):
        super().__init__(f"pass {index} '{pass_name}' failed: {type(error).__name__}: {error}")
        self.pass_name = pass_name
        self.index = index
        self.error = error


def apply_pipeline(program: Program, pipeline: ct.PassPipeline) -> Program:
    """Apply `pipeline` to `program` in place and return it.

    Each pass goes through coremltools' `PassPipelineManager` as a one-pass
    pipeline (with the options `pipeline` gives it), so the program is
    validated after every pass exactly as a whole-pipeline run would, and a
    failure is raised as `PassFailed` naming the pass.
    """
    pipeline.validate()
    for index, pass_name in enumerate(pipeline.passes):
        single = ct.PassPipeline(pass_names=[pass_name], pipeline_name=f"{pipeline.pipeline_name}[{index}]")
        single.set_options_by_another_pipeline(pipeline)
        try:
            PassPipelineManager.apply_pipeline(program, single)
        except Exception as error:
            raise PassFailed(pass_name, index, error) from error
    return program


def optimized(program: Program, pipeline: ct.PassPipeline) -> Program:
    """A copy of `program` with `pipeline` applied (`program` is not changed)."""
    return apply_pipeline(copy_program(program), pipeline)


# ------------------------------------------------------------------ op counts


def histogram(program: Program) -> tuple[Counter, int]:
    """(op type -> count without `const`s, number of `const`s), over all blocks."""
    counts = op_counts(program)
    consts = counts.pop("const", 0)
    return counts, consts


def format_histogram(counts: Counter) -> str:
    """`type×n` by descending count, then name: deterministic."""
    return " ".join(f"{op}×{n}" for op, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))


# ------------------------------------------------------------------ values


@dataclass(frozen=True)
class Agreement:
    ok: bool
    max_error: float | None  # largest |ours - jax|, over all argument sets
    note: str = ""  # why there is no verdict (an evaluation error)

    def __str__(self) -> str:
        if self.note:
            return f"n/a ({self.note})"
        return f"{'yes' if self.ok else 'NO'} ({self.max_error:.1e})"


def argument_sets(name: str, symbolic: bool) -> list[list[np.ndarray]]:
    """Two sets of concrete arguments: at SIZES for a symbolic program, at
    STATIC_BATCH with two seeds for a static one (which takes no other size)."""
    if symbolic:
        return [concrete_arguments(name, size) for size in SIZES]
    return [concrete_arguments(name, STATIC_BATCH, seed) for seed in (0, 1)]


def agrees_with_jax(name: str, program: Program, symbolic: bool, rtol: float = RTOL, atol: float = ATOL) -> Agreement:
    """Whether `program` computes FUNCTIONS[name] (by the reference evaluator)."""
    ok, worst = True, 0.0
    for arrays in argument_sets(name, symbolic):
        want = jax_result(name, arrays)
        try:
            (got,) = evaluate_example(program, feed(program, arrays)).values()
        except Exception as error:  # an op without value inference, say
            return Agreement(False, None, f"{type(error).__name__}: {str(error).splitlines()[0][:80]}")
        if got.shape != want.shape:
            return Agreement(False, None, f"shape {got.shape} != {want.shape}")
        worst = max(worst, float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)), initial=0.0)))
        ok = ok and bool(np.allclose(got, want, rtol=rtol, atol=atol))
    return Agreement(ok, worst)
