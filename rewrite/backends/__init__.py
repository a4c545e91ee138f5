"""Backend adapters, one module per IR, imported only when needed.

The engine never imports this package; the public API (`rewrite.api`) uses
it to find the op schema of a dialect and the adapter for a program.
"""

from __future__ import annotations

import importlib
from typing import Any

# dialect -> module implementing it
_BACKENDS = {"mil": "rewrite.backends.mil", "onnx": "rewrite.backends.onnx"}


def dialects() -> list[str]:
    return sorted(_BACKENDS)


def backend_module(dialect: str):
    """The backend module of `dialect`, or None if there is none."""
    name = _BACKENDS.get(dialect)
    return importlib.import_module(name) if name else None


def schema_for(dialect: str):
    module = backend_module(dialect)
    return None if module is None else module.SCHEMA


def adapter_for(program: Any, *, check_types: bool = False):
    """An adapter over `program`, chosen by its type."""
    kind = type(program)
    if kind.__module__.startswith("coremltools"):
        from rewrite.backends.mil import MilAdapter, Program

        if isinstance(program, Program):
            return MilAdapter(program, check_types=check_types)
    if kind.__name__ == "ModelProto" and kind.__module__.startswith("onnx"):
        from rewrite.backends.onnx import OnnxAdapter

        return OnnxAdapter(program)
    raise TypeError(f"no backend for a {kind.__module__}.{kind.__name__}")
