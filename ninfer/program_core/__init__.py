"""The one Program logic both Programs run on: pure-Python resource bookkeeping (records, sizing, plan verdicts,
resource transitions, snapshots, commit validation, invariants) and the model transactions' orchestration, over a
small physical-store interface and a model-executor interface, so the reference and fast Programs keep only their
model calls, their tensors and what is really theirs."""

from .config import ProgramConfig
from .core import ProgramCore
from .executor import Drawn, ModelExecutor
from .program import Program
from .records import ActiveSequence, Checkpoint
from .store import HostTier, IdPool, PhysicalStore, Replica

__all__ = ["ActiveSequence", "Checkpoint", "Drawn", "HostTier", "IdPool", "ModelExecutor", "PhysicalStore", "Program",
           "ProgramConfig", "ProgramCore", "Replica"]
