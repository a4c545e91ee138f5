"""The `rewrite` command: exit codes, messages, clean output, atomic writes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rewrite
from rewrite.backends.mil import count_ops, load_mlpackage
from rewrite.backends.mil.reference import evaluate

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "rmsnorm_symbolic.mlpackage"


def run(*arguments, cwd=None):
    environment = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    return subprocess.run(
        [sys.executable, "-m", "rewrite.cli", *map(str, arguments)],
        capture_output=True, text=True, cwd=cwd or REPO, env=environment, timeout=300,
    )


@pytest.fixture
def example(tmp_path):
    copy = tmp_path / "model.mlpackage"
    shutil.copytree(EXAMPLE, copy)
    return copy


def test_apply_on_the_bundled_example(example, tmp_path):
    output = tmp_path / "out.mlpackage"
    result = run("apply", example, "-o", output)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no coremltools import noise, no progress bars
    assert re.search(r"^remove_broadcast_tiles +fired 1$", result.stdout, re.M)
    before, _ = load_mlpackage(example)
    after, _ = load_mlpackage(output)
    assert count_ops(before, "tile") == 1 and count_ops(after, "tile") == 0
    assert count_ops(after) == count_ops(before) - 2  # the tile and its reps
    for rows in (1, 6):
        inputs = {"x": np.random.default_rng(rows).normal(size=(rows, 16))}
        np.testing.assert_allclose(evaluate(after, inputs)["y"], evaluate(before, inputs)["y"], rtol=1e-6)


def test_json_statistics(example, tmp_path):
    result = run("apply", example, "-o", tmp_path / "out.mlpackage", "--json")
    document = json.loads(result.stdout)
    assert document["rules"]["remove_broadcast_tiles"]["fires"] == 1
    assert document["ops_before"] - document["ops_after"] == 2


def test_input_is_never_overwritten_unless_asked(example):
    result = run("apply", example, "-o", example)
    assert result.returncode == 2
    assert "refusing to overwrite the input" in result.stderr
    assert count_ops(load_mlpackage(example)[0], "tile") == 1
    result = run("apply", example, "--in-place")
    assert result.returncode == 0, result.stderr
    assert count_ops(load_mlpackage(example)[0], "tile") == 0


def test_a_bad_rules_file_is_exit_2_with_file_line_col(example, tmp_path):
    rules = tmp_path / "bad.rules"
    rules.write_text('dialect mil\nrule r "d"\n  match %t = tlie(x=%x)\n  rewrite %t -> %x\n')
    output = tmp_path / "out.mlpackage"
    result = run("apply", "--rules", rules, example, "-o", output)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"{rules}:3:14: error: unknown mil op or class 'tlie'" in result.stderr
    assert "\n" + " " * (2 + 13) + "^\n" in result.stderr
    assert not output.exists()


@pytest.mark.parametrize("make_input, message", [
    (lambda d: d / "missing.mlpackage", "no such file or directory"),
    (lambda d: _corrupt(d), "not a Core ML model"),
    (lambda d: _write(d / "model.onnx", b"\x00garbage"), "not a readable ONNX model"),
    (lambda d: _write(d / "model.txt", b"hello"), "unknown model format"),
])
def test_bad_inputs_are_one_line_and_leave_nothing_behind(tmp_path, make_input, message):
    source = make_input(tmp_path)
    output = tmp_path / ("out" + (source.suffix or ".mlpackage"))
    before = sorted(p.name for p in tmp_path.iterdir())
    result = run("apply", source, "-o", output)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert message in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def _corrupt(directory: Path) -> Path:
    path = directory / "corrupt.mlpackage"
    path.mkdir()
    (path / "Manifest.json").write_text('{"truncated": ')
    return path


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_failed_save_leaves_no_partial_output(example, tmp_path, monkeypatch):
    from rewrite import cli
    from rewrite.backends import mil

    def failing_save(program, path, spec=None):
        Path(path).mkdir()
        (Path(path) / "partial").write_text("half")
        raise OSError("disk full")

    monkeypatch.setattr(mil, "save_mlpackage", failing_save)
    output = tmp_path / "out.mlpackage"
    assert cli.main(["apply", str(example), "-o", str(output)]) == 2
    assert not output.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["model.mlpackage"]


def test_unknown_rule_name(example, tmp_path):
    result = run("apply", example, "-o", tmp_path / "o.mlpackage", "--rule", "no_such_rule")
    assert result.returncode == 2 and "no rule named 'no_such_rule'" in result.stderr


def test_check_command(tmp_path):
    # One folder: tests/language checks (and builds the examples of) the whole library in-process.
    assert run("check", REPO / "rules" / "onnx").returncode == 0
    bad = tmp_path / "bad.rules"
    bad.write_text('dialect mil\nrule r "d" match %t = tile(z=%x) rewrite %t -> %x\n')
    result = run("check", bad)
    assert result.returncode == 2  # rules that do not load: exit 2, for check as for every command
    assert f"{bad}:2:28: error: op 'tile' has no operand 'z'" in result.stderr


def test_explain_on_mil_and_onnx_never_changes_the_model(example, tmp_path):
    before = sorted((p.relative_to(example), p.read_bytes()) for p in example.rglob("*") if p.is_file())
    result = run("explain", REPO / "rules", example)
    assert result.returncode == 0, result.stderr
    assert "remove_broadcast_tiles @ inverse_rms_tiled  FIRES" in result.stdout
    assert sorted((p.relative_to(example), p.read_bytes()) for p in example.rglob("*") if p.is_file()) == before

    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Expand", ["m", "s"], ["e"], name="widen"),
             helper.make_node("Mul", ["e", "y"], ["out"], name="scale")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 16]),
                                           helper.make_tensor_value_info("m", TensorProto.FLOAT, [1, 16]),
                                           helper.make_tensor_value_info("y", TensorProto.FLOAT, ["c", 16])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [None, 16])])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    data = path.read_bytes()
    result = run("explain", REPO / "rules", path, "--json", "--rule", "remove_broadcast_expand")
    assert result.returncode == 0, result.stderr
    (item,) = json.loads(result.stdout)
    assert item["anchor"] == "widen" and not item["fired"] and item["truth"] == "unknown"
    assert item["values"] == ["aligned_dim(other, axis, of=%e) = c", "dim(%e, axis) = b"]
    assert "%u = scale" in item["path"] and "axis = 0" in item["path"]
    assert path.read_bytes() == data
    assert run("explain", REPO / "rules", path, "--rule", "nope").returncode == 2


def test_check_reports_warnings_but_exits_0_and_filters_by_backend(tmp_path):
    rules = tmp_path / "w.rules"
    rules.write_text('dialect mil\nrule r "d"\n  match %t = tile(x=%x, reps=%unused)\n  rewrite %t -> %x\n')
    result = run("check", rules)
    assert result.returncode == 0
    assert f"{rules}:3:30: warning: '%unused' is bound but never used" in result.stderr
    assert "1 warning(s)" in result.stdout
    only_onnx = run("check", REPO / "rules", "--backend", "onnx")
    onnx_rules = len(rewrite.load_rules(REPO / "rules", dialects=["onnx"]).rules)
    assert only_onnx.returncode == 0 and only_onnx.stdout.startswith(f"{onnx_rules} rule(s)")


def _big_onnx(path: Path, nodes: int) -> None:
    import onnx
    from onnx import TensorProto, helper

    chain = [helper.make_node("Relu", [f"v{i}"], [f"v{i + 1}"]) for i in range(nodes)]
    graph = helper.make_graph(chain, "g", [helper.make_tensor_value_info("v0", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info(f"v{nodes}", TensorProto.FLOAT, [4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))


def test_progress_shows_on_a_terminal_for_big_models_only(tmp_path):
    import os
    import pty

    big = tmp_path / "big.onnx"
    _big_onnx(big, 12_000)
    # A pipe is no terminal: no bar, whatever the size.
    piped = run("apply", big, "-o", tmp_path / "out.onnx")
    assert piped.returncode == 0 and piped.stderr == ""

    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "rewrite.cli", "apply", str(big), "-o", str(tmp_path / "out2.onnx")],
        stdout=subprocess.DEVNULL, stderr=terminal, cwd=REPO,
        env={k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"},
    )
    os.close(terminal)
    shown = b""
    try:
        while chunk := os.read(controller, 65536):  # read while it runs: a pty buffer is small
            shown += chunk
    except OSError:  # EIO once the process has closed its end
        pass
    finally:
        os.close(controller)
    assert process.wait(timeout=300) == 0
    assert b"sweep 1" in shown and b"op/s" in shown


def test_the_test_command_runs_examples(tmp_path):
    # One folder of the library: tests/rules runs every shipped example in-process.
    folder = REPO / "rules" / "onnx"
    examples = sum(len(rule.examples) for rule in rewrite.load_rules(folder).rules)
    result = run("test", folder)
    assert result.returncode == 0, result.stdout + result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last == f"{examples} passed, 0 failed" and examples >= 5
    bad = tmp_path / "bad.rules"
    bad.write_text(
        'dialect mil\nrule r "d"\n  match %y = exp(x=%x)\n  rewrite %y -> %x\n'
        '  example "e"\n    input %x: fp32[4]\n    %y = exp(x=%x)\n    output %y\n  unchanged\n'
    )
    failing = run("test", bad)
    assert failing.returncode == 1 and "FAIL  r: e" in failing.stdout


def test_verify_command(tmp_path):
    # One file of the library: tests/test_verify.py verifies every shipped rule in-process.
    result = run("verify", REPO / "rules" / "mil" / "remove_broadcast_tiles.rules", "--trials", "20", "--seed", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("FAIL") == 0 and result.stdout.count("PASS") == 3
    unsound = tmp_path / "unsound.rules"
    unsound.write_text('dialect mil\nrule drop "drops every tile"\n  match %t = tile(x=%x, reps=_)\n'
                       '  where every use %u of %t: %u is mul(%t, _) in any order\n  rewrite %t -> %x\n')
    failing = run("verify", unsound, "--trials", "40")
    assert failing.returncode == 1
    assert "FAIL  drop" in failing.stdout and "counterexample" in failing.stdout
