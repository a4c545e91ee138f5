"""docs/language.md stays true: its rule snippets load, and it lists every builtin."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

import rewrite
from rewrite.language.types import BUILTINS

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "language.md").read_text()
SNIPPETS = re.findall(r"```rules\n(.*?)```", DOC, flags=re.S)
# The snippets that stand for a file of their own name, for others to import.
NAMED = {m.group(1): s for s in SNIPPETS if (m := re.match(r"# file: (\S+)", s))}


@pytest.fixture
def documented_predicate():
    # The one the docs register from Python before using it.
    rewrite.register_predicate("is_weight", "value")(lambda context, value: None)
    yield
    rewrite.unregister_predicate("is_weight")


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[f"snippet{i}" for i in range(len(SNIPPETS))])
def test_every_rules_snippet_loads(tmp_path, snippet, documented_predicate):
    # Snippets import from the shipped library by file name, as rules beside it would.
    for library_file in (ROOT / "rules").glob("*/*.rules"):
        shutil.copy(library_file, tmp_path / library_file.name)
    for name, text in NAMED.items():
        (tmp_path / name).write_text(text)
    path = tmp_path / "snippet.rules"
    path.write_text(snippet)
    rewrite.load_rules(path)  # raises RuleError, with file:line:col, if it does not load


def test_every_builtin_is_documented():
    missing = [name for name in BUILTINS if f"`{name}(" not in DOC]
    assert not missing


@pytest.mark.parametrize("snippet", [s for s in SNIPPETS if "\n  example " in s],
                         ids=lambda s: re.search(r"rule (\w+)", s).group(1))
def test_the_examples_of_every_rules_snippet_pass(tmp_path, snippet):
    """What a snippet shows a rule doing (a constant built, a default read) it does."""
    from rewrite.examples import run_examples

    path = tmp_path / "snippet.rules"
    path.write_text(snippet)
    results = run_examples(rewrite.load_rules(path))
    assert results and all(result.passed for result in results), [r.message for r in results if not r.passed]


BAD_SNIPPETS = re.findall(r"```rules-bad\n(.*?)```\n\n```text\n(.*?)```", DOC, flags=re.S)


@pytest.mark.parametrize(("snippet", "shown"), BAD_SNIPPETS, ids=[f"bad{i}" for i in range(len(BAD_SNIPPETS))])
def test_every_error_the_docs_show_is_the_error_given(tmp_path, monkeypatch, snippet, shown):
    name = re.match(r"# file: (\S+)", snippet).group(1)
    (tmp_path / name).write_text(snippet)
    monkeypatch.chdir(tmp_path)  # file names show relative to the current folder
    with pytest.raises(rewrite.RuleError) as raised:
        rewrite.load_rules(name)
    assert raised.value.render() == shown.rstrip("\n")
