"""ReferenceProgram: the Program protocol on CPU torch with the reference model and real paged accounting.

Everything but the tensor math is the shared Program core's (`ninfer.program_core.Program`): it drives this
Program's CPU tensor stores through `TensorStore` and the reference model through `ReferenceExecutor`.
"""

from __future__ import annotations

from pathlib import Path

from ninfer.contracts import ProgramLimits
from ninfer.program_core import HostTier, IdPool, Program
from ninfer.program_core.speculative import MissingBackendWeights
from ninfer.reference.model import ReferenceModel

from .config import ReferenceProgramConfig
from .executor import ReferenceExecutor
from .scoring import CausalScoring
from .stores import KVPages, StateSlots, TensorStore


class ReferenceProgram(Program):
    def __init__(self, model: ReferenceModel, config: ReferenceProgramConfig = ReferenceProgramConfig()):
        cfg = model.cfg
        c = config.resolved(cfg)
        if model.dtype != c.dtype:
            raise ValueError(f"model dtype {model.dtype} differs from the Program's {c.dtype}")
        self.model = model
        self.pages = KVPages(cfg, c.kv_pages, c.page_size, c.dtype)
        if c.speculative is not None and not model.has_mtp:
            raise MissingBackendWeights(c.speculative.method, "the MTP head's weights (mtp.*)")
        self.limits = ProgramLimits(c.max_concurrency, c.max_context, cfg.vocab_size, c.eos_token_ids,
                                    speculative=None if c.speculative is None else c.speculative.name,
                                    draft_tokens=c.draft_tokens)
        self.states = StateSlots(cfg, c.usable_slots + c.max_concurrency, c.dtype,  # allocatable, then backups
                                 mtp=c.speculative is not None)
        super().__init__(c, self.pages.alloc, IdPool(c.usable_slots, "GDN state slot"),
                         HostTier(c.host_bytes, c.state_bytes(cfg), c.page_bytes(cfg)),
                         TensorStore(self.pages, self.states),
                         c.page_bytes(cfg), rows=IdPool(c.max_concurrency, "block-table row"))
        self.executor = ReferenceExecutor(model, self.pages, self.states, c.eos_token_ids, c.backup_slot)

    @classmethod
    def from_artifact(cls, path: str | Path, config: ReferenceProgramConfig = ReferenceProgramConfig()):
        """The Program over a .ninfer artifact's text weights, and its MTP head when the config speculates."""
        from ninfer.artifact import open_artifact
        from ninfer.models.qwen3_5.params import MTP, TEXT
        from ninfer.reference.weights import load_model

        features = (TEXT,)
        if config.speculative is not None:
            with open_artifact(path) as art:
                if MTP not in art.available_features:
                    raise MissingBackendWeights(config.speculative.method, "the MTP head's weights (mtp.*)")
            features = (TEXT, MTP)
        return cls(load_model(path, features=features, dtype=config.dtype), config)

    def scoring(self) -> CausalScoring:
        """The CausalScoring core over this Program's model: temporary states only, no store is touched."""
        return CausalScoring(self.model)
