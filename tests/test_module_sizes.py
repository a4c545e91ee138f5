"""A habit kept by a test: no module of `rewrite/` over about 600 lines without a reason at its top."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rewrite"
LIMIT = 600
MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PACKAGE)) for p in MODULES])
def test_a_long_module_says_why_it_is_one(path):
    text = path.read_text()
    if text.count("\n") <= LIMIT:
        return
    docstring = ast.get_docstring(ast.parse(text)) or ""
    assert "though long:" in docstring, f"{path}: {text.count(chr(10))} lines and no reason in its docstring"


def test_the_limit_is_met_by_most_modules():
    long = [p for p in MODULES if p.read_text().count("\n") > LIMIT]
    assert len(long) <= len(MODULES) // 5, long
