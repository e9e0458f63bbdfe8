"""FastProgramConfig: the fast Program's fixed sizes, resolved once against the model config, and the memory plan
they imply.

The plan (`ninfer.fast.memory.plan_memory`) is made once at start from a byte budget; every pool the Program uses
afterwards (KV pages, GDN state slots, block-table rows) is a fixed part of it. State slots are laid out as the
Program core's config says (`ninfer.program_core.config`: allocatable, then one backup per row), followed by the
plan's dummy slot (CUDA-graph capture only).

Pipeline stages (`devices`, `stage_layers`; docs/pipeline.md) plan every rank's pools against its device's budget
(`plan_stage_memory`): the KV pages are the fewest any device can hold.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ninfer.fast.memory import MemoryPlan, plan_memory, plan_stage_memory
from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.drafter import DrafterConfig
from ninfer.pipeline import StageError, StagePlan, plan_stages
from ninfer.program_core import ProgramConfig
from ninfer.program_core.speculative import SpeculativeMethod

# the longest prefill piece with a CUDA graph by default (buckets 64..512): the short pieces beside decoding rows,
# prefix-hit suffixes and agent turns, whose eager launch overhead dominated them on the H200
GRAPHED_PREFILL_TOKENS = 512
_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


@dataclass(frozen=True)
class FastProgramConfig(ProgramConfig):
    """kv_pages caps the KV pool; None: whatever the budget leaves."""

    dtype: torch.dtype = torch.bfloat16  # weights, activations, KV pages, conv windows (S is always fp32)
    max_prefill_tokens: int = 8192  # the model's prefill piece (bounds the workspace)
    # the longest prefill piece replayed as a CUDA graph (buckets 64, 128, .. up to it; 0: every piece eager;
    # None: GRAPHED_PREFILL_TOKENS on CUDA, 0 elsewhere, where a piece padded to its bucket buys nothing and costs
    # the CPU up to 8x the work, so the CPU tests that prove the padding ask for it). Only a plain dense model has
    # them: MTP and DFlash read every piece's hidden or taps, and an MoE block is not row-wise over padding rows
    prefill_graph_tokens: int | None = None
    # False (--enforce-eager): nothing is captured, not even on CUDA; every decode step, prefill piece, MTP round
    # and prefill draw runs eagerly on the runners' static buffers (prefill_graph_tokens resolves to 0)
    cuda_graphs: bool = True
    # pipeline stages (docs/pipeline.md): one per device (None, or one device: one stage on the build's device);
    # layers per stage, None: balanced by bytes (resolved into the cut)
    devices: tuple[str, ...] | None = None
    stage_layers: tuple[int, ...] | None = None

    def on_device(self, device: torch.device | str) -> "FastProgramConfig":
        """prefill_graph_tokens' default for the Program's first device."""
        if self.prefill_graph_tokens is not None:
            return self
        graphed = GRAPHED_PREFILL_TOKENS if torch.device(device).type == "cuda" and self.cuda_graphs else 0
        return dataclasses.replace(self, prefill_graph_tokens=graphed)

    def resolved(self, cfg: Qwen35Config) -> "FastProgramConfig":
        """Every None but kv_pages and prefill_graph_tokens (on_device) filled in and every range checked."""
        eos = self.checked_eos(cfg)
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {[str(d) for d in _DTYPES]}, got {self.dtype}")
        if self.prefill_graph_tokens is not None and self.prefill_graph_tokens < 0:
            raise ValueError(f"prefill_graph_tokens must be >= 0, got {self.prefill_graph_tokens}")
        if self.prefill_graph_tokens and not self.cuda_graphs:
            raise ValueError(f"prefill_graph_tokens {self.prefill_graph_tokens} asks for prefill graphs, "
                             f"cuda_graphs=False for none")
        layers = self.stage_layers
        staged = self.devices is not None and len(self.devices) > 1
        if staged:
            mtp = self.speculative is not None and self.speculative.method is SpeculativeMethod.MTP
            layers = plan_stages(cfg, tuple(self.devices), layers, _DTYPES[self.dtype],
                                 ("text", "mtp") if mtp else ("text",)).layers
        elif layers is not None and len(layers) > 1:
            raise StageError("--stage-layers: with one device there is one stage")
        graphs = self.prefill_graph_tokens if self.speculative is None and not cfg.is_moe else 0
        return dataclasses.replace(self, eos_token_ids=eos, prefill_graph_tokens=graphs, stage_layers=layers,
                                   speculative=self.resolved_speculative(cfg))

    @property
    def stage_plan(self) -> StagePlan | None:
        """A resolved config's pipeline stages; None: one stage."""
        if self.devices is None or len(self.devices) < 2:
            return None
        return StagePlan(tuple(self.devices), self.stage_layers)

    def plan(self, cfg: Qwen35Config, budget_bytes: int | list[int], weight_bytes: int | list[int] | None = None,
             extra_workspace: int = 0, drafter: DrafterConfig | None = None) -> MemoryPlan:
        """The memory plan: rows = lanes, slots = allocatable + one backup per row, the MTP head when the config
        speculates; MemoryError when one max_context sequence does not fit the budget. ``weight_bytes`` /
        ``extra_workspace``: a quantized model's resident text-weight bytes and dequantization transient
        (``plan_memory``); ``drafter``: the DFlash drafter a DFlash method runs (its weights, context pages and
        scratch). A backend plans its verify graphs over blocks of k + 1 tokens. Over pipeline stages (a
        resolved config's ``stage_plan``) ``budget_bytes`` and ``weight_bytes`` may be given per rank (one budget:
        every device's)."""
        mtp = self.speculative is not None and self.speculative.method is SpeculativeMethod.MTP
        sizes = dict(max_seqs=self.max_concurrency, max_context=self.max_context, page_size=self.page_size,
                     slots=self.usable_slots + self.max_concurrency, dtype=self.dtype,
                     max_prefill_tokens=self.max_prefill_tokens, max_kv_pages=self.kv_pages, mtp=mtp,
                     extra_workspace=extra_workspace,
                     verify_width=self.draft_tokens + 1 if self.speculative is not None else 0,
                     # unset (no device yet: on_device): no graphs' pool
                     prefill_graph_tokens=self.resolved(cfg).prefill_graph_tokens or 0)
        stages = self.stage_plan
        if stages is not None:
            budgets = budget_bytes if isinstance(budget_bytes, list) else [budget_bytes] * stages.stages
            return plan_stage_memory(cfg, stages, budgets, weight_bytes_per_rank=weight_bytes, drafter=drafter,
                                     **sizes)
        # plain decoding on one stage may chain a decode step behind another (`MemoryPlan.chain_slots`)
        return plan_memory(cfg, budget_bytes, weight_bytes_resident=weight_bytes, drafter=drafter,
                           chained=self.speculative is None, **sizes)
