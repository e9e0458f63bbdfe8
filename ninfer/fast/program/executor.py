"""FastExecutor: the fast Program's model calls behind the Program core's `ModelExecutor` interface.

Prefill and control run FastModel's prefill on the live slot and block-table row; decode replays the per-exact-B
graph, which starts with each row's backup copy (live slot -> the backup slot of its row) and ends with the device
sampler's draw. The sampler's per-row tables follow the committed outputs (`record`).
"""

from __future__ import annotations

from typing import Any, Hashable, Sequence

import torch

from ninfer.fast.graph_runner import DecodeGraphRunner
from ninfer.fast.model import FastModel
from ninfer.fast.sampling import DeviceSampler, SampleRow
from ninfer.program_core import ActiveSequence, Drawn


def _sample_rows(seqs: Sequence[ActiveSequence], masks: Sequence[Any | None]) -> list[SampleRow]:
    """One device draw per sequence at its next position (the pending token, if any, is consumed first)."""
    return [SampleRow(s.params, s.seed, s.frontier + (s.pending is not None), s.row, s.handle, s.num_outputs, s, m)
            for s, m in zip(seqs, masks)]


class FastExecutor:
    def __init__(self, model: FastModel, runner: DecodeGraphRunner, sampler: DeviceSampler):
        self.model, self.runner, self.sampler = model, runner, sampler
        self.device = model.device

    def _tokens(self, tokens: Sequence[int]) -> torch.Tensor:
        return torch.tensor(tokens, dtype=torch.long, device=self.device)  # [T]

    def prefill(self, seq: ActiveSequence, start: int, end: int) -> torch.Tensor:
        return self.model.prefill(self._tokens(seq.prompt[start:end]), seq.handle.slot, seq.row, start)  # [V] fp32

    def draw_first(self, seq: ActiveSequence, logits: torch.Tensor, mask: Any | None) -> Drawn:
        (drawn,) = self.sampler.sample(logits[None], _sample_rows([seq], [mask]))  # position len(prompt)
        return drawn

    def decode(self, seqs: Sequence[ActiveSequence], masks: Sequence[Any | None]) -> list[Drawn]:
        pos = [s.frontier for s in seqs]
        variant = self.sampler.prepare(_sample_rows(seqs, masks))  # positions frontier + 1
        self.runner.run_lists(([s.pending for s in seqs], [s.handle.slot for s in seqs], [s.row for s in seqs],
                               [p + 1 for p in pos], pos), variant=variant)
        return self.sampler.collect()

    def feed(self, seq: ActiveSequence, tokens: Sequence[int]) -> None:
        self.model.prefill(self._tokens(tokens), seq.handle.slot, seq.row, seq.frontier)

    def record(self, committed: Sequence[tuple[int, Hashable, Sequence[int]]]) -> None:
        self.sampler.record(committed)
