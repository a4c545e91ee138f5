"""rewrite.output: a stopped, raced or failed write never leaves the user without a model.

The fault-injection tests stop `rewrite apply --in-place` at every step of
its write (tests/stopping.py) and check that the input is then either the
old model, byte for byte, or the new one, complete and computing the same
values. Never neither.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rewrite import output
from rewrite.backends.mil import count_ops, load_mlpackage
from rewrite.backends.mil.reference import evaluate
from tests.model_files import mil_package, onnx_model, onnx_op_count, onnx_outputs, tree_state, write_onnx
from tests.stopping import run_stopped

REPO = Path(__file__).resolve().parent.parent


def _onnx_case(folder: Path, external: bool):
    source = write_onnx(onnx_model(), folder / "model.onnx", data_name="model.onnx.data" if external else None)
    expected = onnx_outputs(source)

    def is_new() -> bool:
        if onnx_op_count(source, "Expand") != 0:
            return False
        np.testing.assert_allclose(onnx_outputs(source), expected, rtol=1e-6)
        return True

    return source, is_new


def _mil_case(folder: Path, external: bool):
    source = mil_package(folder)
    inputs = {"x": np.random.default_rng(3).normal(size=(3, 16))}
    expected = evaluate(load_mlpackage(source)[0], inputs)["y"]

    def is_new() -> bool:
        program = load_mlpackage(source)[0]
        if count_ops(program, "tile") != 0:
            return False
        np.testing.assert_allclose(evaluate(program, inputs)["y"], expected, rtol=1e-6)
        return True

    return source, is_new


CASES = {
    "onnx": (_onnx_case, False),
    "onnx-external-data": (_onnx_case, True),
    "mlpackage": (_mil_case, False),
}


@pytest.mark.parametrize("how", ["kill", "term"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_in_place_stopped_at_every_step_leaves_the_old_model_or_the_new_one(tmp_path, case, how):
    make, external = CASES[case]
    step = 0
    outcomes = []
    while True:
        step += 1
        folder = tmp_path / f"step{step}"
        folder.mkdir()
        source, is_new = make(folder, external)
        old = {p.name: tree_state(p) for p in folder.iterdir()}
        result = run_stopped(step, how, ["apply", str(source), "--in-place"], tmp_path / f"step{step}.log")
        assert "Traceback" not in result.stderr, result.stderr
        now = {p.name: tree_state(p) for p in folder.iterdir() if not p.name.startswith(output.STAGING_PREFIX)}
        if all(now.get(name) == state for name, state in old.items()):
            # The old model, intact. Only SIGKILL may leave a new, unreferenced data file beside it.
            assert how == "kill" or now == old, sorted(now)
            outcomes.append("old")
        else:
            assert is_new(), f"step {step}: the input is neither the old model nor the new one"
            outcomes.append("new")
            if how == "term":  # the old data went with the old model (SIGKILL may orphan it)
                assert len(now) == len(old), sorted(now)
        if how == "term":
            # Handlers ran: nothing staged is left behind, and the exit says why.
            assert not any(p.name.startswith(output.STAGING_PREFIX) for p in folder.iterdir())
            assert result.exit_code in (0, 128 + signal.SIGTERM), result.stderr
        else:
            assert result.exit_code in (0, -signal.SIGKILL), result.stderr
        if result.steps is not None and result.steps < step:
            break  # this run took every step without being stopped
        assert step < 40, "the write never finished"
    assert outcomes[0] == "old" and outcomes[-1] == "new"
    # Once the new model is in place it stays (no step puts the old one back).
    assert outcomes == sorted(outcomes, key=lambda outcome: outcome == "new")


# ------------------------------------------------------------ races


def _publish_many(folder: str, count: int, tag: str) -> None:
    target = output.resolve_target(
        Path(folder) / "out.mlpackage", package=True, input_path=Path(folder) / "input.mlpackage",
        input_files=(), in_place=False,
    )

    def write(path: Path) -> None:
        path.mkdir()
        (path / "Manifest.json").write_text(tag)
        (path / "payload").write_bytes(tag.encode() * 1000)

    for _ in range(count):
        output.publish(target, write)


def test_concurrent_writers_of_one_package_both_succeed(tmp_path):
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_publish_many, args=(str(tmp_path), 30, tag)) for tag in ("first", "second")]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=120)
    assert [writer.exitcode for writer in writers] == [0, 0]
    package = tmp_path / "out.mlpackage"
    tag = (package / "Manifest.json").read_text()
    assert tag in ("first", "second")
    assert (package / "payload").read_bytes() == tag.encode() * 1000  # one writer's whole package
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.mlpackage"]


def test_exchange_swaps_folders_whole(tmp_path):
    left, right = tmp_path / "left", tmp_path / "right"
    left.mkdir()
    right.mkdir()
    (left / "a").write_text("left")
    (right / "b").write_text("right")
    output.FILESYSTEM.exchange(left, right)
    assert (left / "b").read_text() == "right" and (right / "a").read_text() == "left"


def test_a_failing_writer_leaves_nothing(tmp_path):
    target = output.resolve_target(tmp_path / "out.onnx", package=False, input_path=tmp_path / "in.onnx",
                                   input_files=(), in_place=False)

    def write(path: Path) -> None:
        path.write_bytes(b"half")
        (path.parent / "out.onnx.data").write_bytes(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(output.OutputError, match="could not write the model"):
        output.publish(target, write)
    assert list(tmp_path.iterdir()) == []


def test_a_companion_name_in_use_is_never_replaced(tmp_path):
    (tmp_path / "out.onnx.data").write_bytes(b"someone else's")
    target = output.resolve_target(tmp_path / "out.onnx", package=False, input_path=tmp_path / "in.onnx",
                                   input_files=(), in_place=False)
    name = output.free_companion_name(target, ".data")
    assert name != "out.onnx.data" and name.startswith("out.onnx.") and name.endswith(".data")

    def write(path: Path) -> None:
        path.write_bytes(b"model")
        (path.parent / "out.onnx.data").write_bytes(b"ours")  # a writer that ignored the name

    with pytest.raises(output.OutputError, match="could not move the model into place"):
        output.publish(target, write)
    assert (tmp_path / "out.onnx.data").read_bytes() == b"someone else's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.onnx.data"]


def test_a_signal_while_writing_removes_the_staging_folder(tmp_path):
    script = (
        "import os, signal, sys, time\n"
        "from pathlib import Path\n"
        "from rewrite import output\n"
        "folder = Path(sys.argv[1])\n"
        "target = output.resolve_target(folder / 'out.onnx', package=False, input_path=folder / 'in.onnx',"
        " input_files=(), in_place=False)\n"
        "def write(path):\n"
        "    path.write_bytes(b'partial')\n"
        "    print('writing', flush=True)\n"
        "    time.sleep(60)\n"
        "with output.terminating_signals_unwind():\n"
        "    try:\n"
        "        output.publish(target, write)\n"
        "    except output.Terminated as stop:\n"
        "        sys.exit(128 + stop.signal_number)\n"
        "    except KeyboardInterrupt:\n"
        "        sys.exit(130)\n"
    )
    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        process = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE,
                                   text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert process.stdout.readline() == "writing\n"
        process.send_signal(number)
        assert process.wait(timeout=60) == 128 + number
        assert list(tmp_path.iterdir()) == []
