"""DraftBlock: a speculative round's drafts on the device, seen by the Program core as the host's
``[(drafts, q), ...]`` of ``ModelExecutor.draft``.

The fast round never needs the drafts on the host before acceptance: the verify pass reads the tokens from the
device and acceptance runs there too, and the round's one readback brings the drafts back with the accepted tokens
(``fill_host``). Code that does look at them earlier (a test recording drafts, the oracle) gets them through one
host copy on first access. ``LazyFed`` is a row's fed block [pending, d1..dk'] with its length known on the host,
so the core can take pages and record the provisional step before any token is read back.
"""

from __future__ import annotations

from collections.abc import Sequence as SequenceABC
from typing import Any, Sequence

import torch

from ninfer.fast import hostcopy
from ninfer.fast.hostcopy import to_device


class DraftBlock(SequenceABC):
    def __init__(self, lens: Sequence[int], tokens: torch.Tensor, num: torch.Tensor, z: torch.Tensor | None,
                 greedy: Sequence[bool]):
        self.lens = list(lens)  # k' per row: the tokens verify consumes after the pending one
        self.tokens = tokens  # [B, k] long; past lens[b] anything in range
        self.num = num  # [B] int32: drafts acceptance may take (< lens[b] where a draft could not be drawn)
        self.z = z  # [B, k, V] fp32 processed draft logits (q = softmax) for random rows, None when all greedy
        self.greedy = list(greedy)
        self._host: list[list[int]] | None = None

    @classmethod
    def empty(cls, lens: Sequence[int], k: int, vocab: int, device: torch.device, greedy: Sequence[bool]
              ) -> "DraftBlock":
        B = len(lens)
        # a random row needs q even without drafts: spec_accept draws every bonus of a call without q greedily
        z = None if all(greedy) else torch.full((B, k, vocab), float("-inf"), device=device)
        return cls(lens, torch.zeros(B, k, dtype=torch.long, device=device),
                   torch.zeros(B, dtype=torch.int32, device=device), z, greedy)

    @classmethod
    def from_host(cls, drafts: Sequence[tuple[tuple[int, ...], list[Any]]], greedy: Sequence[bool], k: int,
                  vocab: int, device: torch.device) -> "DraftBlock":
        """A host drafter's (drafts, q) rows (a test's ForcedDrafts, a benchmark's forced drafts) of rows greedy or
        not: q [V] float64 probabilities become logits log q (softmax(log q) = q; a point mass is 0 at its draft,
        -inf elsewhere)."""
        lens = [len(d) for d, _ in drafts]
        rows = [list(d) + [0] * (k - len(d)) for d, _ in drafts]
        block = cls(lens, to_device(rows, device, torch.long), to_device(lens, device), None, greedy)
        if not all(greedy):
            z = torch.full((len(drafts), k, vocab), float("-inf"))
            for b, (_, q) in enumerate(drafts):
                for j, qj in enumerate(q):
                    if qj is not None:
                        z[b, j] = torch.log(qj.to(torch.float64)).to(torch.float32)  # a host drafter's q
            block.z = z.to(device)
        block._host = [list(d) for d, _ in drafts]
        return block

    def fill_host(self, tokens: Sequence[Sequence[int]]) -> None:
        """The drafts [B][k] as the round's readback brought them."""
        self._host = [list(t[:n]) for t, n in zip(tokens, self.lens)]

    def host(self, b: int) -> tuple[int, ...]:
        if self._host is None:
            host = torch.empty(self.tokens.shape, dtype=torch.long, pin_memory=self.tokens.is_cuda)
            host.copy_(self.tokens, non_blocking=True)
            hostcopy.host_sync(self.tokens.device)
            self.fill_host(host.numpy().tolist())
        return tuple(self._host[b])

    def __len__(self) -> int:
        return len(self.lens)

    def __getitem__(self, b):
        if isinstance(b, slice):
            return [self[i] for i in range(*b.indices(len(self)))]
        drafts = self.host(b)
        if self.greedy[b] or self.z is None:
            return drafts, [None] * len(drafts)
        return drafts, [torch.softmax(self.z[b, j].double(), dim=-1) for j in range(len(drafts))]

    def feds(self, pending: Sequence[int]) -> list["LazyFed"]:
        return [LazyFed(self, b, p) for b, p in enumerate(pending)]

    def fed_tokens(self, pending: Sequence[int]) -> torch.Tensor:
        """Every row's [pending, d1..dk'] packed along one device tensor [sum(lens) + B], without a host read."""
        dev, k = self.tokens.device, self.tokens.shape[1]
        full = torch.cat([to_device(list(pending), dev, torch.long)[:, None], self.tokens], dim=1)  # [B, k + 1]
        index = [b * (k + 1) + j for b, n in enumerate(self.lens) for j in range(n + 1)]
        return full.view(-1).index_select(0, to_device(index, dev, torch.long))


class LazyFed(SequenceABC):
    """Row b's fed tokens (pending, then its drafts): the length on the host, the tokens on first access."""

    def __init__(self, block: DraftBlock, b: int, pending: int):
        self.block, self.b, self.pending = block, b, pending

    def __len__(self) -> int:
        return self.block.lens[self.b] + 1

    def __getitem__(self, i):
        return ((self.pending,) + self.block.host(self.b))[i]

    def __repr__(self) -> str:
        return f"LazyFed(row {self.b}, {len(self)} tokens)"
