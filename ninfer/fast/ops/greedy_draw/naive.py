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
    x = logits.float()
    token = torch.argmax(x, dim=-1)
    record_draft(drafts, num, room, j, token, torch.isfinite(x.amax(-1)))
    return token


def record_draft(drafts: torch.Tensor, num: torch.Tensor, room: torch.Tensor, j: torch.Tensor, token: torch.Tensor,
                 ok: torch.Tensor) -> None:
    """Draft j of rows 0..B-1 (token [B] long, ok [B] bool: could it be drawn) into drafts[:, j], and num grown by
    one where ok, every draft before was drawable (num == j) and the row has room (j < room): a row keeps drafting
    while its drafts so far form an unbroken drawable prefix (a bool added in place: no cast launch)."""
    B = token.shape[0]
    drafts[:B].index_copy_(1, j, token[:, None])
    num[:B] += ok & (num[:B] == j) & (j < room[:B])
