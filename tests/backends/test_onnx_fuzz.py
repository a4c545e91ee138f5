"""Random small models through the whole ONNX library: valid in, valid out, the same values.

The models (`onnx_fuzz.random_model`) have `If`, `Loop` and `Scan` bodies
reading the enclosing scopes (two deep at most), model-local functions and
optional inputs left out or given as "". Each must pass onnx's full
checker after `optimize` (its own safeguard off, so that a broken rewrite
shows here rather than as a refusal) and compute what it computed under
onnxruntime, at two batch sizes.

Seeded and bounded: `FUZZ_CASES` seeds from `REWRITE_FUZZ_SEED` (default 0),
stopping early past `REWRITE_FUZZ_SECONDS` (default 20); set them to search
longer. A case that fails is saved into `onnx_fuzz_corpus/` (named by its
seed), which every run replays first: commit it with the fix.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest

from rewrite.backends.onnx.validation import problem
from rewrite.onnx import optimize
from tests.backends.onnx_fuzz import feeds, random_model

CORPUS = Path(__file__).resolve().parent / "onnx_fuzz_corpus"
FUZZ_CASES = 120
SEED = int(os.environ.get("REWRITE_FUZZ_SEED", "0"))
SECONDS = float(os.environ.get("REWRITE_FUZZ_SECONDS", "20"))


def _session(model: onnx.ModelProto) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _failure(model: onnx.ModelProto, seed: int) -> str | None:
    """What goes wrong with `model` through the library; None if nothing (or if the model is no valid case)."""
    if problem(model) is not None:
        return None  # the generator's own slip: no case
    try:
        session = _session(model)
        expected = [session.run(None, feeds(batch, seed)) for batch in (2, 3)]
    except Exception:
        return None
    before = onnx.ModelProto()
    before.CopyFrom(model)
    try:
        optimize(model, validate=False)
    except Exception as error:
        return f"optimize raised {type(error).__name__}: {error}"
    found = problem(model)
    if found is not None:
        return f"the output is not valid: {found}"
    try:
        session = _session(model)
    except Exception as error:
        return f"onnxruntime refuses the output: {str(error).splitlines()[0]}"
    for batch, old in zip((2, 3), expected):
        new = session.run(None, feeds(batch, seed))
        for a, b in zip(old, new):
            if a.shape != b.shape or not np.allclose(a, b, rtol=1e-5, atol=1e-5, equal_nan=True):
                return f"an output changed at batch {batch}"
    return None


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.onnx")), ids=lambda p: p.name)
def test_the_corpus_of_cases_found(path):
    seed = int(path.stem.rsplit("-", 1)[-1])
    model = onnx.load(path)
    assert problem(model) is None, "a corpus case must be a valid model"
    assert _failure(model, seed) is None


def test_random_models():
    start = time.perf_counter()
    tried = valid = 0
    failures = []
    for seed in range(SEED, SEED + FUZZ_CASES):
        if time.perf_counter() - start > SECONDS:
            break
        model = random_model(seed)
        tried += 1
        valid += problem(model) is None
        failure = _failure(model, seed)
        if failure is not None:
            path = CORPUS / f"found-{seed}.onnx"
            onnx.save(random_model(seed), path)
            failures.append(f"seed {seed} ({path.name}): {failure}")
    assert tried >= 20, f"only {tried} cases in {SECONDS} s"
    assert valid >= 0.9 * tried, "the generator makes too few valid models to test anything"
    assert not failures, "\n".join(failures)
