"""`explain` reads rules files to quote from as the loader reads them: a file that
is no longer a regular, bounded, UTF-8 file is the loader's one-line error, and
lines number as the parser numbered them."""

from __future__ import annotations

import os

import numpy as np
import pytest

import rewrite.language.loader as loader
from rewrite import RuleError
from rewrite.engine.explain import explain
from tests.engine.test_driver import TILES
from tests.engine.toy_ir import Graph, ToyAdapter, load_toy_rules


def _unmatched_graph():
    graph = Graph()
    x = graph.input("x", ("b", "c"))  # the last dim is a symbol, not 8: the rule does not fire
    y = graph.input("y", ("b", 1))
    tile = graph.op("tile", x=y, reps=graph.const(np.array([1, 8])), shape=("b", 8))
    graph.main.outputs = [graph.op("mul", x=x, y=tile, shape=("b", 8))]
    return graph


def _explain_after(path, change):
    rules = load_toy_rules(path).rules
    change()
    return explain(rules, ToyAdapter(_unmatched_graph()), {})


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_rules_file_that_became_a_fifo_is_refused_without_blocking(write_rules):
    path = write_rules(TILES)

    def to_fifo():
        path.unlink()
        os.mkfifo(path)

    with pytest.raises(RuleError) as raised:
        _explain_after(path, to_fifo)
    reason = "it is a FIFO (named pipe), not a regular file"
    assert str(raised.value) == f"{path}:1:1: error: cannot read rules file: {reason}"


def test_a_rules_file_that_is_no_longer_utf8_names_the_byte(write_rules):
    path = write_rules(TILES)
    with pytest.raises(RuleError) as raised:
        _explain_after(path, lambda: path.write_bytes(path.read_bytes() + b"# caf\xe9\n"))
    line = path.read_bytes().count(b"\n")  # the appended line, numbered from 1
    assert str(raised.value).startswith(f"{path}:{line}:6: error: cannot read rules file: not UTF-8: byte 0xe9")


def test_a_rules_file_that_grew_too_large_is_refused(write_rules, monkeypatch):
    path = write_rules(TILES)
    monkeypatch.setattr(loader, "MAX_RULES_FILE_BYTES", len(path.read_bytes()))
    with pytest.raises(RuleError, match="cannot read rules file: file too large"):
        _explain_after(path, lambda: path.write_bytes(path.read_bytes() + b"# more\n"))


@pytest.mark.parametrize("newline", ["\r\n", "\n"])
def test_lines_number_as_the_parser_numbers_them(write_rules, newline):
    # A lone carriage return in a comment is no line break to the parser; a
    # reader with universal newlines would quote every later line one off.
    text = TILES.replace("dialect toy\n", "dialect toy\n# a comment with a lone \r carriage return\n")
    path = write_rules("placeholder")
    path.write_bytes(("\ufeff" + text.lstrip("\n")).replace("\n", newline).encode("utf-8"))
    (item,) = explain(load_toy_rules(path).rules, ToyAdapter(_unmatched_graph()), {})
    assert item.failed == "aligned_dim(%other, axis, of=%t) == %reps[axis]"
    assert item.location.endswith("test.rules:13")
