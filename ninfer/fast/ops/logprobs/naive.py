"""Raw logprobs of a chosen token in plain torch: ``ninfer.sampling.logprobs.token_logprobs`` for a batch, on
device tensors and without a host sync. The values are log_softmax of the model logits before any bias, mask,
penalty or truncation (OpenAI's and vLLM's default)."""

from __future__ import annotations

import torch

from .layout import CHOSEN, COLUMNS, MAX_TOP, RANK, TOP_IDS, TOP_VALUES


def logprobs_naive(logits: torch.Tensor, tokens: torch.Tensor, num: torch.Tensor) -> torch.Tensor:
    """logits [B, V], tokens [B] (the chosen ids), num [B] (-1: none) -> int32 [B, COLUMNS] (layout.py).

    Every row is filled here (the first min(MAX_TOP, V) alternatives); the Triton op fills only rows with num >= 0
    and their first num alternatives, which is all a caller may read."""
    B, V = logits.shape
    lp = torch.log_softmax(logits.float(), dim=-1)  # [B, V]
    chosen = lp.gather(1, tokens.long()[:, None])  # [B, 1]
    rank = 1 + (lp > chosen).sum(-1)  # [B]
    # a stable descending sort orders by (logprob desc, id asc), the host's top_logprobs order
    values, ids = torch.sort(lp, dim=-1, descending=True, stable=True)
    n = min(MAX_TOP, V)
    out = torch.zeros(B, COLUMNS, dtype=torch.int32, device=logits.device)
    out[:, RANK] = rank.to(torch.int32)
    out[:, CHOSEN] = chosen[:, 0].view(torch.int32)
    out[:, TOP_IDS:TOP_IDS + n] = ids[:, :n].to(torch.int32)
    out[:, TOP_VALUES:TOP_VALUES + n] = values[:, :n].contiguous().view(torch.int32)
    return out
