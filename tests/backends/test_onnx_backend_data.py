"""Every model the installed onnx ships under `onnx/backend/test/data`, through the whole library.

Models nobody here wrote: operator tests exported from PyTorch years ago
(IR version 3, where every initializer is also a graph input), small
converted networks, and nine zoo CNNs whose weights are made by
`ConstantOfShape`. Each must come out valid under onnx's full checker
(where it went in so), computing what its own test data says it computes
(onnxruntime, else onnx's reference evaluator), and none may be refused.
"""

from __future__ import annotations

import glob
import os

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import numpy_helper

from rewrite.backends.onnx import count_nodes
from rewrite.backends.onnx.validation import problem
from rewrite.onnx import optimize

ROOT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
MODELS = sorted(glob.glob(os.path.join(ROOT, "**", "*.onnx"), recursive=True))


def _name(path: str) -> str:
    return os.path.relpath(path, ROOT)


def test_the_installed_onnx_ships_the_models():
    assert len(MODELS) >= 100
    assert sum("/light/" in path for path in MODELS) == 9


def _data_sets(path: str) -> list[list[np.ndarray]]:
    """The inputs of each of the model's test data sets (the original's outputs, in the same runtime, are
    what the rewritten model is held to: the stored ones would test the runtime)."""
    folder = os.path.dirname(path)
    return [
        [numpy_helper.to_array(onnx.load_tensor(f)) for f in sorted(glob.glob(f"{data_set}/input_*.pb"))]
        for data_set in sorted(glob.glob(os.path.join(folder, "test_data_set_*")))
    ]


def _evaluate(model: onnx.ModelProto, inputs: list[np.ndarray]) -> list[np.ndarray] | None:
    """The outputs for `inputs` (by position among the inputs a user feeds); None if nothing can run it."""
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    try:
        session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        return session.run(None, dict(zip(names, inputs)))
    except Exception:  # a kernel onnxruntime lacks (a locale, a training op): the reference evaluator decides
        pass
    try:
        from onnx.reference import ReferenceEvaluator

        evaluator = ReferenceEvaluator(model)
        initializers = {t.name for t in model.graph.initializer}
        names = [i.name for i in model.graph.input if i.name not in initializers]
        return [np.asarray(v) for v in evaluator.run(None, dict(zip(names, inputs)))]
    except Exception:
        return None


def _close(expected: np.ndarray, got: np.ndarray) -> bool:
    expected, got = np.asarray(expected), np.asarray(got)
    if expected.shape != got.shape:
        return False
    if expected.dtype.kind in "fc":
        return bool(np.allclose(got, expected, rtol=1e-3, atol=1e-4, equal_nan=True))
    return bool(np.array_equal(got, expected))


@pytest.mark.parametrize("path", MODELS, ids=_name)
def test_the_model_comes_out_valid_and_computing_the_same(path):
    model = onnx.load(path)
    before = onnx.ModelProto()
    before.CopyFrom(model)
    valid = problem(model) is None
    optimize(model)  # refusing one would raise
    if valid:
        assert problem(model) is None
    assert count_nodes(model) <= count_nodes(before)
    checked = 0
    for inputs in _data_sets(path):
        reference = _evaluate(before, inputs)
        if reference is None:
            continue  # nothing here runs the original either
        got = _evaluate(model, inputs)
        assert got is not None, "the original runs, the output does not"
        assert len(got) == len(reference)
        for old, new in zip(reference, got):
            assert _close(old, new)
        checked += 1
    if _data_sets(path) and _evaluate(before, _data_sets(path)[0]) is not None:
        assert checked


def test_the_zoo_cnns_shrink():
    """IR 3: their initializers are constants, so the weights' ConstantOfShape fold (up to the size cap)."""
    for path in (p for p in MODELS if "/light/" in p):
        model = onnx.load(path)
        before = count_nodes(model)
        optimize(model)
        assert count_nodes(model) < 0.8 * before, _name(path)
