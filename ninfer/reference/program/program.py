"""ReferenceProgram: the Program protocol on CPU torch with the reference model and real paged accounting.

Everything but the tensor math is the shared Program core's (`ninfer.program_core.Program`): it drives this
Program's CPU tensor stores through `TensorStore` and the reference model through `ReferenceExecutor`, with the
speculative backend the config names (MTP, DFlash, DFlash2) checked against the model once, here.
"""

from __future__ import annotations

from pathlib import Path

from ninfer.contracts import ProgramLimits
from ninfer.pipeline.link import PeerLink
from ninfer.program_core import HostTier, IdPool, Program
from ninfer.program_core.speculative import (MissingBackendWeights, SpeculativeConfig, SpeculativeMethod,
                                             drafter_fit)
from ninfer.models.qwen3_5.draft_quant import draft_linears, fp8_values, head_rows_values
from ninfer.reference.dflash import Drafter
from ninfer.reference.model import ReferenceModel
from ninfer.reference.vision import VisionTower

from .config import ReferenceProgramConfig
from .dflash_backend import DFlashBackend
from .executor import ReferenceExecutor
from .mtp_backend import MTPBackend
from .scoring import CausalScoring
from .stages import StagedPages, StagedSlots
from .stores import KVPages, StateSlots, TensorStore


def _backend(spec: SpeculativeConfig | None, model: ReferenceModel, drafter: Drafter | None):
    """The backend `spec` names, or a start-up error naming the field when the model cannot run it."""
    if spec is None:
        return None
    if spec.method is SpeculativeMethod.MTP:
        if not model.has_mtp:
            raise MissingBackendWeights(spec.method, spec.method.needs)
        if spec.quantization == "fp8":  # the MTP head drafts with its projections' FP8 values (`draft_quant`),
            # and under a draft vocabulary with its draft head's
            replaced = {n: fp8_values(model.weights[n]) for n in draft_linears(model.cfg)}
            if spec.draft_vocab_size is not None:
                replaced["lm_head.weight"] = head_rows_values(model.weights["lm_head.weight"], spec.draft_vocab_size)
            model = model.with_weights(replaced)
        return MTPBackend(model, spec.draft_vocab_size)
    block, window = drafter_fit(spec, None if drafter is None else drafter.cfg)
    return DFlashBackend(drafter, block, window, spec.draft_vocab_size)


class ReferenceProgram(Program):
    def __init__(self, model: ReferenceModel, config: ReferenceProgramConfig = ReferenceProgramConfig(),
                 drafter: Drafter | None = None, vision: VisionTower | None = None):
        """`vision`: the tower, which prepares the Vision feature (image prompts); without it they are refused."""
        cfg = model.cfg
        c = config.resolved(cfg)
        if model.dtype != c.dtype:
            raise ValueError(f"model dtype {model.dtype} differs from the Program's {c.dtype}")
        self.stage_plan, self.link = c.stage_plan, None
        if self.stage_plan.stages > 1:  # pipeline stages (docs/pipeline.md): weights, KV planes and GDN slots per rank
            self.link = PeerLink(self.stage_plan.devices)
            model = model.placed(self.stage_plan, self.link)
        self.model, self.drafter = model, drafter
        self.pages = StagedPages(cfg, self.stage_plan, c.kv_pages, c.page_size, c.dtype) if self.link else \
            KVPages(cfg, c.kv_pages, c.page_size, c.dtype)
        backend = _backend(c.speculative, model, drafter)
        no_vision = "the Vision feature is not prepared (no vision tower)" if vision is None else None
        self.vision = None if vision is None else vision.cfg
        self.limits = ProgramLimits(c.max_concurrency, c.max_context, cfg.vocab_size, c.eos_token_ids,
                                    speculative=None if c.speculative is None else c.speculative.name,
                                    draft_tokens=c.draft_tokens, no_vision=no_vision,
                                    # the chunk, then the round: the oracle of the fast one pass, which a
                                    # backend's rounds do not take (the same schedules as the fast Program)
                                    mixed_steps=not c.draft_tokens)
        slots, empty = c.usable_slots + c.max_concurrency, None if backend is None else backend.empty
        # allocatable, then backups
        self.states = StagedSlots(cfg, self.stage_plan, slots, c.dtype, empty) if self.link else \
            StateSlots(cfg, slots, c.dtype, backend_empty=empty)
        super().__init__(c, self.pages.alloc, IdPool(c.usable_slots, "GDN state slot"),
                         HostTier(c.host_bytes, c.state_bytes(cfg), c.page_bytes(cfg)),
                         TensorStore(self.pages, self.states),
                         c.page_bytes(cfg), rows=IdPool(c.max_concurrency, "block-table row"))
        self.executor = ReferenceExecutor(model, self.pages, self.states, c.eos_token_ids, c.backup_slot, backend,
                                          vision)

    @classmethod
    def from_artifact(cls, path: str | Path, config: ReferenceProgramConfig = ReferenceProgramConfig(),
                      vision: bool = False):
        """The Program over a .ninfer artifact's text weights, its MTP head or drafter when the config speculates,
        and its vision tower with `vision` (the artifact must bind the Vision feature)."""
        from ninfer.artifact import open_artifact
        from ninfer.models.qwen3_5.params import MTP, TEXT
        from ninfer.reference.weights import load_drafter, load_model, load_vision_tower

        spec = config.speculative
        features = (TEXT,)
        if spec is not None:
            with open_artifact(path) as art:
                available = art.available_features
            if spec.method.feature not in available:
                raise MissingBackendWeights(spec.method, spec.method.needs)
            features = (TEXT, MTP) if spec.method is SpeculativeMethod.MTP else features
        model = load_model(path, features=features, dtype=config.dtype)
        dflash = spec is not None and spec.method.drafter is not None
        drafter = load_drafter(path, model, spec.method.feature) if dflash else None
        return cls(model, config, drafter, load_vision_tower(path, config.dtype) if vision else None)

    def scoring(self) -> CausalScoring:
        """The CausalScoring core over this Program's model: temporary states only, no store is touched."""
        return CausalScoring(self.model)
