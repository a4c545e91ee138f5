"""`rewrite apply`'s promises about files, each tried the way a user would break it.

Every test here names a way the user's data was lost or changed before, and
checks the files on disk afterwards, byte for byte.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import rewrite
from rewrite import cli
from rewrite.backends.mil import count_ops, load_mlpackage
from tests.model_files import (
    folder_state,
    mil_package,
    onnx_model,
    onnx_op_count,
    onnx_outputs,
    tree_state,
    write_onnx,
)


def run(*arguments, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "rewrite.cli", *map(str, arguments)],
        capture_output=True, text=True, cwd=cwd, timeout=300,
    )


def assert_one_line_error(result, *fragments):
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture
def onnx_input(tmp_path):
    return write_onnx(onnx_model(), tmp_path / "model.onnx")


# ------------------------------------------------------------ -o is a folder


def test_output_onto_the_folder_holding_the_input_is_refused(tmp_path):
    box = tmp_path / "box.onnx"
    box.mkdir()
    source = write_onnx(onnx_model(), box / "in.onnx")
    (box / "notes.txt").write_text("mine")
    before = folder_state(tmp_path)
    assert_one_line_error(run("apply", source, "-o", box), "is a directory")
    assert folder_state(tmp_path) == before


def test_output_onto_a_folder_named_like_a_model_file_is_refused(tmp_path, onnx_input):
    folder = tmp_path / "some_dir.onnx"
    folder.mkdir()
    (folder / "keep.txt").write_text("keep")
    before = folder_state(tmp_path)
    assert_one_line_error(run("apply", onnx_input, "-o", folder), "is a directory")
    assert folder_state(tmp_path) == before


def test_output_onto_a_folder_that_is_not_a_package_is_refused(tmp_path):
    source = mil_package(tmp_path)
    folder = tmp_path / "existing.mlpackage"
    folder.mkdir()
    (folder / "photo.jpg").write_bytes(b"\xff\xd8")
    before = folder_state(tmp_path)
    assert_one_line_error(run("apply", source, "-o", folder), "is not an .mlpackage")
    assert folder_state(tmp_path) == before


def test_output_onto_a_file_named_like_a_package_is_refused(tmp_path):
    source = mil_package(tmp_path)
    (tmp_path / "file.mlpackage").write_text("not a package")
    before = folder_state(tmp_path)
    assert_one_line_error(run("apply", source, "-o", tmp_path / "file.mlpackage"), "is a file")
    assert folder_state(tmp_path) == before


def test_an_earlier_output_package_is_replaced_whole(tmp_path):
    source = mil_package(tmp_path)
    output = tmp_path / "out.mlpackage"
    assert run("apply", source, "-o", output).returncode == 0
    (output / "stale.txt").write_text("from the last run")
    result = run("apply", source, "-o", output)
    assert result.returncode == 0, result.stderr
    assert not (output / "stale.txt").exists()
    assert count_ops(load_mlpackage(output)[0], "tile") == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.mlpackage", "out.mlpackage"]


def test_a_replaced_package_whose_old_tree_cannot_be_removed_is_named_in_a_warning(tmp_path, monkeypatch, capsys):
    from rewrite import output as output_module
    from rewrite.backends.mil.reference import evaluate

    source = mil_package(tmp_path)
    output = tmp_path / "out.mlpackage"
    assert cli.main(["apply", str(source), "-o", str(output)]) == 0
    capsys.readouterr()
    (output / "stale.txt").write_text("from the last run")

    def refuse(path):
        raise PermissionError(13, "Permission denied", str(path))

    # As root, no mode stops a removal: make the removal itself fail.
    monkeypatch.setattr(output_module.FILESYSTEM, "remove_tree", refuse)
    assert cli.main(["apply", str(source), "-o", str(output)]) == 0
    error = capsys.readouterr().err
    left = [p for p in tmp_path.iterdir() if p.name.startswith(output_module.STAGING_PREFIX)]
    assert len(left) == 1
    assert f"rewrite: warning: could not remove the staging folder {left[0]} (Permission denied)" in error
    assert "Traceback" not in error
    assert (left[0] / "out.mlpackage" / "stale.txt").exists()  # what it holds is the replaced package
    # The new package is in place, whole, and computes what the input does.
    assert not (output / "stale.txt").exists()
    inputs = {"x": np.random.default_rng(5).normal(size=(3, 16))}
    before, after = load_mlpackage(source)[0], load_mlpackage(output)[0]
    assert count_ops(before, "tile") == 1 and count_ops(after, "tile") == 0
    assert count_ops(after) < count_ops(before)
    np.testing.assert_allclose(evaluate(after, inputs)["y"], evaluate(before, inputs)["y"], rtol=1e-6)


def test_a_replaced_package_gives_no_warning_when_its_old_tree_goes(tmp_path, capsys):
    from rewrite import output as output_module

    source = mil_package(tmp_path)
    output = tmp_path / "out.mlpackage"
    assert cli.main(["apply", str(source), "-o", str(output)]) == 0
    assert cli.main(["apply", str(source), "-o", str(output)]) == 0
    assert "warning" not in capsys.readouterr().err
    assert not any(p.name.startswith(output_module.STAGING_PREFIX) for p in tmp_path.iterdir())


def test_output_inside_the_input_package_or_around_it_is_refused(tmp_path):
    outer = mil_package(tmp_path, "outer.mlpackage")
    inner = mil_package(outer, "inner.mlpackage")
    before = folder_state(tmp_path)
    assert_one_line_error(run("apply", inner, "-o", outer), "contains the input")
    assert_one_line_error(run("apply", outer, "-o", outer / "Data" / "x.mlpackage"), "inside the input")
    assert folder_state(tmp_path) == before


# ------------------------------------------------------------ external data


def test_the_inputs_external_data_is_never_overwritten(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    # The input's weights sit where the output's data file would go by default.
    source = write_onnx(onnx_model(), folder / "model.onnx", data_name="out.onnx.data")
    expected = onnx_outputs(source)
    before = folder_state(folder)
    result = run("apply", source, "-o", folder / "out.onnx")
    assert result.returncode == 0, result.stderr
    after = folder_state(folder)
    assert {name: after[name] for name in before} == before
    np.testing.assert_array_equal(onnx_outputs(source), expected)  # the input still loads
    np.testing.assert_allclose(onnx_outputs(folder / "out.onnx"), expected, rtol=1e-6)
    assert onnx_op_count(folder / "out.onnx", "Expand") == 0
    new_files = sorted(set(after) - set(before))
    assert new_files[0] == "out.onnx" and len(new_files) == 2  # the model and its own data
    onnx.checker.check_model(str(folder / "out.onnx"), full_check=True)


def test_output_onto_the_inputs_data_file_is_refused(tmp_path):
    source = write_onnx(onnx_model(), tmp_path / "model.onnx", data_name="weights.onnx")
    before = folder_state(tmp_path)
    assert_one_line_error(run("apply", source, "-o", tmp_path / "weights.onnx"), "part of the input model")
    assert folder_state(tmp_path) == before


def test_new_files_get_the_modes_a_plain_write_gives(tmp_path):
    source = write_onnx(onnx_model(), tmp_path / "model.onnx", data_name="model.onnx.data")
    output = tmp_path / "out.onnx"
    previous = os.umask(0o022)
    try:
        assert cli.main(["apply", str(source), "-o", str(output)]) == 0
        package = mil_package(tmp_path)
        assert cli.main(["apply", str(package), "-o", str(tmp_path / "out.mlpackage")]) == 0
    finally:
        os.umask(previous)
    assert stat.S_IMODE(output.stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "out.onnx.data").stat().st_mode) == 0o644
    for entry in [tmp_path / "out.mlpackage", *(tmp_path / "out.mlpackage").rglob("*")]:
        assert stat.S_IMODE(entry.stat().st_mode) == (0o755 if entry.is_dir() else 0o644), entry


def test_in_place_with_external_data_swaps_the_pair(tmp_path):
    source = write_onnx(onnx_model(), tmp_path / "model.onnx", data_name="model.onnx.data")
    os.chmod(source, 0o640)
    expected = onnx_outputs(source)
    result = run("apply", source, "--in-place")
    assert result.returncode == 0, result.stderr
    assert onnx_op_count(source, "Expand") == 0
    np.testing.assert_allclose(onnx_outputs(source), expected, rtol=1e-6)
    # The old data file went with the old model; the new one has another name.
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 2 and names[0] == "model.onnx" and names[1] != "model.onnx.data", names
    assert stat.S_IMODE(source.stat().st_mode) == 0o640  # the replaced file's mode is kept
    # A second run takes the conventional name back.
    assert run("apply", source, "--in-place").returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.data"]
    np.testing.assert_allclose(onnx_outputs(source), expected, rtol=1e-6)


def test_replacing_an_earlier_output_removes_its_data_but_never_the_inputs(tmp_path):
    source = write_onnx(onnx_model(), tmp_path / "model.onnx", data_name="model.onnx.data")
    output = tmp_path / "out.onnx"
    assert run("apply", source, "-o", output).returncode == 0
    assert run("apply", source, "-o", output).returncode == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[:2] == ["model.onnx", "model.onnx.data"] and len(names) == 4, names
    np.testing.assert_allclose(onnx_outputs(output), onnx_outputs(source), rtol=1e-6)


# ------------------------------------------------------------ where to write


def test_an_unwritable_location_is_a_one_line_error(tmp_path, onnx_input):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert_one_line_error(run("apply", onnx_input, "-o", blocker / "out.onnx"), "not a directory")
    assert_one_line_error(run("apply", onnx_input, "-o", tmp_path / "missing" / "out.onnx"), "no such directory")


def test_a_location_that_refuses_writes_is_a_one_line_error(tmp_path, onnx_input, monkeypatch, capsys):
    from rewrite import output

    def refuse(parent):
        raise PermissionError(13, "Permission denied", str(parent))

    monkeypatch.setattr(output.FILESYSTEM, "make_staging", refuse)
    before = folder_state(tmp_path)
    assert cli.main(["apply", str(onnx_input), "-o", str(tmp_path / "out.onnx")]) == 2
    error = capsys.readouterr().err
    assert "cannot write here (Permission denied)" in error and "Traceback" not in error
    assert folder_state(tmp_path) == before


def test_a_read_only_mount_is_a_one_line_error(tmp_path, onnx_input):
    mount = tmp_path / "ro"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip("cannot mount a read-only filesystem here")
    try:
        assert_one_line_error(run("apply", onnx_input, "-o", mount / "out.onnx"), "cannot write here")
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_writing_through_a_symlink_keeps_the_link(tmp_path, onnx_input):
    real = tmp_path / "real.onnx"
    real.write_bytes(b"old output")
    link = tmp_path / "link.onnx"
    link.symlink_to(real)
    assert run("apply", onnx_input, "-o", link).returncode == 0
    assert link.is_symlink() and onnx_op_count(real, "Expand") == 0


def test_a_symlink_to_the_input_is_the_input(tmp_path, onnx_input):
    link = tmp_path / "alias.onnx"
    link.symlink_to(onnx_input)
    before = folder_state(tmp_path)
    assert_one_line_error(run("apply", onnx_input, "-o", link), "refusing to overwrite the input")
    assert folder_state(tmp_path) == before


def test_a_hard_link_to_the_input_is_the_input(tmp_path, onnx_input):
    link = tmp_path / "hard.onnx"
    os.link(onnx_input, link)
    before = folder_state(tmp_path)
    assert_one_line_error(run("apply", onnx_input, "-o", link), "part of the input model")
    assert folder_state(tmp_path) == before


@pytest.mark.parametrize(
    "name", ["with space.onnx", "-dash.onnx", "ünï€ode.onnx", "new\nline.onnx", "x" * 250 + ".onnx"]
)
def test_awkward_names(tmp_path, onnx_input, name):
    output = tmp_path / name
    result = run("apply", onnx_input, "-o", output)
    assert result.returncode == 0, result.stderr
    assert onnx_op_count(output, "Expand") == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["model.onnx", name])


# ------------------------------------------------------------ the rest of the issue


def test_max_sweeps_below_one_is_a_usage_error(tmp_path, onnx_input):
    result = run("apply", onnx_input, "-o", tmp_path / "out.onnx", "--max-sweeps", "0")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--max-sweeps: must be at least 1" in result.stderr
    assert not (tmp_path / "out.onnx").exists()


def test_the_engine_refuses_a_cap_below_one():
    import rewrite

    with pytest.raises(ValueError, match="max_sweeps"):
        rewrite.load_rules(dialects=["onnx"]).apply(onnx_model(), max_sweeps=0)


def test_verify_trials_must_be_positive(tmp_path):
    for trials in ("-1", "0", "many"):
        result = run("verify", "--trials", trials, Path(cli.__file__).parent.parent / "rules")
        assert result.returncode == 2 and "Traceback" not in result.stderr, trials
        assert "--trials" in result.stderr


def test_apply_prints_what_fired_and_a_summary(tmp_path, onnx_input):
    result = run("apply", onnx_input, "-o", tmp_path / "out.onnx")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["remove_broadcast_expand", "fired", "1"]
    assert lines[-1] == f"wrote {tmp_path / 'out.onnx'}: 1 rewrite by 1 rule, 5 -> 3 ops"
    assert len(lines) == 2 and "fired 0" not in result.stdout
    full = run("apply", onnx_input, "-o", tmp_path / "out.onnx", "--stats")
    assert "fired 0" in full.stdout and "tried" in full.stdout


def test_apply_says_when_no_rule_fired(tmp_path):
    source = write_onnx(onnx_model(), tmp_path / "model.onnx")
    first = tmp_path / "first.onnx"
    assert run("apply", source, "-o", first).returncode == 0
    result = run("apply", first, "-o", tmp_path / "second.onnx")
    assert result.returncode == 0
    tried = len(rewrite.load_rules(dialects=["onnx"]).rules)
    assert result.stdout.strip().splitlines() == [
        f"wrote {tmp_path / 'second.onnx'}: no rule fired ({tried} rules tried), 3 -> 3 ops"
    ]


def test_mil_rules_given_for_an_onnx_model_are_reported(tmp_path, onnx_input):
    rules = Path(cli.__file__).parent.parent / "rules"
    only_mil = run("apply", "--rules", rules / "mil", onnx_input, "-o", tmp_path / "out.onnx")
    assert_one_line_error(only_mil, "no onnx rules given", "dialect mil")
    assert not (tmp_path / "out.onnx").exists()
    mixed = run("apply", "--rules", rules / "mil", "--rules", rules / "onnx", onnx_input, "-o", tmp_path / "o.onnx")
    assert mixed.returncode == 0, mixed.stderr
    assert "note:" in mixed.stderr and "dialect mil do not apply to this onnx model" in mixed.stderr


def test_test_command_with_an_unknown_rule_exits_2():
    result = run("test", Path(cli.__file__).parent.parent / "rules", "--rule", "no_such_rule")
    assert_one_line_error(result, "no rule named 'no_such_rule'")


def test_explain_and_failed_runs_leave_the_input_package_untouched(tmp_path):
    source = mil_package(tmp_path)
    before = tree_state(source)
    rules = Path(cli.__file__).parent.parent / "rules"
    assert run("explain", rules, source).returncode == 0
    assert run("apply", source, "-o", tmp_path / "o.mlpackage", "--rule", "nope").returncode == 2
    assert run("apply", source, "-o", tmp_path / "o.mlpackage").returncode == 0
    assert tree_state(source) == before


def test_check_counts_only_the_files_of_the_backend_it_checks(tmp_path):
    # A small library of the same layout (the whole one is checked in tests/language).
    shipped = Path(cli.__file__).parent.parent / "rules"
    rules = tmp_path / "rules"
    (rules / "mil").mkdir(parents=True)
    shutil.copytree(shipped / "onnx", rules / "onnx")
    for name in ("elementwise.rules", "remove_broadcast_tiles.rules", "fills.rules"):
        shutil.copy(shipped / "mil" / name, rules / "mil" / name)
    onnx_files, mil_files = len(list((rules / "onnx").glob("*.rules"))), 3
    assert f"in {onnx_files} file(s)" in run("check", rules, "--backend", "onnx").stdout
    assert f"in {mil_files} file(s)" in run("check", rules, "--backend", "mil").stdout
    assert f"in {onnx_files + mil_files} file(s)" in run("check", rules).stdout
