"""The wheel carries grammar.lark and rules/, and the installed CLI works from anywhere."""

from __future__ import annotations

import os
import re
import site
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _running_site_packages() -> list[str]:
    """This interpreter's site-packages folders, in its own lookup order.

    Works alike in a plain interpreter and in a virtual environment (where
    site.getsitepackages() names the environment's folder, and the base's too
    when the environment was made with system site packages).
    """
    folders = list(site.getsitepackages())
    folders += [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    if site.ENABLE_USER_SITE:
        folders.append(site.getusersitepackages())
    unique = []
    for folder in folders:
        if folder not in unique and os.path.isdir(folder):
            unique.append(folder)
    return unique


def test_wheel_installs_and_runs_from_another_directory(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)],
        check=True, capture_output=True, timeout=600,
    )
    (wheel,) = wheels.glob("rewrite-*.whl")

    # A fresh environment of its own (no system site packages: inside a venv
    # those would be the base interpreter's, not this one's). The package comes
    # only from the wheel; it is installed before anything else is visible, so
    # pip cannot find `rewrite` already installed in this interpreter.
    environment = tmp_path / "venv"
    venv.create(environment, with_pip=False)  # this interpreter's pip installs into it (--python)
    python = environment / "bin" / "python"
    # Without PYTHONPATH/PYTHONHOME, nothing from the caller's environment can
    # come before the new environment's own site-packages.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
                   check=True, capture_output=True, timeout=600, env=env)

    # Its dependencies (coremltools, lark, ...) come from this interpreter's
    # site-packages, named by plain path lines in a .pth file: site appends them
    # after the environment's own site-packages, so the wheel's `rewrite` comes
    # first. Plain lines do not run the .pth files inside those folders, so an
    # editable install of `rewrite` here (a path or an import hook) stays inert.
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True, env=env,
    ).stdout.strip()
    (Path(purelib) / "zz_running_interpreter.pth").write_text(
        "".join(f"{folder}\n" for folder in _running_site_packages()), encoding="utf-8")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    located = subprocess.run(
        [str(python), "-c", "import rewrite, rewrite.resources as r; "
         "print(rewrite.__file__); print(r.grammar_path()); print(r.rules_path())"],
        cwd=elsewhere, capture_output=True, text=True, check=True, env=env,
    ).stdout.split()
    assert len(located) == 3, located
    assert all(Path(path).resolve().is_relative_to(Path(purelib).resolve()) for path in located), located

    output = elsewhere / "out.mlpackage"
    result = subprocess.run(
        [str(environment / "bin" / "rewrite"), "apply",
         str(REPO / "examples" / "rmsnorm_symbolic.mlpackage"), "-o", str(output)],
        cwd=elsewhere, capture_output=True, text=True, timeout=300, env=env,
    )
    assert result.returncode == 0, result.stderr
    assert re.search(r"^remove_broadcast_tiles +fired 1$", result.stdout, re.M), result.stdout
    assert output.is_dir()
