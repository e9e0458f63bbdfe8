"""ReferenceProgram: the Program protocol on CPU torch with the reference model and real paged accounting.

Resource transactions (plan, start, advance, abort, backfill proof), the physical transitions and the invariants
are the shared Program core's (`ninfer.program_core`), driven over this Program's tensor stores; the model
transactions are in `execution.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ninfer.contracts import PendingBatch, ProgramLimits, RowDecision, SequenceHandle
from ninfer.program_core import HostTier, ProgramCore
from ninfer.reference.model import ReferenceModel

from . import execution
from .config import ReferenceProgramConfig
from .scoring import CausalScoring
from .stores import KVPages, StateSlots, TensorStore


class ReferenceProgram(ProgramCore):
    def __init__(self, model: ReferenceModel, config: ReferenceProgramConfig = ReferenceProgramConfig()):
        cfg = model.cfg
        c = config.resolved(cfg)
        if model.dtype != c.dtype:
            raise ValueError(f"model dtype {model.dtype} differs from the Program's {c.dtype}")
        self.model = model
        self.limits = ProgramLimits(c.max_concurrency, c.max_context, cfg.vocab_size, c.eos_token_ids)
        self.pages = KVPages(cfg, c.kv_pages, c.page_size, c.dtype)
        slots = StateSlots(cfg, c.total_slots, c.dtype)
        super().__init__(c, self.pages.alloc, slots, HostTier(c.host_bytes, c.state_bytes(cfg)),
                         TensorStore(self.pages, slots), c.page_bytes(cfg))

    @classmethod
    def from_artifact(cls, path: str | Path, config: ReferenceProgramConfig = ReferenceProgramConfig()):
        """The Program over a .ninfer artifact's text weights (MTP is not used by the reference Program)."""
        from ninfer.models.qwen3_5.params import TEXT
        from ninfer.reference.weights import load_model

        return cls(load_model(path, features=(TEXT,), dtype=config.dtype), config)

    # ---- model transactions ----------------------------------------------------------------------------------
    def prefill(self, handle: SequenceHandle, max_tokens: int, mask: Any | None = None) -> PendingBatch | None:
        return execution.prefill(self, handle, max_tokens, mask)

    def decode(self, handles: Sequence[SequenceHandle], masks: Sequence[Any | None] | None = None) -> PendingBatch:
        return execution.decode(self, handles, masks)

    def control(self, handle: SequenceHandle, tokens: Sequence[int]) -> PendingBatch:
        return execution.control(self, handle, tokens)

    def commit(self, batch: PendingBatch, decisions: Sequence[RowDecision]) -> None:
        execution.commit(self, batch, decisions)

    def abort_pending(self, batch: PendingBatch) -> None:
        execution.abort_pending(self, batch)

    def scoring(self) -> CausalScoring:
        """The CausalScoring core over this Program's model: temporary states only, no store is touched."""
        return CausalScoring(self.model)
