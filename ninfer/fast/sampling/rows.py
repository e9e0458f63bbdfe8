"""One draw as the device sampler sees it, and how a batch of draws becomes the sample op's graph input data: the
per-row flags, the graph variant a batch needs, and the host's own errors for inputs the device never reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import numpy as np
import torch

from ninfer.fast.ops.sample import layout as L
from ninfer.sampling import SamplingError, SamplingParams
from ninfer.sampling.processors import adjust_logits, allowed_to_bool, min_tokens_blocked

GREEDY, SAMPLE, TOP_K, SORT = "greedy", "sample", "top_k", "sort"
# greedy: steps 1-4 and the argmax; sample: also the race and logprobs; top_k: also top-k/top-p from the row's top
# TOP_K_BOUND values (every random row's top-k at most that); sort: top-k/top-p from a sort of the whole row
VARIANTS = (GREEDY, SAMPLE, TOP_K, SORT)
TOP_K_BOUND = 128  # Qwen3.5's released defaults draw at top-k 20 (ops/sample/cutoff.py)


@dataclass(frozen=True, eq=False)
class SampleRow:
    """What ``ninfer.sampling.draw`` takes for one row, plus where the sequence's tables live."""

    params: SamplingParams
    seed: int  # resolved, in [0, 2^64)
    position: int  # absolute position of the drawn token
    table_row: int  # the sequence's block-table row: its tables' row
    owner: Hashable  # the sequence's identity: another owner on table_row rebuilds the tables
    num_outputs: int  # committed output tokens, the pending one included (min_tokens counts them)
    history: Any  # has .prompt and .outputs; read only to build the tables or to reproduce a host error
    mask: Any | None = None  # int32 [W] xgrammar bitmask or bool [V]


def variant_of(rows: Sequence[SampleRow]) -> str:
    """The cheapest graph variant that serves every row."""
    random = [r.params for r in rows if not r.params.is_greedy]
    cut = truncation(random)
    if cut is not None:
        return cut
    if random or any(r.params.logprobs is not None for r in rows):
        return SAMPLE
    return GREEDY


def truncation(random: Sequence[SamplingParams]) -> str | None:
    """The variant whose cutoff serves these random rows' top-k/top-p: TOP_K when every row with a filter has a
    top-k in 1..TOP_K_BOUND, SORT when one has a larger top-k or top-p alone; None when no row has either."""
    cut = [p for p in random if p.effective_top_k > 0 or p.top_p < 1.0]
    if not cut:
        return None
    return TOP_K if all(0 < p.effective_top_k <= TOP_K_BOUND for p in cut) else SORT


def row_flags(row: SampleRow, eos_token_ids: Sequence[int], ahead: int = 0, masked: bool | None = None) -> int:
    """The FLAGS bits: which of steps 1-4 apply to this row now (the host applies the same ones); `ahead` more
    outputs (the drafts before a block position) and `masked` (a grammar row there; None: the row's own mask)
    describe the draw that many positions on."""
    p = row.params
    outputs = row.num_outputs + ahead
    flags = L.GREEDY if p.is_greedy else 0
    flags |= L.MASK if (row.mask is not None if masked is None else masked) else 0
    flags |= L.BIAS if p.logit_bias else 0
    if outputs < p.min_tokens and min_tokens_blocked(p, outputs, eos_token_ids):
        flags |= L.MIN_TOKENS
    flags |= L.REPETITION_ON if p.repetition_penalty != 1.0 else 0
    flags |= L.FREQUENCY_ON if p.frequency_penalty != 0.0 else 0
    return flags | (L.PRESENCE_ON if p.presence_penalty != 0.0 else 0)


def mask_words(mask: Any, vocab: int) -> torch.Tensor | None:
    """A well-formed mask as int32 words [W] (bool masks are packed); None when malformed."""
    if not isinstance(mask, torch.Tensor):
        return None
    if mask.dtype == torch.int32 and mask.shape == (L.bitmask_words(vocab),):
        return mask
    if mask.dtype == torch.bool and mask.shape == (vocab,):
        return L.pack_bits(mask)
    return None


def host_error(row: SampleRow, vocab: int, eos_token_ids: Sequence[int]) -> SamplingError | None:
    """The error the host sampler raises for this row's ids and mask before it looks at the logits (a bad token id
    or mask), found by running its own steps 1-4 on zeros; None when there is none."""
    try:
        if row.mask is not None and mask_words(row.mask, vocab) is None:
            allowed_to_bool(row.mask, vocab)
        adjust_logits(torch.zeros(vocab), row.params, prompt_token_ids=row.history.prompt,
                      output_token_ids=row.history.outputs, eos_token_ids=eos_token_ids, allowed=row.mask)
    except SamplingError as e:
        return e
    return None


def seed_word(seed: int) -> int:
    """A seed in [0, 2^64) as the int64 two's complement the op reads."""
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def fill_row(ints: np.ndarray, floats: np.ndarray, row: SampleRow, flags: int) -> None:
    """Write one row's parameter columns into the host staging views (int64 [NI], float64 [NF])."""
    p = row.params
    ints[L.ROW], ints[L.TOP_K], ints[L.SEED] = row.table_row, p.effective_top_k, seed_word(row.seed)
    ints[L.POSITION], ints[L.FLAGS] = row.position, flags
    ints[L.NUM_LOGPROBS] = -1 if p.logprobs is None else p.logprobs
    floats[L.TEMPERATURE], floats[L.TOP_P], floats[L.MIN_P] = p.temperature, p.top_p, p.min_p
    floats[L.REPETITION], floats[L.FREQUENCY] = p.repetition_penalty, p.frequency_penalty
    floats[L.PRESENCE] = p.presence_penalty
