"""A lean greedy draft draw in plain torch: what `SpecSampler.draw_static` does for a draw variant whose steps read
no row parameter (no bias, mask, min_tokens, penalty or random row)."""

from __future__ import annotations

import torch


def greedy_draw_naive(logits: torch.Tensor, drafts: torch.Tensor, num: torch.Tensor, room: torch.Tensor,
                      j: torch.Tensor) -> torch.Tensor:
    """Draft j of rows 0..B-1 from logits [B, V]: the argmax (its first index; a NaN counts as the maximum, as
    torch.argmax has it), written to drafts[b, j] (drafts [M, k] int64); num [M] int32, each row's drafts so far
    that could be drawn, grows by one where the row's maximum is finite (no NaN or +inf, not all -inf), every draft
    before was drawable (num[b] == j) and the row has room (j < room[b]); j [1] int64 is left as it is. Returns
    the tokens [B] int64."""
    B = logits.shape[0]
    x = logits.float()
    token = torch.argmax(x, dim=-1)
    ok = torch.isfinite(x.amax(-1))
    drafts[:B].index_copy_(1, j, token[:, None])
    num[:B] += ok & (num[:B] == j) & (j < room[:B])
    return token
