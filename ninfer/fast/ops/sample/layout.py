"""What the sample op reads, shared by ``naive.py`` and ``triton.py``: the per-row parameter columns, the flag bits,
the status codes and the tensors of one call.

Per-row parameters are two views of one int64 buffer (int columns, then float64 columns), so the host fills one
pinned row per batch row and a single copy makes them graph input data. Tables are indexed by a row's ``ROW``
column (the sequence's block-table row), never by its batch position, so a captured graph serves any sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# int64 columns of ``SampleInputs.iparams``
ROW = 0  # the sequence's table row (bias, blocked, prompt_seen, counts)
TOP_K = 1  # 0 is off
SEED = 2  # the resolved seed, as int64 two's complement of the uint64
POSITION = 3  # absolute position of the drawn token
FLAGS = 4  # the bits below
NUM_LOGPROBS = 5  # -1: no logprobs; n >= 0: the chosen token's logprob and the n most likely
INT_COLUMNS = 6

# float64 columns of ``SampleInputs.fparams`` (float32 parameters are rounded to float32 in the kernel, as the host
# rounds a Python float)
TEMPERATURE = 0
TOP_P = 1  # 1 is off
MIN_P = 2  # 0 is off
REPETITION = 3
FREQUENCY = 4
PRESENCE = 5
FLOAT_COLUMNS = 6

# FLAGS bits: each turns one step of docs/sampling.md section 3 on for the row
GREEDY = 1
MASK = 2  # step 2, the batch row's grammar bitmask
BIAS = 4  # step 1, the table row's dense bias
MIN_TOKENS = 8  # step 3, the table row's blocked ids
REPETITION_ON = 16  # step 4, each penalty term separately, as the host skips a neutral one
FREQUENCY_ON = 32
PRESENCE_ON = 64

# status codes, one per row: any but OK becomes that row's RowFailure on the host
OK = 0
BAD_LOGITS = 1  # NaN or +inf after steps 1-4
ALL_MASKED = 2  # every token -inf after steps 1-4


def bitmask_words(vocab: int) -> int:
    """int32 words of an xgrammar bitmask over ``vocab`` tokens."""
    return (vocab + 31) // 32


@dataclass(frozen=True)
class SampleInputs:
    """One call's inputs besides the logits [B, V]. Batch tensors have B rows; tables have one row per sequence
    slot (indexed through ``iparams[:, ROW]``), and are read only where the row's flag asks for them."""

    iparams: torch.Tensor  # [B, INT_COLUMNS] int64 (row stride may be larger)
    fparams: torch.Tensor  # [B, FLOAT_COLUMNS] float64 (same row stride as iparams)
    masks: torch.Tensor  # [B, W] int32 grammar bitmask per batch row, bit t % 32 of word t // 32 allows t
    bias: torch.Tensor  # [R, V] float32 logit bias (0 where unbiased)
    blocked: torch.Tensor  # [R, W] int32 bitmask of the ids min_tokens blocks (stop ids, EOS unless ignore_eos)
    prompt_seen: torch.Tensor  # [R, W] int32 bitmask of the prompt's ids (repetition penalty)
    counts: torch.Tensor  # [R, V] int32 output-token counts

    def rows(self, B: int) -> "SampleInputs":
        """The first B batch rows (tables unchanged)."""
        return SampleInputs(self.iparams[:B], self.fparams[:B], self.masks[:B], self.bias, self.blocked,
                            self.prompt_seen, self.counts)



def pack_bits(allowed: torch.Tensor) -> torch.Tensor:
    """bool [..., V] -> int32 [..., W] bitmask in xgrammar's layout (on the input's device)."""
    vocab = allowed.shape[-1]
    words = bitmask_words(vocab)
    bits = torch.zeros(*allowed.shape[:-1], words * 32, dtype=torch.int64, device=allowed.device)
    bits[..., :vocab] = allowed
    shift = torch.arange(32, dtype=torch.int64, device=allowed.device)
    packed = (bits.view(*allowed.shape[:-1], words, 32) << shift).sum(-1)  # [..., W] in [0, 2^32)
    return (packed - ((packed >> 31) << 32)).to(torch.int32)  # the same bits as int32 two's complement


def ids_bitmask(ids, vocab: int) -> torch.Tensor:
    """int32 [W] bitmask (on the CPU) with the bits of the given token ids set; ids must lie in [0, vocab)."""
    allowed = torch.zeros(vocab, dtype=torch.bool)
    allowed[torch.as_tensor(ids, dtype=torch.int64)] = True
    return pack_bits(allowed)
