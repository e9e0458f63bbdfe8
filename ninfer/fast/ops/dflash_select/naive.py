"""One step of DFlash2's candidate-selector walk for R rows, in plain fp32 torch: the scores of each row's K
candidates at one draft slot after the token the row took at the slot before.

    scores[i, k] = unary[i, k] + < A[prev[i]] * proj[i], B[cand[i, k]] >

A, B are the predecessor and successor codebooks [V, r]; proj[i] is hidden_projection of the slot's final-normed
hidden. `ninfer.reference.dflash_selector.CandidateSelector.scores` is the same for one row.
"""

from __future__ import annotations

import torch


def dflash_select_naive(unary: torch.Tensor, cand: torch.Tensor, proj: torch.Tensor, prev: torch.Tensor,
                        pred: torch.Tensor, succ: torch.Tensor) -> torch.Tensor:
    """unary [R, K], cand [R, K] token ids, proj [R, r], prev [R] token ids, pred/succ [V, r] -> fp32 [R, K]."""
    ctx = pred.float()[prev.long()] * proj.float()  # [R, r]
    return unary.float() + torch.einsum("rkj,rj->rk", succ.float()[cand.long()], ctx)
