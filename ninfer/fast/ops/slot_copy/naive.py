"""Copy whole state slots inside a pool: the definition of the decode step's backup copy."""

from __future__ import annotations

import torch


def slot_copy_naive(pool: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, dst_offset: int = 0) -> None:
    """pool [L, S, ...]: for every b, pool[:, dst_offset + dst[b]] = pool[:, src[b]]. src, dst [B] int on the pool's
    device; no destination slot may be another row's source (a row's own source is fine: it copies nothing)."""
    pool.index_copy_(1, dst.long() + dst_offset, pool.index_select(1, src.long()))
