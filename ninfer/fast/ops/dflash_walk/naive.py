"""DFlash2's candidate-selector walk over a whole block for a greedy round without logit bias, min_tokens or
penalties, in plain torch: what k slot-by-slot greedy draws over `dflash_select`'s scores leave.

    for j < k:  s = dflash_select(unary[:, j], cand[:, j], proj[:, j], prev)          [R, K]
                z = -inf everywhere but z[cand[:, j]] = s                              [R, V]
                drafts[:, j] = argmax z (the first maximum: ties to the lowest id, NaN first)
                num += z drawable (no NaN or +inf, not all -inf) & num == j & j < room
                prev = drafts[:, j]

This is `SpecSampler.draw_static` on a lean greedy round (its adjusted logits are the raw scores, its token the
argmax, its drawable test `spec_steps.drawable`), with the [R, V] rows built and read per slot.
"""

from __future__ import annotations

import torch

from ninfer.fast.ops.dflash_select.naive import dflash_select_naive


def dflash_walk_naive(unary: torch.Tensor, cand: torch.Tensor, proj: torch.Tensor, anchor: torch.Tensor,
                      pred: torch.Tensor, succ: torch.Tensor, room: torch.Tensor, drafts: torch.Tensor | None = None,
                      num: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """unary [R, k, K], cand [R, k, K] token ids, proj [R, k, r], anchor [R] (each walk's first predecessor),
    pred/succ [V, r], room [R] (drafts each row may take) -> (drafts [R, k] long, num [R] int32), copied into
    `drafts` / `num` when given."""
    R, k, _ = unary.shape
    V = pred.shape[0]
    prev = anchor.long()
    tokens = torch.zeros(R, k, dtype=torch.long, device=unary.device)
    count = torch.zeros(R, dtype=torch.int32, device=unary.device)
    for j in range(k):
        s = dflash_select_naive(unary[:, j], cand[:, j], proj[:, j], prev, pred, succ)  # [R, K] fp32
        z = torch.full((R, V), float("-inf"), device=unary.device).scatter_(1, cand[:, j].long(), s)
        ok = ~(torch.isnan(z) | torch.isposinf(z)).any(-1) & ~torch.isneginf(z).all(-1)
        prev = torch.argmax(z, dim=-1)
        tokens[:, j] = prev
        count += (ok & (count == j) & (j < room)).to(torch.int32)
    if drafts is None or num is None:
        return tokens, count
    drafts.copy_(tokens)
    num.copy_(count)
    return drafts, num
