"""Whether a MIL program is well formed, as coremltools itself checks it.

coremltools' `Program.validate` checks that every op's inputs and its
inputs' consumers agree, that every value an op reads is visible in its
block, and that block outputs know their consuming blocks: what an edit of
the graph can get wrong, and what `ct.convert` would later fail on with a
message about coremltools' internals. `rewrite apply` checks its output so,
and names the change that broke it (`rewrite.engine.steps`).
"""

from __future__ import annotations

from rewrite.backends.mil.pymil import MilError, Program


class InvalidProgramError(MilError):
    """A run left a program coremltools' validation rejects, where its input passed; names the change."""

    def __init__(self, problem: str, maker: str | None, step: int | None, where: str = "the run"):
        self.problem = problem
        self.maker = maker
        self.step = step
        blame = f"rule '{maker}' (change {step} of {where})" if maker else where
        super().__init__(f"{blame} left a program coremltools rejects: {problem}")


def problem(program: Program) -> str | None:
    """What `program.validate()` finds wrong, on one line; None if nothing."""
    try:
        program.validate()
    except Exception as error:  # coremltools raises ValueError and its own InvalidBlockStateError
        lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
        return lines[0] if lines else type(error).__name__
    return None
