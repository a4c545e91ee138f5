"""Shared fixtures. Tests mirror the package: tests/language, tests/engine, tests/backends, tests/rules."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import pytest

logging.getLogger("coremltools").setLevel(logging.ERROR)

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def write_rules(tmp_path):
    """Write a rules file (dedented) into a temp folder and return its path."""

    def write(text: str, name: str = "test.rules") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        return path

    return write
