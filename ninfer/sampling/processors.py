"""Steps 1-4 of the sampling pipeline: the logit adjustments that depend on one request.

Each function takes one float32 logits row [V] and returns a new row; inputs are never written.
The order is fixed (docs/sampling.md): logit_bias -> allowed-token mask -> min_tokens stop mask
-> penalties. Masking writes -inf, and every later step keeps -inf at -inf.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ninfer.contracts import RowFailure
from ninfer.sampling.params import SamplingParams

NEG_INF = float("-inf")


class SamplingError(ValueError):
    """Inputs the sampler cannot draw from: a bad token id, a bad mask, nothing left to pick. `failure` is the typed
    reason a Program puts on the row (PendingRow.failed): a sampling failure ends one request, never the Engine."""

    def __init__(self, message: str, failure: RowFailure = RowFailure.INVALID_SAMPLING_INPUT):
        super().__init__(message)
        self.failure = failure


def _ids_tensor(field: str, ids: Sequence[int] | torch.Tensor, vocab_size: int,
                device: torch.device) -> torch.Tensor:
    ids = torch.as_tensor(ids, dtype=torch.int64, device=device).reshape(-1)  # [N]
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise SamplingError(f"{field}: token ids must be in [0, {vocab_size}), got "
                            f"[{int(ids.min())}, {int(ids.max())}]")
    return ids


def apply_logit_bias(x: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """x[t] += float32(bias[t]) for every (t, bias) in params.logit_bias."""
    if not params.logit_bias:
        return x
    tokens = _ids_tensor("logit_bias", [t for t, _ in params.logit_bias], x.shape[-1], x.device)
    bias = torch.tensor([b for _, b in params.logit_bias], dtype=torch.float32, device=x.device)
    return x.index_add(0, tokens, bias)


def allowed_to_bool(allowed: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """An allowed-token mask as bool [V].

    Accepts bool [V] or an int32 bitmask [ceil(V / 32)] in xgrammar's layout: bit (t % 32) of
    word t // 32 is 1 when token t is allowed.
    """
    if allowed.dtype == torch.bool:
        if allowed.shape != (vocab_size,):
            raise SamplingError(f"allowed: bool mask must have shape ({vocab_size},), got {tuple(allowed.shape)}")
        return allowed
    words = (vocab_size + 31) // 32
    if allowed.dtype != torch.int32 or allowed.shape != (words,):
        raise SamplingError(f"allowed: bitmask must be int32 of shape ({words},), got "
                            f"{allowed.dtype} {tuple(allowed.shape)}")
    token = torch.arange(vocab_size, device=allowed.device)
    # int32 >> is arithmetic, but only bit 0 of the shifted word is kept
    return ((allowed.to(torch.int64)[token // 32] >> (token % 32)) & 1).bool()


def apply_allowed(x: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """x[t] = -inf where the grammar (or any other gate) does not allow token t."""
    if allowed is None:
        return x
    keep = allowed_to_bool(allowed.to(x.device), x.shape[-1])
    return x.masked_fill(~keep, NEG_INF)


def min_tokens_blocked(params: SamplingParams, num_output_tokens: int,
                       eos_token_ids: Sequence[int]) -> tuple[int, ...]:
    """Token ids that may not be drawn yet: the ids that would end the request early.

    That is stop_token_ids plus the EOS ids, except under ignore_eos where EOS does not stop
    anything and so needs no blocking (vLLM's rule).
    """
    if num_output_tokens >= params.min_tokens:
        return ()
    eos = () if params.ignore_eos else tuple(eos_token_ids)
    return tuple(sorted(set(params.stop_token_ids) | set(eos)))


def apply_min_tokens(x: torch.Tensor, params: SamplingParams, num_output_tokens: int,
                     eos_token_ids: Sequence[int]) -> torch.Tensor:
    """x[t] = -inf for stop and EOS ids while fewer than min_tokens tokens were produced."""
    blocked = min_tokens_blocked(params, num_output_tokens, eos_token_ids)
    if not blocked:
        return x
    ids = _ids_tensor("stop_token_ids/eos_token_ids", blocked, x.shape[-1], x.device)
    return x.index_fill(0, ids, NEG_INF)


def apply_penalties(x: torch.Tensor, params: SamplingParams, prompt_token_ids: Sequence[int],
                    output_token_ids: Sequence[int]) -> torch.Tensor:
    """Repetition (vLLM), then frequency and presence (OpenAI) penalties.

    Repetition applies to tokens seen in prompt or output: x / r where x > 0, else x * r.
    Frequency and presence apply to output tokens: x - f * count - p * (count > 0).
    All arithmetic is float32 with the penalties rounded to float32 first.
    """
    if not params.has_penalties:
        return x
    vocab_size = x.shape[-1]
    output = _ids_tensor("output_token_ids", output_token_ids, vocab_size, x.device)
    counts = torch.bincount(output, minlength=vocab_size)  # [V]
    if params.repetition_penalty != 1.0:
        prompt = _ids_tensor("prompt_token_ids", prompt_token_ids, vocab_size, x.device)
        seen = counts > 0
        seen[prompt] = True
        r = torch.tensor(params.repetition_penalty, dtype=torch.float32, device=x.device)
        x = torch.where(seen, torch.where(x > 0, x / r, x * r), x)
    if params.frequency_penalty != 0.0:
        f = torch.tensor(params.frequency_penalty, dtype=torch.float32, device=x.device)
        x = x - f * counts.to(torch.float32)
    if params.presence_penalty != 0.0:
        p = torch.tensor(params.presence_penalty, dtype=torch.float32, device=x.device)
        x = x - p * (counts > 0).to(torch.float32)
    return x


def adjust_logits(logits: torch.Tensor, params: SamplingParams, *,
                  prompt_token_ids: Sequence[int], output_token_ids: Sequence[int],
                  eos_token_ids: Sequence[int], allowed: torch.Tensor | None) -> torch.Tensor:
    """Steps 1-4 on one row [V]: the logits greedy takes its argmax of. Float32 result."""
    x = logits.to(torch.float32)  # [V]
    x = apply_logit_bias(x, params)
    x = apply_allowed(x, allowed)
    x = apply_min_tokens(x, params, len(output_token_ids), eos_token_ids)
    return apply_penalties(x, params, prompt_token_ids, output_token_ids)
