"""The package's layers import one way: backends -> engine -> language, never back.

Read from the source with `ast` rather than from `sys.modules`: importing any
submodule runs `rewrite/__init__.py`, which loads the engine whatever the
submodule itself imports.
"""

from __future__ import annotations

import ast

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "rewrite"


def _imported(source: str, package: str) -> set[str]:
    """Every module `source` imports (at any depth in it, lazily too), as dotted names.

    `from rewrite import engine` counts as importing `rewrite.engine`, and a
    relative import is resolved against `package`, the module's own.
    """
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _violations(layer: str, forbidden: tuple[str, ...]) -> list[str]:
    paths = sorted((PACKAGE / layer).rglob("*.py"))
    assert len(paths) > 5, f"rewrite/{layer} not found"
    return sorted(
        f"{path.relative_to(REPO)} imports {name}"
        for path in paths
        for name in _imported(path.read_text(encoding="utf-8"), ".".join(path.relative_to(REPO).parent.parts))
        if any(name == prefix or name.startswith(prefix + ".") for prefix in forbidden)
    )


@pytest.mark.parametrize(
    "layer, forbidden",
    [
        # The types the language checks rules against (op schemas, three-valued
        # truth) are its own: loading and checking rules needs no engine.
        ("language", ("rewrite.engine", "rewrite.backends")),
        # A backend is reached through the Adapter protocol only.
        ("engine", ("rewrite.backends",)),
    ],
)
def test_a_layer_never_imports_the_layers_above_it(layer, forbidden):
    assert _violations(layer, forbidden) == []


@pytest.mark.parametrize(
    "source",
    [
        "import rewrite.engine.logic",
        "from rewrite.engine.interfaces import Adapter",
        "from rewrite import backends",
        "def f():\n    from rewrite.backends.mil import adapter",
        "from ..engine import driver",
    ],
)
def test_the_check_sees_every_form_of_import(source):
    found = _imported(source, "rewrite.language")
    assert any(name.startswith(("rewrite.engine", "rewrite.backends")) for name in found), found


def test_a_relative_import_within_the_layer_stays_in_it():
    assert _imported("from . import ast\nfrom .logic import Truth", "rewrite.language") == {
        "rewrite.language", "rewrite.language.ast", "rewrite.language.logic", "rewrite.language.logic.Truth"
    }
