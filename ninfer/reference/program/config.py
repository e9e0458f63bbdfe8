"""ReferenceProgramConfig: the reference Program's fixed sizes, resolved once against the model config.

Every byte figure the Program reports comes from the capacity queries of `ninfer.models.qwen3_5.capacity`, the
same ones the fast Program plans with, so both Programs agree on what a page, a state slot and a checkpoint cost.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ninfer.models.qwen3_5.capacity import gdn_state_bytes_per_sequence, kv_bytes_per_token_all_layers
from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.pipeline import StageError, StagePlan, plan_stages
from ninfer.program_core import ProgramConfig
from ninfer.program_core.speculative import SpeculativeMethod

_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16",
                torch.float16: "float16"}


@dataclass(frozen=True)
class ReferenceProgramConfig(ProgramConfig):
    """kv_pages None: room for every lane at full context, twice over (checkpoints share it)."""

    dtype: torch.dtype = torch.float32  # activations, KV and conv windows; S stays fp32 (fp64 in fp64 mode)
    # pipeline stages (docs/pipeline.md): one per device, all CPU here; layers per stage, None: balanced by bytes
    devices: tuple[str, ...] = ("cpu",)
    stage_layers: tuple[int, ...] | None = None

    def resolved(self, cfg: Qwen35Config) -> "ReferenceProgramConfig":
        """Every None filled in and every range checked; the Program keeps only a resolved config."""
        eos = self.checked_eos(cfg)
        if self.dtype not in _DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {sorted(map(str, _DTYPE_NAMES))}, got {self.dtype}")
        pages = self.kv_pages
        if pages is None:
            pages = 2 * self.max_concurrency * self.pages_for(self.max_context)
        if pages < 1:
            raise ValueError(f"kv_pages must be >= 1, got {pages}")
        if any(d != "cpu" for d in self.devices):
            raise StageError(f"--devices {','.join(self.devices)}: the reference Program's stages run on the CPU "
                             f"(cpu,cpu,...); CUDA devices are the fast Program's")
        mtp = self.speculative is not None and self.speculative.method is SpeculativeMethod.MTP
        features = ("text", "mtp") if mtp else ("text",)
        plan = plan_stages(cfg, tuple(self.devices), self.stage_layers, self.dtype_name, features)
        return dataclasses.replace(self, kv_pages=pages, eos_token_ids=eos, devices=plan.devices,
                                   stage_layers=plan.layers, speculative=self.resolved_speculative(cfg))

    @property
    def stage_plan(self) -> StagePlan:
        """The resolved config's pipeline stages (one stage: the whole model on the CPU)."""
        return StagePlan(self.devices, self.stage_layers)

    @property
    def dtype_name(self) -> str:
        return _DTYPE_NAMES[self.dtype]

    def page_bytes(self, cfg: Qwen35Config) -> int:
        """One page: `page_size` positions of K and V in every attention layer."""
        return self.page_size * kv_bytes_per_token_all_layers(cfg, self.dtype_name)

    def state_bytes(self, cfg: Qwen35Config) -> int:
        """One GDN state slot: conv windows and recurrent state of every GDN layer."""
        return gdn_state_bytes_per_sequence(cfg, self.dtype_name)
