"""ProgramConfig: the start-up fields both Programs' configurations share, and the slot layout both use.

State slots are laid out the same way in both Programs:

    [0, usable)                      allocatable: 2 per lane (live + publication) plus `checkpoint_slots`
    [usable, usable + lanes)         one backup slot per block-table row (the committed state during a step)

so `total_slots` in ResourceUsage counts only the allocatable ones. Each Program's config subclasses this with its
own dtype and sizes and resolves it once against the model config (`resolved`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ninfer.models.qwen3_5.capacity import kv_pages_for_tokens
from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.program_limits import check_program_limits

from .speculative import SpeculativeConfig


@dataclass(frozen=True)
class ProgramConfig:
    max_concurrency: int = 4  # active sequences (and block-table rows), 1..8
    max_context: int = 4096  # prompt + output tokens of one sequence
    page_size: int = 16  # positions per KV page (every attention layer's K and V of those positions)
    kv_pages: int | None = None  # the KV pool (each Program says what None means)
    checkpoint_slots: int = 8  # GDN state slots beyond 2 per lane: published and chunk-boundary checkpoints
    host_bytes: int = 64 << 20  # host-tier budget for inactive checkpoints' replicas (state and KV)
    eos_token_ids: tuple[int, ...] | None = None  # None: the model config's
    speculative: SpeculativeConfig | None = None  # the speculative backend, None: plain decoding

    @property
    def draft_tokens(self) -> int:
        """Drafts per row and round (0 without a backend)."""
        return 0 if self.speculative is None else self.speculative.num_speculative_tokens

    def resolved_speculative(self, cfg: Qwen35Config) -> SpeculativeConfig | None:
        """The backend's config against the model (`SpeculativeConfig.for_vocab`), for a resolved config."""
        return None if self.speculative is None else self.speculative.for_vocab(cfg.vocab_size)

    def checked_eos(self, cfg: Qwen35Config) -> tuple[int, ...]:
        """The shared range checks (ValueError naming the field); the resolved eos ids."""
        return check_program_limits(cfg, max_concurrency=self.max_concurrency, max_context=self.max_context,
                                    page_size=self.page_size, checkpoint_slots=self.checkpoint_slots,
                                    host_bytes=self.host_bytes, eos_token_ids=self.eos_token_ids)

    @property
    def usable_slots(self) -> int:
        return 2 * self.max_concurrency + self.checkpoint_slots

    def backup_slot(self, row: int) -> int:
        """The backup slot bound to block-table row `row`."""
        return self.usable_slots + row

    def pages_for(self, tokens: int) -> int:
        return kv_pages_for_tokens(tokens, self.page_size)
