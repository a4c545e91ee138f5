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


# ------------------------------------------------------------ leftovers are named


def _file_target(folder: Path, name: str = "out.onnx") -> output.Target:
    return output.resolve_target(folder / name, package=False, input_path=folder / "in.onnx",
                                 input_files=(), in_place=False)


def _package_target(folder: Path) -> output.Target:
    return output.resolve_target(folder / "out.mlpackage", package=True, input_path=folder / "in.mlpackage",
                                 input_files=(), in_place=False)


def _write_package(tag: str):
    def write(path: Path) -> None:
        path.mkdir()
        (path / "Manifest.json").write_text(tag)

    return write


def _staging_folders(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.startswith(output.STAGING_PREFIX)]


def test_remove_tree_removes_what_it_can_and_raises_for_what_stays(tmp_path, monkeypatch):
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    for name in ("a", "stuck", "b"):
        (tree / "sub" / name).write_text(name)
    unlink = os.unlink

    def stuck_unlink(path, *args, **options):
        if os.fsdecode(path).endswith("stuck"):
            raise PermissionError(13, "Permission denied", os.fsdecode(path))
        return unlink(path, *args, **options)

    monkeypatch.setattr(os, "unlink", stuck_unlink)
    with pytest.raises(PermissionError):
        output.FILESYSTEM.remove_tree(tree)
    assert sorted(p.name for p in tree.rglob("*")) == ["stuck", "sub"]
    monkeypatch.setattr(os, "unlink", unlink)
    output.FILESYSTEM.remove_tree(tree)  # nothing stuck: gone, no error
    assert not tree.exists()
    output.FILESYSTEM.remove_tree(tree)  # already gone is no error either


@pytest.mark.parametrize("failure", ["raises", "silent"])
def test_a_staging_folder_left_after_a_replace_is_named(tmp_path, monkeypatch, failure):
    target = _package_target(tmp_path)
    output.publish(target, _write_package("old"))
    target = _package_target(tmp_path)

    def refuse(path):
        if failure == "raises":
            raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(output.FILESYSTEM, "remove_tree", refuse)
    warnings = []
    output.publish(target, _write_package("new"), warn=warnings.append)
    assert (tmp_path / "out.mlpackage" / "Manifest.json").read_text() == "new"
    [left] = _staging_folders(tmp_path)
    [warning] = warnings
    assert str(left) in warning and "safe to delete" in warning
    assert ("(Permission denied)" in warning) == (failure == "raises")


def test_a_staging_folder_left_after_a_failed_write_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(output.FILESYSTEM, "remove_tree", lambda path: None)

    def write(path: Path) -> None:
        path.write_bytes(b"half")
        raise OSError(28, "No space left on device")

    warnings = []
    with pytest.raises(output.OutputError, match="could not write the model"):
        output.publish(_file_target(tmp_path), write, warn=warnings.append)
    [left] = _staging_folders(tmp_path)
    assert [str(left) in w for w in warnings] == [True]
    assert not (tmp_path / "out.onnx").exists()


def test_the_default_warning_goes_to_stderr(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(output.FILESYSTEM, "remove_tree", lambda path: None)
    output.publish(_file_target(tmp_path), lambda path: path.write_bytes(b"model"))
    [left] = _staging_folders(tmp_path)
    captured = capsys.readouterr()
    assert captured.err.startswith(f"rewrite: warning: could not remove the staging folder {left}")
    assert captured.out == ""


def test_a_companion_that_cannot_be_unlinked_after_a_failed_move_is_named(tmp_path, monkeypatch):
    def write(path: Path) -> None:
        path.write_bytes(b"model")
        (path.parent / "out.onnx.data").write_bytes(b"data")

    def refuse_replace(source, destination):
        raise OSError(5, "Input/output error", str(destination))

    def refuse_remove(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(output.FILESYSTEM, "replace", refuse_replace)
    monkeypatch.setattr(output.FILESYSTEM, "remove", refuse_remove)
    warnings = []
    with pytest.raises(output.OutputError, match="could not move the model into place"):
        output.publish(_file_target(tmp_path), write, warn=warnings.append)
    companion = tmp_path / "out.onnx.data"
    assert companion.read_bytes() == b"data" and not (tmp_path / "out.onnx").exists()
    [warning] = warnings
    assert f"could not remove {companion} (Permission denied)" in warning
    assert _staging_folders(tmp_path) == []  # the staging folder itself did go


def test_an_obsolete_data_file_that_cannot_be_removed_is_named(tmp_path, monkeypatch):
    old_data = tmp_path / "old.data"
    old_data.write_bytes(b"old weights")
    gone = tmp_path / "gone.data"  # already removed by someone: nothing to say

    def refuse_remove(path):
        if path == old_data:
            raise PermissionError(13, "Permission denied", str(path))
        raise FileNotFoundError(2, "No such file or directory", str(path))

    monkeypatch.setattr(output.FILESYSTEM, "remove", refuse_remove)
    warnings = []
    output.publish(_file_target(tmp_path), lambda path: path.write_bytes(b"model"),
                   obsolete=[old_data, gone], warn=warnings.append)
    assert (tmp_path / "out.onnx").read_bytes() == b"model"
    [warning] = warnings
    assert f"could not remove {old_data} (Permission denied)" in warning
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.data", "out.onnx"]


def test_nothing_is_warned_when_everything_is_cleaned_up(tmp_path):
    old_data = tmp_path / "old.data"
    old_data.write_bytes(b"old weights")
    warnings = []
    output.publish(_file_target(tmp_path), lambda path: path.write_bytes(b"model"), obsolete=[old_data],
                   warn=warnings.append)
    output.publish(_package_target(tmp_path), _write_package("one"), warn=warnings.append)
    output.publish(_package_target(tmp_path), _write_package("two"), warn=warnings.append)
    assert warnings == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.mlpackage", "out.onnx"]


def _exchange_by_renames_failing(monkeypatch, failing) -> list[tuple[str, str]]:
    """No atomic exchange on this "filesystem", and the renames numbered in `failing` fail."""
    monkeypatch.setattr(output, "_rename_flags", lambda source, destination, how: False)
    rename = os.rename
    calls = []

    def failing_rename(source, destination):
        calls.append((Path(source).name, Path(destination).name))
        if len(calls) in failing:
            raise OSError(5, "Input/output error", str(destination))
        rename(source, destination)

    monkeypatch.setattr(os, "rename", failing_rename)
    return calls


def test_an_exchange_by_renames_that_cannot_be_undone_keeps_the_old_package(tmp_path, monkeypatch):
    output.publish(_package_target(tmp_path), _write_package("old"))
    # The new package's rename fails, and so does putting the old one back.
    calls = _exchange_by_renames_failing(monkeypatch, failing={2, 3})
    warnings = []
    with pytest.raises(output.OutputError, match="nor put the replaced package back") as raised:
        output.publish(_package_target(tmp_path), _write_package("new"), warn=warnings.append)
    monkeypatch.undo()
    assert calls[0] == ("out.mlpackage", "out.mlpackage.replaced") and len(calls) == 3
    [staging] = _staging_folders(tmp_path)
    parked = staging / "out.mlpackage.replaced"
    assert (parked / "Manifest.json").read_text() == "old"  # the only copy of the old model, kept
    assert str(parked) in str(raised.value)
    assert not (tmp_path / "out.mlpackage").exists() and warnings == []


def test_an_exchange_by_renames_that_fails_puts_the_old_package_back(tmp_path, monkeypatch):
    output.publish(_package_target(tmp_path), _write_package("old"))
    calls = _exchange_by_renames_failing(monkeypatch, failing={2})  # the new package's rename into place
    with pytest.raises(output.OutputError, match=r"could not move the model into place \(Input/output error\)$"):
        output.publish(_package_target(tmp_path), _write_package("new"))
    monkeypatch.undo()
    assert len(calls) == 3
    assert (tmp_path / "out.mlpackage" / "Manifest.json").read_text() == "old"
    assert _staging_folders(tmp_path) == []


def test_modes_that_cannot_be_set_are_an_output_error_and_leave_nothing(tmp_path, monkeypatch):
    def refuse(path, mode, *args, **options):
        raise PermissionError(1, "Operation not permitted", str(path))

    monkeypatch.setattr(os, "chmod", refuse)
    with pytest.raises(output.OutputError, match=r"could not set the output's modes \(Operation not permitted\)"):
        output.publish(_file_target(tmp_path), lambda path: path.write_bytes(b"model"))
    assert list(tmp_path.iterdir()) == []
