"""FastProgramConfig: the fast Program's fixed sizes, resolved once against the model config, and the memory plan
they imply.

The plan (`ninfer.fast.memory.plan_memory`) is made once at start from a byte budget; every pool the Program uses
afterwards (KV pages, GDN state slots, block-table rows) is a fixed part of it. State slots are laid out as

    [0, usable)                      allocatable: 2 per lane (live + publication) plus `checkpoint_slots`
    [usable, usable + lanes)         one backup slot per block-table row (the committed state during a decode step)
    plan.dummy_slot                  the plan's dummy slot (CUDA-graph capture only)

so `total_slots` in ResourceUsage counts only the allocatable ones, like the reference Program.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ninfer.fast.memory import MemoryPlan, plan_memory
from ninfer.models.qwen3_5.capacity import kv_pages_for_tokens
from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.program_limits import check_program_limits

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class FastProgramConfig:
    max_concurrency: int = 4  # active sequences (and block-table rows), 1..8
    max_context: int = 4096  # prompt + output tokens of one sequence
    page_size: int = 16  # positions per KV page
    kv_pages: int | None = None  # cap on the KV pool; None: whatever the budget leaves
    checkpoint_slots: int = 8  # GDN state slots beyond 2 per lane: published and chunk-boundary checkpoints
    host_bytes: int = 64 << 20  # host-tier budget for inactive checkpoints' GDN state
    dtype: torch.dtype = torch.bfloat16  # weights, activations, KV pages, conv windows (S is always fp32)
    max_prefill_tokens: int = 8192  # the model's prefill piece (bounds the workspace)
    eos_token_ids: tuple[int, ...] | None = None  # None: the model config's

    def resolved(self, cfg: Qwen35Config) -> "FastProgramConfig":
        """Every None but kv_pages filled in and every range checked."""
        eos = check_program_limits(cfg, max_concurrency=self.max_concurrency, max_context=self.max_context,
                                   page_size=self.page_size, checkpoint_slots=self.checkpoint_slots,
                                   host_bytes=self.host_bytes, eos_token_ids=self.eos_token_ids)
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {[str(d) for d in _DTYPES]}, got {self.dtype}")
        return dataclasses.replace(self, eos_token_ids=eos)

    @property
    def usable_slots(self) -> int:
        return 2 * self.max_concurrency + self.checkpoint_slots

    def backup_slot(self, row: int) -> int:
        """The backup slot bound to block-table row `row`."""
        return self.usable_slots + row

    def pages_for(self, tokens: int) -> int:
        return kv_pages_for_tokens(tokens, self.page_size)

    def plan(self, cfg: Qwen35Config, budget_bytes: int) -> MemoryPlan:
        """The memory plan: rows = lanes, slots = allocatable + one backup per row; MemoryError when one
        max_context sequence does not fit the budget."""
        return plan_memory(cfg, budget_bytes, max_seqs=self.max_concurrency, max_context=self.max_context,
                           page_size=self.page_size, slots=self.usable_slots + self.max_concurrency,
                           dtype=self.dtype, max_prefill_tokens=self.max_prefill_tokens, max_kv_pages=self.kv_pages)
