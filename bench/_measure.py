"""Shared by the bench scripts: run a command as a process, with its wall time and peak RSS.

The child's peak RSS must not be taken from os.wait4 on a child of the
benchmark itself: subprocess forks before exec, and Linux folds the pre-exec
address space (the benchmark, with its models loaded) into the child's
ru_maxrss. So the command is started by GNU `time -v` when present, else by
a tiny fresh Python that forks, execs and reports os.wait4's ru_maxrss.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

_LAUNCHER = """
import os, sys, time
report, argv = sys.argv[1], sys.argv[2:]
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.execvp(argv[0], argv)
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
seconds = time.perf_counter() - start
with open(report, "w") as f:
    f.write(f"Maximum resident set size (kbytes): {usage.ru_maxrss}\\nseconds: {seconds}\\n")
sys.exit(os.waitstatus_to_exitcode(status))
"""


@dataclass
class Run:
    ok: bool
    seconds: float
    peak_rss_kb: int
    stdout: str = ""
    stderr: str = ""

    @property
    def peak_mb(self) -> float:
        return self.peak_rss_kb / 1024


def _gnu_time() -> str | None:
    path = shutil.which("time") or ("/usr/bin/time" if Path("/usr/bin/time").exists() else None)
    if path is None:
        return None
    try:
        probe = subprocess.run([path, "-v", "true"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return path if "Maximum resident set size" in probe.stderr else None


GNU_TIME = _gnu_time()


def run_measured(argv: list[str], timeout: float | None = None, env: dict | None = None) -> Run:
    """Run argv; its wall-clock seconds and peak RSS in kB (see the module docstring)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "rusage.txt"
        if GNU_TIME:
            wrapped = [GNU_TIME, "-v", "-o", str(report), *argv]
        else:
            wrapped = [sys.executable, "-c", _LAUNCHER, str(report), *argv]
        start = time.perf_counter()
        process = subprocess.Popen(
            wrapped, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env,
        )
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the launcher and the command it started
            process.communicate()
            return Run(False, time.perf_counter() - start, 0, "", f"timed out after {timeout:.0f} s")
        seconds = time.perf_counter() - start
        text = report.read_text() if report.exists() else ""
        peak = 0
        for line in text.splitlines():
            if "Maximum resident set size" in line:
                peak = int(line.rsplit(":", 1)[1])
            elif line.startswith("seconds:"):  # the launcher's own clock, without its start-up
                seconds = float(line.split(":", 1)[1])
        return Run(process.returncode == 0, seconds, peak, stdout.decode(errors="replace"),
                   stderr.decode(errors="replace"))


def best_of(argv: list[str], repeat: int, timeout: float | None = None, env: dict | None = None) -> Run:
    """The fastest of `repeat` runs (its peak RSS the largest seen); the first failure as is."""
    best: Run | None = None
    peak = 0
    for _ in range(max(1, repeat)):
        run = run_measured(argv, timeout, env)
        if not run.ok:
            return run
        peak = max(peak, run.peak_rss_kb)
        if best is None or run.seconds < best.seconds:
            best = run
    best.peak_rss_kb = peak
    return best


def locate_cli() -> list[str]:
    """The `rewrite` console script of this interpreter, else `python -m`-style through rewrite.cli.

    Compiles the package's bytecode first, as pip does for an installed
    package: an editable checkout under PYTHONDONTWRITEBYTECODE (set on some
    machines and CI images) would otherwise compile our modules from source
    in every process timed, about 0.1 s that no installed peer pays.
    """
    import compileall

    import rewrite

    compileall.compile_dir(str(Path(rewrite.__file__).parent), quiet=2)
    beside = Path(sys.executable).with_name("rewrite")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("rewrite")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from rewrite.cli import main; sys.exit(main())"]


def self_peak_mb() -> float:
    """This process's own peak RSS so far, in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def ratio(numerator: float | None, denominator: float | None) -> str:
    if not numerator or not denominator:
        return "n/a"
    return f"{numerator / denominator:.2f}x"
