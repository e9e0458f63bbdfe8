"""The Program core both Programs share: pure-Python resource bookkeeping (records, sizing, plan verdicts,
resource transitions, snapshots, commit validation, invariants) over a small physical-store interface, so the
reference and fast Programs keep only their model calls, their tensors and what is really theirs."""

from .core import ProgramCore
from .records import ActiveSequence, Checkpoint
from .store import HostTier, IdPool, PhysicalStore

__all__ = ["ActiveSequence", "Checkpoint", "HostTier", "IdPool", "PhysicalStore", "ProgramCore"]
