"""`rewrite check` builds every example: one the backend cannot build is an
error at file:line:col with a caret, not a failure `rewrite test` finds first."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import rewrite
from rewrite.examples import example_errors

RULE = """
dialect mil
rule fold_relu "relu(relu(x)) is relu(x)"
  match %o = relu(x=%i = relu(x=_))
  rewrite %o -> %i
  example "{description}"
    input %x: fp32[2, 3]
    input %y: fp32[{y}]
    %i = relu(x=%x)
    %s = add(x=%i, y=%y)
    %o = relu(x=%s)
    output %o
  unchanged
"""


def _check(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rewrite.cli", "check", path.name], capture_output=True,
                          text=True, cwd=path.parent, env=dict(os.environ), timeout=300)


def test_an_example_the_backend_refuses_is_a_check_error_at_the_refused_op(write_rules):
    path = write_rules(RULE.format(description="shapes that do not broadcast", y="4"))
    result = _check(path)
    assert result.returncode == 1
    assert result.stderr.startswith(
        "test.rules:9:10: error: example 'shapes that do not broadcast' cannot be built: Incompatible dim"
    )
    assert "\n      %s = add(x=%i, y=%y)\n           ^\n" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_an_example_that_builds_passes_check(write_rules):
    result = _check(write_rules(RULE.format(description="broadcasting shapes", y="3")))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1 rule(s) in 1 file(s): no errors"


def test_a_becomes_graph_that_cannot_be_built_is_an_error(write_rules):
    text = """
        dialect mil
        rule r "relu(relu(x)) is relu(x)"
          match %o = relu(x=%i = relu(x=_))
          rewrite %o -> %i
          example "e"
            input %x: fp32[2, 3]
            %i = relu(x=%x)
            %o = relu(x=%i)
            output %o
          becomes
            %o = tile(x=%x, reps=[1, 2, 3])
        """
    (error,) = example_errors(rewrite.load_rules(write_rules(text)).rules)
    assert (error.span.line, error.span.column) == (11, 10)
    assert error.message.startswith("the 'becomes' graph of example 'e' cannot be built: ")
    assert error.source_line.strip() == "%o = tile(x=%x, reps=[1, 2, 3])"


def test_an_operand_that_evaluates_to_no_constant_is_a_check_error(write_rules):
    text = """
        dialect mil
        rule r "relu(relu(x)) is relu(x)"
          match %o = relu(x=%i = relu(x=_))
          rewrite %o -> %i
          example "e"
            input %x: fp16[2]
            %i = relu(x=%x)
            %o = relu(x=%i)
            %p = add(x=%o, y=as_dtype(sqrt(0 - 1), fp16))
            output %p
          unchanged
        """
    # It loads (the checker cannot know sqrt's argument is negative); building finds it.
    (error,) = example_errors(rewrite.load_rules(write_rules(text)).rules)
    assert str(error.span).endswith("test.rules:9:22")
    assert error.message == "this example operand does not evaluate to a constant"


def test_an_input_dtype_the_op_does_not_take_is_a_check_error(write_rules):
    # `sin` takes floats: an int32 input is a dtype the backend refuses.
    text = """
        dialect mil
        rule r "sin(sin(x))"
          match %o = sin(x=%i = sin(x=_))
          rewrite %o -> %i
          example "an int32 sine"
            input %x: int32[2]
            %i = sin(x=%x)
            %o = sin(x=%i)
            output %o
          unchanged
        """
    (error,) = example_errors(rewrite.load_rules(write_rules(text)).rules)
    assert (error.span.line, error.span.column) == (7, 10)
    assert "example 'an int32 sine' cannot be built" in error.message


def test_the_shipped_examples_all_build_and_quickly():
    rules = rewrite.load_rules().rules
    started = time.perf_counter()
    assert example_errors(rules) == []
    # Building is per example and cheap next to loading; a generous bound
    # for a loaded machine, against building being made to run things.
    assert time.perf_counter() - started < 30

