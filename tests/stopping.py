"""Run `rewrite` in a forked child and stop it at one step of writing its output.

Steps are the filesystem calls of `rewrite.output` that change what is on
disk (staging, links, renames, removals), plus the start and the end of the
backend's own write. At step `step` the child sends itself SIGKILL (nothing
runs after) or SIGTERM (the CLI's handlers run). Forking from the test
process, which has imported everything already, makes a run cost only the
rewrite itself.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StoppedRun:
    exit_code: int  # negative: killed by that signal
    stderr: str
    steps: int | None  # steps the run took, if it got to its end


def run_stopped(step: int, how: str, arguments: list[str], log: Path) -> StoppedRun:
    """Run `rewrite ARGUMENTS` in a child that stops at `step` ("kill" or "term")."""
    log = Path(log)
    steps_file = log.with_suffix(".steps")
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child ends with os._exit
        code = 70
        try:
            descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(descriptor, 2)
            os.dup2(descriptor, 1)
            sys.stdout = sys.stderr = open(descriptor, "w", buffering=1, closefd=False)  # noqa: SIM115
            code = _stopping_main(step, how, arguments, steps_file)
        except BaseException as error:  # what escapes the CLI is a finding: say it
            import traceback

            traceback.print_exception(error)
        finally:
            sys.stdout.flush()
            os._exit(code)
    # A child forked from a process with threads (JAX starts some) could in
    # principle deadlock: give up on it rather than hang the suite.
    deadline = time.monotonic() + 300
    while True:
        finished, status = os.waitpid(child, os.WNOHANG)
        if finished:
            break
        if time.monotonic() > deadline:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            raise AssertionError(f"rewrite {' '.join(arguments)} hung at step {step}")
        time.sleep(0.005)
    exit_code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    steps = int(steps_file.read_text()) if steps_file.exists() else None
    return StoppedRun(exit_code, log.read_text(), steps)


def _stopping_main(step: int, how: str, arguments: list[str], steps_file: Path) -> int:
    from rewrite import cli, output

    taken = 0

    def tick() -> None:
        nonlocal taken
        taken += 1
        if taken == step:
            os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGTERM)

    class Stopping(output.Filesystem):
        pass

    for name in ("make_staging", "link_new", "replace", "rename_new", "exchange", "remove", "remove_tree"):
        def stepped(self, *args, _name=name):
            tick()
            return getattr(output.Filesystem, _name)(self, *args)

        setattr(Stopping, name, stepped)
    output.FILESYSTEM = Stopping()
    publish = output.publish

    def stepped_publish(target, write, **options):
        def stepped_write(path):
            tick()
            write(path)
            tick()

        return publish(target, stepped_write, **options)

    output.publish = stepped_publish
    code = cli.main(arguments)
    steps_file.write_text(str(taken))
    return code
