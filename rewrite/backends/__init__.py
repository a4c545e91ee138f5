"""Backend adapters, one module per IR, imported only when needed.

The engine never imports this package; the public API (`rewrite.api`) uses
it to find the op schema of a dialect and the adapter for a program.

A backend's module imports its IR library, and that is the slow part of
starting: coremltools imports torch (2.7 s). Checking rules needs only each
op's operand names, so `schema_for` answers from a snapshot of every
dialect's op schema (`schema_snapshot.py`) taken with the library version
installed, read without importing the library, and imports the backend only
when the installed version is another one. So a process that loads the whole
rule library and rewrites ONNX models never imports coremltools, and one
that rewrites MIL programs never imports onnx.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rewrite.language.schema import InputSpec, OpSignature

# dialect -> module implementing it
_BACKENDS = {"mil": "rewrite.backends.mil", "onnx": "rewrite.backends.onnx"}
# dialect -> the distribution whose op registry its schema reads
_LIBRARIES = {"mil": "coremltools", "onnx": "onnx"}
# dialect -> the pass groups its rules may name in `group` clauses, in the
# order they run. rewrite/mil.py places MIL's among coremltools' passes;
# ONNX has no pass pipeline, so an ONNX rule names none.
_GROUPS = {"mil": ("cleanup", "fusion", "late", "settle", "index_guards"), "onnx": ()}


def dialects() -> list[str]:
    return sorted(_BACKENDS)


def pass_groups(dialect: str) -> tuple[str, ...]:
    """The pass groups `dialect`'s rules may name in `group` clauses (() for none)."""
    return _GROUPS.get(dialect, ())


def backend_module(dialect: str):
    """The backend module of `dialect`, or None if there is none."""
    name = _BACKENDS.get(dialect)
    return importlib.import_module(name) if name else None


_SCHEMAS: dict[str, DeferredSchema] = {}


def schema_for(dialect: str):
    """The op schema of `dialect` (None if there is no such dialect), without importing its backend."""
    if dialect not in _BACKENDS:
        return None
    schema = _SCHEMAS.get(dialect)
    if schema is None:
        schema = _SCHEMAS[dialect] = DeferredSchema(dialect)
    return schema


def adapter_for(program: Any, *, check_types: bool = False, source: Any = None):
    """An adapter over `program`, chosen by its type; `source` is where a lazily read
    ONNX model's external tensors are (the `OnnxSource` `read_onnx` returned)."""
    kind = type(program)
    if kind.__module__.startswith("coremltools"):
        from rewrite.backends.mil import MilAdapter, Program

        if isinstance(program, Program):
            return MilAdapter(program, check_types=check_types)
    if kind.__name__ == "ModelProto" and kind.__module__.startswith("onnx"):
        from rewrite.backends.onnx import OnnxAdapter

        # A model `read_onnx` loaded leaves its external tensors on disk,
        # beside the file: constants are read from there when asked for.
        return OnnxAdapter(program, None if source is None else source.base_dir)
    raise TypeError(f"no backend for a {kind.__module__}.{kind.__name__}")


# ---------------------------------------------------------------- schemas without the library


class DeferredSchema:
    """The `OpSchema` of one dialect, from the snapshot while it matches the installed library.

    Asked for an op the snapshot lacks, it asks the backend's own schema
    only if the library is imported already (an embedder may have
    registered ops of its own with it); otherwise the op is unknown, as it
    would be to a freshly imported library of that version.
    """

    def __init__(self, dialect: str):
        self.dialect = dialect
        self.groups = pass_groups(dialect)
        self._table: dict[str, tuple] | None = None
        self._live = None
        self._signatures: dict[str, OpSignature | None] = {}
        snapshot = _snapshot()
        library = _LIBRARIES[dialect]
        if snapshot is not None and snapshot.LIBRARIES.get(dialect) == (library, _installed(library)):
            self._table = snapshot.SIGNATURES[dialect]

    def _backend(self):
        if self._live is None:
            self._live = backend_module(self.dialect).SCHEMA
        return self._live

    def signature(self, op_type: str) -> OpSignature | None:
        if self._table is None:
            return self._backend().signature(op_type)
        if op_type not in self._signatures:
            entry = self._table.get(op_type)
            if entry is not None:
                self._signatures[op_type] = _signature(op_type, entry)
            elif _LIBRARIES[self.dialect] in sys.modules:
                return self._backend().signature(op_type)  # not cached: registrations may follow
            else:
                self._signatures[op_type] = None
        return self._signatures[op_type]

    def op_types(self) -> Sequence[str]:
        if self._table is None:
            return self._backend().op_types()
        return sorted(self._table)

    @property
    def from_snapshot(self) -> bool:
        """Whether this schema answers from the snapshot (the backend is not imported for it)."""
        return self._table is not None


def _signature(op_type: str, entry: tuple) -> OpSignature:
    inputs, attributes = entry
    specs = tuple(InputSpec(name.rstrip("?*"), "?" in name[-2:], name.endswith("*")) for name in inputs)
    return OpSignature(op_type, specs, tuple(attributes))


def _installed(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _snapshot():
    try:
        from rewrite.backends import schema_snapshot
    except ImportError:  # pragma: no cover - a package without it still works, slower
        return None
    return schema_snapshot


def write_schema_snapshot(path: str | Path | None = None) -> Path:
    """Write `schema_snapshot.py` from the installed libraries (imports every backend).

    Run after upgrading coremltools or onnx: `python -c "from rewrite.backends
    import write_schema_snapshot; write_schema_snapshot()"`. Until then a
    dialect whose library changed version is checked by importing it.
    """
    path = Path(path) if path is not None else Path(__file__).with_name("schema_snapshot.py")
    lines = [
        '"""Every op of each dialect: its inputs (`name?` optional, `name*` variadic) and attribute names.',
        "",
        "Generated by `rewrite.backends.write_schema_snapshot()` from the libraries named in",
        "LIBRARIES; `rewrite.backends.schema_for` uses it only while those versions are installed.",
        '"""',
        "",
        "# fmt: off",
        "# ruff: noqa: E501",
        "LIBRARIES = {",
    ]
    for dialect in dialects():
        library = _LIBRARIES[dialect]
        lines.append(f"    {dialect!r}: ({library!r}, {_installed(library)!r}),")
    lines += ["}", "", "SIGNATURES = {"]
    for dialect in dialects():
        schema = backend_module(dialect).SCHEMA
        lines.append(f"    {dialect!r}: {{")
        for op_type in schema.op_types():
            signature = schema.signature(op_type)
            if signature is None:
                continue
            inputs = tuple(
                spec.name + ("?" if spec.optional else "") + ("*" if spec.variadic else "")
                for spec in signature.inputs
            )
            lines.append(f"        {op_type!r}: ({inputs!r}, {tuple(signature.attributes)!r}),")
        lines.append("    },")
    lines += ["}", ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
