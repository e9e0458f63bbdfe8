"""The reference Program: the Program protocol over the reference model, with paged KV and GDN-slot accounting
computed from the same capacity queries as the fast Program, plus the CausalScoring core."""

from .config import ReferenceProgramConfig
from .program import ReferenceProgram
from .scoring import CausalScoring, ScoreResult

__all__ = ["CausalScoring", "ReferenceProgram", "ReferenceProgramConfig", "ScoreResult"]
