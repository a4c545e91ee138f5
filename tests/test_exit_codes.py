"""One exit-code convention for every command (`rewrite.cli.EXIT_CODES`):
0 nothing wrong; 1 a finding about the rules or the model; 2 something given
could not be read (a rules file that does not load, for `check` too; a
missing model; a bad option). Each case here is one command and one code."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rewrite import cli

OK, FINDING, UNREADABLE = cli.EXIT_OK, cli.EXIT_FINDINGS, cli.EXIT_USAGE

GOOD = """\
dialect onnx
rule drop_identity "Identity(x) is x."
  match %i = Identity(input=%x)
  where not block_output(%i)
  rewrite %i -> %x
  example "an identity inside"
    input %x: fp32[2]
    %i = Identity(input=%x)
    %y = Relu(X=%i)
    output %y
  becomes
    %y = Relu(X=%x)
"""
# Two syntax errors and, in a rule that parses, a type error: the syntax errors are what is reported.
BROKEN = """\
dialect onnx
rule a "d"
  match %i = Identity(input=%x
rule b "d"
  match %i = Identity(input=%x)
  rewrite %i -> 0.0
"""
UNTYPED = 'dialect onnx\nrule a "d"\n  match %i = Identity(nput=%x)\n  rewrite %i -> %x\n'
WITHOUT_EXAMPLES = 'dialect onnx\nrule a "d"\n  match %i = Identity(input=%x)\n  rewrite %i -> %x\n'
FAILING = GOOD.replace("  where not block_output(%i)\n", "  where rank(%x) == 3\n")
# An example the backend cannot build: an add of shapes that do not broadcast.
UNBUILDABLE = """\
dialect mil
rule fold_relu "relu(relu(x)) is relu(x)"
  match %o = relu(x=%i = relu(x=_))
  rewrite %o -> %i
  example "shapes that do not broadcast"
    input %x: fp32[2, 3]
    input %y: fp32[4]
    %s = add(x=%x, y=%y)
    %o = relu(x=%s)
    output %o
  unchanged
"""
# Drops any Expand: the shape guard refuses it where the rank grows (checked mode says so).
RECKLESS = 'dialect onnx\nrule drop_expand "d"\n  match %e = Expand(input=%x, shape=_)\n  rewrite %e -> %x\n'


@pytest.fixture
def files(tmp_path):
    def write(name: str, text: str):
        path = tmp_path / name
        path.write_text(text)
        return str(path)

    return write


@pytest.fixture
def model(tmp_path):
    """Expand [4] -> [1, 4] into an Add: no shipped rule fires; drop_expand's rewrite changes a rank."""
    nodes = [helper.make_node("Expand", ["x", "shape"], ["e"], name="widen"),
             helper.make_node("Add", ["e", "y"], ["out"], name="add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
                                           helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4])],
                              [numpy_helper.from_array(np.array([1, 4], dtype=np.int64), "shape")])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return str(path)


def _run(capsys, *arguments):
    code = cli.main([str(a) for a in arguments])
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------- check


def test_check(capsys, files):
    assert _run(capsys, "check", files("good.rules", GOOD))[0] == OK
    code, _, err = _run(capsys, "check", files("unbuildable.rules", UNBUILDABLE))
    assert code == FINDING and "cannot be built" in err
    assert err.splitlines()[-1] == "rewrite: error: 1 example the backend cannot build"


@pytest.mark.parametrize("name, text, errors", [("broken.rules", BROKEN, 2), ("untyped.rules", UNTYPED, 1)])
def test_every_command_exits_2_on_rules_that_do_not_load_check_included(capsys, files, model, name, text, errors):
    path = files(name, text)
    for command in (["check", path], ["test", path], ["verify", path, "--trials", "1"], ["explain", path, model],
                    ["apply", "--rules", path, model, "-o", model + ".out.onnx"]):
        code, _, err = _run(capsys, *command)
        assert code == UNREADABLE, command
        assert "Traceback" not in err
        lines = err.splitlines()
        assert len([line for line in lines if ": error: " in line and line.startswith(path)]) == errors
        assert lines[-1] == f"rewrite: error: {errors} error{'s' if errors > 1 else ''} in rules: they do not load"


def test_every_command_exits_2_on_a_path_that_is_not_there(capsys, tmp_path, model):
    missing = str(tmp_path / "missing.rules")
    for command in (["check", missing], ["test", missing], ["verify", missing], ["explain", missing, model],
                    ["apply", "--rules", missing, model, "-o", model + ".out.onnx"],
                    ["apply", str(tmp_path / "missing.onnx"), "-o", model + ".out.onnx"]):
        code, _, err = _run(capsys, *command)
        assert code == UNREADABLE and "Traceback" not in err, command


@pytest.mark.parametrize("option", [["verify", "--trials", "0"], ["apply", "--max-sweeps", "-1"],
                                    ["test", "--frobnicate"]])
def test_a_bad_option_exits_2(capsys, files, option):
    with pytest.raises(SystemExit) as raised:
        cli.main([option[0], files("good.rules", GOOD), *option[1:]])
    assert raised.value.code == UNREADABLE


# ---------------------------------------------------------------- test


def test_test_passes_fails_and_refuses_a_file_without_examples(capsys, files):
    code, out, _ = _run(capsys, "test", files("good.rules", GOOD))
    assert code == OK and out.splitlines()[-1] == "1 passed, 0 failed"
    assert _run(capsys, "test", files("failing.rules", FAILING))[0] == FINDING
    code, out, err = _run(capsys, "test", files("none.rules", WITHOUT_EXAMPLES))
    assert code == FINDING and out == ""
    assert err.strip() == (f"rewrite: error: no examples in {files('none.rules', WITHOUT_EXAMPLES)}: "
                           "nothing was tested (a rule carries them as 'example \"...\"')")
    both = [files("a.rules", WITHOUT_EXAMPLES), files("b.rules", WITHOUT_EXAMPLES.replace("rule a", "rule b"))]
    code, _, err = _run(capsys, "test", *both)
    assert code == FINDING and f"no examples in {both[0]}, {both[1]}" in err


def test_test_of_one_rule_without_examples_says_so(capsys, files):
    path = files("two.rules", GOOD + WITHOUT_EXAMPLES.replace("dialect onnx\n", "").replace("rule a", "rule bare"))
    code, _, err = _run(capsys, "test", path, "--rule", "bare")
    assert code == FINDING and "no examples in rule 'bare'" in err
    assert _run(capsys, "test", path, "--rule", "drop_identity")[0] == OK
    assert _run(capsys, "test", path, "--rule", "nope")[0] == UNREADABLE  # a bad option


# ---------------------------------------------------------------- explain


def test_explain(capsys, files, model):
    code, out, _ = _run(capsys, "explain", files("reckless.rules", RECKLESS), model)
    assert code == OK and "drop_expand @ widen  NOT FIRED" in out  # what it explains is no finding
    code, out, _ = _run(capsys, "explain", files("reckless.rules", RECKLESS), model, "--op", "add")
    assert code == OK and out.strip() == "no candidate anchors"  # an op of the model, no anchor
    code, _, err = _run(capsys, "explain", files("reckless.rules", RECKLESS), model, "--op", "wden")
    assert code == UNREADABLE and err.strip() == f"rewrite: error: {model} has no op named 'wden'"


# ---------------------------------------------------------------- apply


def test_apply(capsys, files, model, tmp_path):
    assert _run(capsys, "apply", model, "-o", tmp_path / "out.onnx")[0] == OK
    # The guard refuses drop_expand; with --check-types that refusal is the rule's error: a finding.
    output = tmp_path / "checked.onnx"
    code, _, err = _run(capsys, "apply", "--rules", files("reckless.rules", RECKLESS), model, "-o", output,
                        "--check-types")
    assert code == FINDING and "rule 'drop_expand'" in err and "nothing was written" in err
    assert not output.exists()


# ---------------------------------------------------------------- the convention is stated


def test_version_and_help_state_the_convention(capsys):
    with pytest.raises(SystemExit) as raised:
        cli.main(["--version"])
    assert raised.value.code == 0 and capsys.readouterr().out.strip() == f"rewrite {metadata.version('rewrite')}"
    for command in ([], ["check"], ["test"], ["verify"], ["explain"], ["apply"]):
        with pytest.raises(SystemExit):
            cli.main([*command, "--help"])
        shown = capsys.readouterr().out
        assert "exit codes, the same for every command:" in shown
        assert "  1  a finding about the rules or the model" in shown
        assert "(for 'check' too)" in shown
    with pytest.raises(SystemExit):
        cli.main(["verify", "--help"])
    shown = capsys.readouterr().out
    assert "(default: 50)" in shown and "(default: 0)" in shown
    with pytest.raises(SystemExit):
        cli.main(["apply", "--help"])
    assert "(default: 32)" in capsys.readouterr().out.replace("\n", " ").replace("  ", " ")


def test_no_command_prints_a_traceback_for_unloadable_rules(files):
    result = subprocess.run([sys.executable, "-m", "rewrite.cli", "check", files("broken.rules", BROKEN)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == UNREADABLE and "Traceback" not in result.stderr
    assert result.stderr.count("^") == 2
