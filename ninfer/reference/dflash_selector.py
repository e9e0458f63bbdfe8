"""DFlash2's candidate selector: the top-K tokens of each draft slot, rescored by low-rank transitions.

    unary[j], cand[j] = topk(logits[j], K)                     slot j's candidates and their draft logits
    edge(p -> c at slot j) = < A[p] * proj(h_j), B[c] > + unary[j][c]       A, B: predecessor/successor codebooks

The walk starts from the verified anchor and moves slot by slot: slot j's scores depend on the token taken at slot
j - 1. `scores` gives slot j's scores as logits over the whole vocabulary (-inf outside the candidates), so the
caller draws the path token with the shared draft draw: argmax at temperature 0 (the best path), a draw at
temperature > 0 whose q (over the K candidates) goes to the lossless acceptance.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .scope import Scope


class CandidateSelector:
    def __init__(self, w: Scope, top_k: int, logits: torch.Tensor, hidden: torch.Tensor):
        """logits [S, V] and final-normed hidden [S, H] of the block's draft slots."""
        self.w = w
        self.unary, self.cand = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1)  # [S, K] each
        self.proj = F.linear(hidden, w["hidden_projection.weight"])  # [S, r]
        self.vocab = logits.shape[-1]

    def scores(self, slot: int, previous: int) -> torch.Tensor:
        """Slot `slot`'s scores after token `previous` as logits [V]: -inf outside the slot's candidates."""
        ctx = self.w["predecessor_codebook"][previous] * self.proj[slot]  # [r]
        edge = self.w["successor_codebook"][self.cand[slot]] @ ctx  # [K]
        z = torch.full((self.vocab,), float("-inf"), dtype=self.unary.dtype)
        z[self.cand[slot]] = self.unary[slot] + edge
        return z
