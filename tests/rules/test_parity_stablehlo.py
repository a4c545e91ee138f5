"""Parity with stablehlo_coreml on real converter output (JAX -> StableHLO -> MIL).

For every model of jax_programs.FUNCTIONS and every shape mode it converts
with, the raw program is optimized by stablehlo_coreml's pass pipeline
("theirs") and by ours (see tests/rules/parity.py and
bench/parity_stablehlo.py, which prints the same comparison as a table), and:

* ours has no more non-const ops, and no more consts, than theirs;
* ours (and, as a sanity check, the raw program) computes what JAX computes;
* where their pipeline fails, it fails in the one known pass of theirs
  (KNOWN_THEIR_FAILURES), so a fix or a new failure upstream is noticed;
* for the normalisations and activations, a symbolic batch optimizes to the
  same ops as the static one.

Each conversion and each pipeline runs once per (model, mode) (`results`).
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from dataclasses import dataclass

import jax  # noqa: E402,F401 - `.[test]` installs it: a missing one must fail, not skip
import pytest
import stablehlo_coreml  # noqa: E402,F401
from coremltools.converters.mil.mil.passes import pass_pipeline as ct_pass_pipeline  # noqa: E402
from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY  # noqa: E402
from jax_programs import FUNCTIONS, converted, modes  # noqa: E402
from parity import (  # noqa: E402
    Agreement,
    PassFailed,
    agrees_with_jax,
    format_histogram,
    histogram,
    optimized,
    our_pipeline,
    their_pipeline,
)

from rewrite.backends.mil import Program  # noqa: E402

# gelu_erf: the reference evaluator overflows in the select branches it discards.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

# (model, symbolic) -> the pass of their pipeline that raises on it.
KNOWN_THEIR_FAILURES = {
    # `int(...)` of a symbolic dim: "TypeError: Cannot convert symbols to int".
    ("logit_softcap", True): "common::fuse_logit_softcap",
}

# (model, symbolic) -> why ours may have more ops than theirs, for now: a
# strict xfail, so the test fails (and the entry is to go) once it no longer
# does. Empty since the SDPA fusion (causal_attention static, 5 ops to their 1).
NOT_YET: dict[tuple[str, bool], str] = {}

# Models whose symbolic-batch program must optimize to the static program's ops.
SYMBOLIC_LIKE_STATIC = ["mean_mul", "rmsnorm", "layernorm", "softmax", "gelu_tanh", "logit_softcap"]


def mode_name(symbolic: bool) -> str:
    return "symbolic" if symbolic else "static"


CASES = [(name, symbolic) for name in FUNCTIONS for symbolic in modes(name)]
IDS = [f"{name}-{mode_name(symbolic)}" for name, symbolic in CASES]


def case_params(not_yet: bool = False):
    """CASES as pytest params; with `not_yet`, the NOT_YET cases are strict xfails."""
    params = []
    for (name, symbolic), case_id in zip(CASES, IDS):
        marks = ()
        if not_yet and (name, symbolic) in NOT_YET:
            marks = pytest.mark.xfail(strict=True, raises=AssertionError, reason=NOT_YET[name, symbolic])
        params.append(pytest.param(name, symbolic, id=case_id, marks=marks))
    return params


# ------------------------------------------------------------------ one run per (model, mode)


@pytest.fixture(scope="module", autouse=True)
def quiet():
    """No tqdm bar per pass (parity.py applies a pipeline one pass at a time)
    and no coremltools log line for the pass of theirs that fails."""
    logger = logging.getLogger("coremltools")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ct_pass_pipeline, "tqdm", lambda iterable, *args, **kwargs: iterable)
        yield
    logger.setLevel(level)


@functools.cache
def pipelines():
    return their_pipeline(), our_pipeline()


@dataclass(frozen=True)
class Side:
    """One pipeline's result: the optimized program, or the pass that failed."""

    program: Program | None
    failure: PassFailed | None

    @property
    def counts(self) -> Counter:
        return histogram(self.program)[0]

    @property
    def consts(self) -> int:
        return histogram(self.program)[1]


@dataclass(frozen=True)
class Result:
    raw: Program
    theirs: Side
    ours: Side


def run_side(raw: Program, pipeline) -> Side:
    try:
        return Side(optimized(raw, pipeline), None)
    except PassFailed as failure:
        return Side(None, failure)


@functools.cache
def results(name: str, symbolic: bool) -> Result:
    raw = converted(name, symbolic)
    theirs, ours = pipelines()
    return Result(raw, run_side(raw, theirs), run_side(raw, ours))


@functools.cache
def agreement(name: str, symbolic: bool, side: str) -> Agreement:
    result = results(name, symbolic)
    program = result.raw if side == "raw" else getattr(result, side).program
    return agrees_with_jax(name, program, symbolic)


def ours(name: str, symbolic: bool) -> Side:
    side = results(name, symbolic).ours
    assert side.failure is None, f"our pipeline failed: {side.failure}"
    return side


# ------------------------------------------------------------------ tests


@pytest.mark.parametrize(("name", "symbolic"), case_params())
def test_their_pipeline_fails_only_where_known(name, symbolic):
    failure = results(name, symbolic).theirs.failure
    known = KNOWN_THEIR_FAILURES.get((name, symbolic))
    if known is None:
        assert failure is None, f"their pipeline failed: {failure}"
        return
    assert failure is not None, f"their pipeline no longer fails in {known}: drop it from KNOWN_THEIR_FAILURES"
    assert failure.pass_name == known, str(failure)
    # Their pass: in their pipeline only, and stablehlo_coreml's code.
    theirs, our = pipelines()
    assert known in theirs.passes and known not in our.passes
    assert type(PASS_REGISTRY[known]).__module__.startswith("stablehlo_coreml."), type(PASS_REGISTRY[known])


@pytest.mark.parametrize(("name", "symbolic"), case_params(not_yet=True))
def test_ours_has_no_more_ops_than_theirs(name, symbolic):
    result = results(name, symbolic)
    mine = ours(name, symbolic)
    if result.theirs.failure is not None:
        # Nothing of theirs to compare with: at least nothing above the raw program.
        raw_counts, raw_consts = histogram(result.raw)
        our_ops, raw_ops, our_consts = sum(mine.counts.values()), sum(raw_counts.values()), mine.consts
        assert our_ops <= raw_ops, f"ours: {format_histogram(mine.counts)}"
        assert our_consts <= raw_consts
        return
    theirs = result.theirs
    our_ops, their_ops = sum(mine.counts.values()), sum(theirs.counts.values())
    our_consts, their_consts = mine.consts, theirs.consts
    assert our_ops <= their_ops, f"theirs: {format_histogram(theirs.counts)}; ours: {format_histogram(mine.counts)}"
    assert our_consts <= their_consts


@pytest.mark.parametrize(("name", "symbolic"), case_params())
def test_raw_program_agrees_with_jax(name, symbolic):
    found = agreement(name, symbolic, "raw")
    assert found.ok, str(found)


@pytest.mark.parametrize(("name", "symbolic"), case_params())
def test_ours_agrees_with_jax(name, symbolic):
    ours(name, symbolic)
    found = agreement(name, symbolic, "ours")
    assert found.ok, str(found)


@pytest.mark.parametrize("name", SYMBOLIC_LIKE_STATIC)
def test_symbolic_batch_optimizes_like_static(name):
    symbolic, static = format_histogram(ours(name, True).counts), format_histogram(ours(name, False).counts)
    assert symbolic == static
