"""What a DFlash drafter adds to the fast Program's memory plan (``ninfer.fast.memory``): its context K/V in every
page, its scratch pages per block-table row, its weights and transients, on the device that holds it (the one stage,
or rank 0 over pipeline stages)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.drafter import DrafterConfig, drafter_parameters


def drafter_page_bytes(drafter: DrafterConfig, page_size: int, act: int) -> int:
    """A page's share of the drafter's context K/V: every drafter layer's K and V of page_size positions."""
    return 2 * drafter.num_hidden_layers * page_size * drafter.num_key_value_heads * drafter.head_dim * act


def drafter_workspace_bytes(cfg: Qwen35Config, drafter: DrafterConfig, tokens: int, max_seqs: int, act: int) -> int:
    """Transients of the drafter: the target taps a prefill piece keeps (every layer's output, ``FastModel``'s
    taps) and the context projection over it, or one block pass for every row (activations, fp32 logits)."""
    H, n = cfg.hidden_size, len(drafter.target_layer_ids)
    prefill = tokens * act * (cfg.num_hidden_layers * H + n * H + 4 * H)
    return max(prefill, drafter_block_bytes(cfg, drafter, max_seqs, act))


def drafter_block_bytes(cfg: Qwen35Config, drafter: DrafterConfig, max_seqs: int, act: int) -> int:
    """One block pass's transients for ``max_seqs`` rows: the activations of every block position and its fp32
    logits."""
    rows = max_seqs * drafter.block_size
    return rows * (act * (2 * drafter.intermediate_size + 6 * cfg.hidden_size) + 4 * 2 * cfg.vocab_size)


def scratch_pages_per_row(drafter: DrafterConfig, page_size: int) -> int:
    """Pages that hold a block of block_size positions starting anywhere in a page."""
    return -(-(page_size - 1 + drafter.block_size) // page_size)


@dataclass(frozen=True)
class DrafterNeeds:
    """What a DFlash drafter adds to the device that holds it (one stage's, or rank 0's over pipeline stages)."""

    weight_bytes: int
    page_bytes: int  # its context K/V in every page
    scratch_pages: int  # per block-table row: where a draft block's own K/V go
    workspace: int  # its transients (a prefill piece's taps, the block pass) and the rows' scratch pages


def drafter_needs(cfg: Qwen35Config, drafter: DrafterConfig, page_size: int, dtype: torch.dtype,
                  max_prefill_tokens: int, max_seqs: int) -> DrafterNeeds:
    act = torch.finfo(dtype).bits // 8
    page = drafter_page_bytes(drafter, page_size, act)
    scratch = scratch_pages_per_row(drafter, page_size)
    return DrafterNeeds(act * sum(p.numel for p in drafter_parameters(drafter).values()), page, scratch,
                        drafter_workspace_bytes(cfg, drafter, max_prefill_tokens, max_seqs, act) +
                        max_seqs * scratch * page)
