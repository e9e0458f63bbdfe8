"""Range checks both Programs apply to their start-up configuration, and the eos ids they resolve."""

from __future__ import annotations

from typing import Sequence

from .config import Qwen35Config


def check_program_limits(cfg: Qwen35Config, *, max_concurrency: int, max_context: int, page_size: int,
                         checkpoint_slots: int, host_bytes: int,
                         eos_token_ids: Sequence[int] | None) -> tuple[int, ...]:
    """Raise ValueError naming the first value out of range; return the eos ids (the model config's when None)."""
    if not 1 <= max_concurrency <= 8:
        raise ValueError(f"max_concurrency must be in 1..8, got {max_concurrency}")
    if not 1 <= max_context <= cfg.max_position_embeddings:
        raise ValueError(f"max_context must be in 1..{cfg.max_position_embeddings}, got {max_context}")
    if page_size < 1 or checkpoint_slots < 0 or host_bytes < 0:
        raise ValueError(f"page_size >= 1, checkpoint_slots >= 0, host_bytes >= 0 required, got "
                         f"{page_size}, {checkpoint_slots}, {host_bytes}")
    eos = tuple(cfg.eos_token_ids) if eos_token_ids is None else tuple(eos_token_ids)
    bad = [t for t in eos if not 0 <= t < cfg.vocab_size]
    if bad:
        raise ValueError(f"eos token {bad[0]} outside the vocabulary of {cfg.vocab_size}")
    return eos
