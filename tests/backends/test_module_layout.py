"""The backends' modules import one another without a circle, and each imports on its own.

A circle (even one under `TYPE_CHECKING`, or through an import inside a
function) means two modules are one concern split in the wrong place; read
from the source with `ast`, so that an import Python happens to resolve
still counts. Each module is also imported alone, in a fresh interpreter:
that is what a user who imports one of them gets. That the engine imports
no backend at all, nor the language the engine, tests/language/test_layering.py
checks.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import rewrite
from rewrite.language.cycles import _strongly_connected

ROOT = Path(rewrite.__file__).parent
BACKENDS = ("onnx", "mil")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(package: str) -> dict[str, Path]:
    return {_module_name(path): path for path in sorted((ROOT / "backends" / package).glob("*.py"))}


def _imported(path: Path, known: set[str]) -> set[str]:
    """The modules of `known` that the module at `path` imports, anywhere in it.

    `from package import submodule` depends on the submodule, not on the
    package's `__init__` (which Python has begun running already).
    """
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & known
            found.update(submodules or {node.module})
    return found & known


def _graph(package: str) -> dict[str, set[str]]:
    modules = _modules(package)
    return {name: _imported(path, set(modules)) - {name} for name, path in modules.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module."""
    edges = {module: [(other, None) for other in sorted(imported)] for module, imported in graph.items()}
    groups = _strongly_connected(sorted(graph), edges)
    return sorted(sorted(group) for group in groups if len(group) > 1)


@pytest.mark.parametrize("package", BACKENDS)
def test_no_import_circle_among_a_backends_modules(package):
    graph = _graph(package)
    assert len(graph) > 5  # the modules were found
    assert _circles(graph) == []


def test_a_circle_is_found():
    # Under TYPE_CHECKING too, as shapes.py and adapter.py once had it.
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# Run in a fresh interpreter: the third-party libraries are imported once, then each
# module of ours in a forked child that has imported nothing of `rewrite` yet.
_IMPORT_EACH = """
import importlib, json, os, sys, traceback
import numpy, onnx, sympy
if sys.argv[1] == "mil":
    import coremltools
assert not any(name.startswith("rewrite") for name in sys.modules)
failed = {}
for module in sys.argv[2:]:
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read)
        try:
            importlib.import_module(module)
        except BaseException:
            os.write(write, traceback.format_exc().strip().splitlines()[-1].encode())
            os._exit(1)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        message = pipe.read()
    if os.waitpid(child, 0)[1]:
        failed[module] = message or "failed"
print(json.dumps(failed))
"""


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
@pytest.mark.parametrize("package", BACKENDS)
def test_each_module_imports_alone_in_a_fresh_interpreter(package):
    modules = list(_modules(package))
    result = subprocess.run([sys.executable, "-c", _IMPORT_EACH, package, *modules],
                            capture_output=True, text=True, timeout=300, check=True)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {}
