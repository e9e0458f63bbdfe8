"""Conversion errors: every problem found in a checkpoint, reported at once."""

from __future__ import annotations

from ninfer.errors import ExitCode, NinferError

SHOWN_PROBLEMS = 3  # the one-line form names this many problems, then counts the rest


class ConversionError(NinferError, ValueError):
    """A checkpoint that cannot be converted. ``problems`` lists each missing, unexpected or mis-shaped tensor."""

    exit_code = ExitCode.BAD_MODEL

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"cannot convert {source}: {len(self.problems)} problem(s)\n{lines}")
        self.where = source

    @property
    def what(self) -> str:
        shown = "; ".join(self.problems[:SHOWN_PROBLEMS])
        more = len(self.problems) - SHOWN_PROBLEMS
        return f"cannot convert the checkpoint: {shown}" + (f"; and {more} more problem(s)" if more > 0 else "")
