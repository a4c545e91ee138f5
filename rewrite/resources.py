"""Where the grammar and the shipped rule library live.

In a source checkout they sit at the repository root; in an installed wheel
they are packaged inside `rewrite/` (see pyproject.toml). Both layouts are
looked up here and nowhere else.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _first_existing(*candidates: Path) -> Path:
    for candidate in candidates:
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"none of {', '.join(map(str, candidates))} exists")


def grammar_path() -> Path:
    return _first_existing(_PACKAGE / "grammar.lark", _PACKAGE.parent / "grammar.lark")


def grammar_text() -> str:
    return grammar_path().read_text(encoding="utf-8")


def rules_path() -> Path:
    """The shipped rule library (a folder of `.rules` files)."""
    return _first_existing(_PACKAGE / "rules", _PACKAGE.parent / "rules")
