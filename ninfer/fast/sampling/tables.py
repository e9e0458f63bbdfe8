"""Per-sequence sampling tables on the device, one row per block-table row (plus a dummy row for graph capture):
the dense logit bias, the ids min_tokens blocks, the prompt's ids and the output-token counts.

A row is rebuilt only when a different sequence first draws on it (``bind``); afterwards the Program adds each
committed token to its counts with one scatter (``add``), so no step copies a whole row to or from the host. Only
the tables a sequence's parameters use are written; the kernels read a table only where the row's flag asks.
"""

from __future__ import annotations

from typing import Hashable, Sequence

import torch

from ninfer.fast.hostcopy import to_device
from ninfer.fast.ops.sample.layout import bitmask_words, ids_bitmask
from ninfer.sampling import SamplingParams
from ninfer.sampling.processors import min_tokens_blocked


def _in_vocab(ids: Sequence[int], vocab: int) -> bool:
    # builtin min/max: a long prompt is checked at C speed
    return not ids or (min(ids) >= 0 and max(ids) < vocab)


class SequenceTables:
    """The sample op's table inputs (``SampleInputs.bias``, ``blocked``, ``prompt_seen``, ``counts``) and which
    sequence each row currently serves."""

    def __init__(self, rows: int, vocab: int, device: torch.device | str):
        R, W = rows + 1, bitmask_words(vocab)
        self.vocab = vocab
        self.device = torch.device(device)
        self.dummy_row = rows  # never bound: capture's rows read it, with every table flag off
        self.bias = torch.zeros(R, vocab, dtype=torch.float32, device=device)  # [R, V]
        self.blocked = torch.zeros(R, W, dtype=torch.int32, device=device)  # [R, W] bitmask
        self.prompt_seen = torch.zeros(R, W, dtype=torch.int32, device=device)  # [R, W] bitmask
        self.counts = torch.zeros(R, vocab, dtype=torch.int32, device=device)  # [R, V]
        self.owner: list[Hashable | None] = [None] * R
        self.counting = [False] * R  # the owner has penalties: its counts follow every commit
        # an id outside the vocabulary: the host sampler refuses such a row, so the device never reads it
        self.invalid = [False] * R

    def bound(self, row: int, owner: Hashable) -> bool:
        return self.owner[row] == owner

    def bind(self, row: int, owner: Hashable, params: SamplingParams, prompt: Sequence[int],
             outputs: Sequence[int], eos_token_ids: Sequence[int]) -> None:
        """Build `row`'s tables for a sequence with this history (the outputs drawn and committed so far)."""
        V = self.vocab
        self.owner[row], self.counting[row], self.invalid[row] = owner, params.has_penalties, False
        if params.logit_bias:
            ids = [t for t, _ in params.logit_bias]
            if _in_vocab(ids, V):
                self.bias[row].zero_()
                self.bias[row, torch.tensor(ids, device=self.device)] = torch.tensor(
                    [b for _, b in params.logit_bias], dtype=torch.float32, device=self.device)
            else:
                self.invalid[row] = True
        blocked = min_tokens_blocked(params, 0, eos_token_ids)
        if blocked:
            if _in_vocab(blocked, V):
                self.blocked[row].copy_(ids_bitmask(blocked, V))
            else:
                self.invalid[row] = True
        if params.has_penalties:
            self.counts[row].zero_()
            self.add([(row, owner, outputs)])
            if params.repetition_penalty != 1.0:
                if _in_vocab(prompt, V):
                    self.prompt_seen[row].copy_(ids_bitmask(prompt, V))
                else:
                    self.invalid[row] = True

    def add(self, committed: Sequence[tuple[int, Hashable, Sequence[int]]]) -> None:
        """Count committed output tokens: (row, owner, tokens) for each row; rows bound to another owner, or whose
        owner has no penalties, are skipped (a later bind counts their whole history)."""
        flat: list[int] = []
        for row, owner, tokens in committed:
            if self.owner[row] != owner or not self.counting[row]:
                continue
            if not _in_vocab(tokens, self.vocab):
                self.invalid[row] = True
            flat.extend(row * self.vocab + t for t in tokens if 0 <= t < self.vocab)
        if flat:
            index = to_device(flat, self.device, torch.int64)  # [N], queued without a host wait
            self.counts.view(-1).index_add_(0, index, torch.ones_like(index, dtype=torch.int32))

