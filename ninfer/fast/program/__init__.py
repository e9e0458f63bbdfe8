"""The fast Program: the Program protocol over FastModel's planned device pools (docs/fast-program.md)."""

from .config import FastProgramConfig
from .program import FastProgram

__all__ = ["FastProgram", "FastProgramConfig"]
