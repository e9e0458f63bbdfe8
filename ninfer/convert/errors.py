"""Conversion errors: every problem found in a checkpoint, reported at once."""

from __future__ import annotations


class ConversionError(ValueError):
    """A checkpoint that cannot be converted. ``problems`` lists each missing, unexpected or mis-shaped tensor."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"cannot convert {source}: {len(self.problems)} problem(s)\n{lines}")
