"""The wheel carries grammar.lark and rules/, and the installed CLI works from anywhere."""

from __future__ import annotations

import re
import subprocess
import sys
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_wheel_installs_and_runs_from_another_directory(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)],
        check=True, capture_output=True, timeout=600,
    )
    (wheel,) = wheels.glob("rewrite-*.whl")

    # A fresh environment; its dependencies (coremltools, lark, ...) come from
    # this interpreter's site-packages, the package itself only from the wheel.
    environment = tmp_path / "venv"
    venv.create(environment, system_site_packages=True, with_pip=True)
    python = environment / "bin" / "python"
    # --ignore-installed: the same version may already sit in the system site-packages.
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--ignore-installed", "-q", str(wheel)],
                   check=True, capture_output=True, timeout=600)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    located = subprocess.run(
        [str(python), "-c", "import rewrite, rewrite.resources as r; "
         "print(rewrite.__file__); print(r.grammar_path()); print(r.rules_path())"],
        cwd=elsewhere, capture_output=True, text=True, check=True,
    ).stdout.split()
    assert all(str(environment) in path for path in located), located

    output = elsewhere / "out.mlpackage"
    result = subprocess.run(
        [str(environment / "bin" / "rewrite"), "apply",
         str(REPO / "examples" / "rmsnorm_symbolic.mlpackage"), "-o", str(output)],
        cwd=elsewhere, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert re.search(r"^remove_broadcast_tiles +fired 1$", result.stdout, re.M)
    assert output.is_dir()
