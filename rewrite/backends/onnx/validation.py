"""Whether a model is valid ONNX, as onnx's own checker says, and which change of a run broke one.

A rewrite that the engine proves sound can still leave a model no runtime
loads: a body output turned into an outer-scope value, an initializer the
IR version wants listed as an input, a name a training graph reads. Rather
than trust every such rule of the format, `optimize` checks its output with
`onnx.checker.check_model(full_check=True)` (the strict shape inference
included) whenever its input passes it, and refuses to hand back what
fails, naming the change that broke it (`rewrite.engine.steps`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import onnx

from rewrite.engine.interfaces import ModelError

# protobuf cannot serialize a message of 2 GiB or more: such a model is
# checked from a file, its tensors written beside it.
_SERIALIZABLE_BYTES = (1 << 31) - (1 << 20)


class InvalidOutputError(ModelError):
    """A run's output fails onnx's checker where its input passed; the message names the change that broke it."""

    def __init__(self, problem: str, maker: str | None, step: int | None):
        self.problem = problem
        self.maker = maker
        self.step = step
        blame = f"{_describe(maker)} (change {step} of the run)" if maker else "the run"
        super().__init__(f"{blame} made the model invalid: {problem}")


def _describe(maker: str) -> str:
    return maker if " " in maker else f"rule '{maker}'"


def problem(model: onnx.ModelProto) -> str | None:
    """What `onnx.checker.check_model(model, full_check=True)` finds wrong, on one line; None if nothing."""
    try:
        if model.ByteSize() < _SERIALIZABLE_BYTES:
            onnx.checker.check_model(model, full_check=True)
        else:
            with tempfile.TemporaryDirectory(prefix="rewrite-check-") as folder:
                path = Path(folder) / "model.onnx"
                copy = onnx.ModelProto()
                copy.CopyFrom(model)
                onnx.save_model(copy, str(path), save_as_external_data=True, location="model.onnx.data")
                onnx.checker.check_model(str(path), full_check=True)
    except Exception as error:  # the checker's ValidationError, and the shape inference's errors
        return _first_line(error).rstrip(".")
    return None


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    # The shape inference wraps each finding as "[ShapeInferenceError] Inference error(s): (op_type:...)".
    return " ".join(lines[:2]) if len(lines[0]) < 48 and len(lines) > 1 else lines[0]
