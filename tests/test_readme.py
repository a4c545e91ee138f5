"""The README's rules table names every shipped rule, and nothing else: it cannot drift from the library."""

from __future__ import annotations

import re

import rewrite
from tests.conftest import REPO


def _table_names() -> dict[str, set[str]]:
    """Rule names per dialect in the README's "Shipped rules" table, shorthand expanded.

    A cell may abbreviate a rule that differs from the one before it only in
    its last word: `fold_transpose_into_matmul_x`, `_y`, or
    `onnx_remove_noop_cast`/`_castlike`.
    """
    text = (REPO / "README.md").read_text(encoding="utf-8")
    table = text.split("## Shipped rules", 1)[1].split("\n## ", 1)[0]
    found: dict[str, set[str]] = {}
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] not in ("mil", "onnx"):
            continue
        previous = ""
        for name in re.findall(r"`([^`]+)`", cells[1]):
            if name.startswith("_") and previous:
                name = previous.rsplit("_", 1)[0] + name
            found.setdefault(cells[0], set()).add(name)
            previous = name
    return found


def test_the_rules_table_lists_every_shipped_rule_and_only_those():
    shipped: dict[str, set[str]] = {}
    for rule in rewrite.load_rules().rules:
        shipped.setdefault(rule.dialect, set()).add(rule.name)
    table = _table_names()
    for dialect in ("mil", "onnx"):
        assert sorted(shipped[dialect] - table.get(dialect, set())) == [], f"{dialect}: missing from the README"
        assert sorted(table.get(dialect, set()) - shipped[dialect]) == [], f"{dialect}: in the README, not shipped"


def test_ci_runs_the_readme_test_command():
    """.ci/run is the README's test command, exactly: what CI checks is what a newcomer runs."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    command = readme.split("Install and run the whole test suite:", 1)[1].split("```", 2)[1].strip()
    ci = [line for line in (REPO / ".ci/run").read_text(encoding="utf-8").splitlines() if line.startswith("pip ")]
    assert ci == [command]
    assert "mypy rewrite/engine rewrite/language" in command
