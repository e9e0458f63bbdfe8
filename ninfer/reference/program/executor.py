"""ReferenceExecutor: the reference Program's model calls behind the Program core's `ModelExecutor` interface.

Each call assembles a private SequenceState from the stores (the slot's GDN state, the block table's KV up to the
frontier), runs the reference model on it and writes the new positions and the advanced GDN state back, so the
stores always hold the live state and the core's backup slot holds the committed one. Draws are
`ninfer.sampling.draw` on the host.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Sequence

import torch

from ninfer.program_core import ActiveSequence, Drawn
from ninfer.reference.model import ReferenceModel
from ninfer.reference.state import SequenceState
from ninfer.sampling import SamplingError, draw

from .stores import KVPages, StateSlots


class ReferenceExecutor:
    def __init__(self, model: ReferenceModel, pages: KVPages, slots: StateSlots, eos_token_ids: tuple[int, ...],
                 backup_slot: Callable[[int], int]):
        self.model, self.pages, self.slots = model, pages, slots
        self.eos_token_ids, self.backup_slot = eos_token_ids, backup_slot

    # ---- state between the stores and the model ----------------------------------------------------------
    def _state(self, seq: ActiveSequence, at: int) -> SequenceState:
        """A private SequenceState at position `at`: the slot's GDN state and the table's KV before `at`."""
        return SequenceState(gdn=self.slots.load(seq.handle.slot), kv=self.pages.gather(seq.table, at),
                             next_position=at, mtp_kv=[])

    def _write(self, seq: ActiveSequence, state: SequenceState, start: int) -> None:
        """Positions [start, state.next_position) and the advanced GDN state back into the stores."""
        self.pages.write(seq.table, state.kv, start, state.next_position)
        self.slots.store(seq.handle.slot, state.gdn)

    def _run(self, seq: ActiveSequence, start: int, tokens: Sequence[int]) -> torch.Tensor:
        state = self._state(seq, start)
        logits = self.model.prefill(torch.tensor(tokens), state)  # [T, V]
        self._write(seq, state, start)
        return logits

    def _draw(self, seq: ActiveSequence, logits: torch.Tensor, position: int, mask: Any | None) -> Drawn:
        """Draw at absolute `position` from fp32 logits [V]; the row's RowFailure when the sampler cannot."""
        try:
            return draw(logits, seq.params, seq.seed, position, prompt=seq.prompt, outputs=seq.outputs,
                        eos_token_ids=self.eos_token_ids, mask=mask)
        except SamplingError as e:
            return e.failure

    # ---- ModelExecutor -------------------------------------------------------------------------------------
    def prefill(self, seq: ActiveSequence, start: int, end: int) -> torch.Tensor:
        return self._run(seq, start, seq.prompt[start:end])[-1]  # [V]

    def draw_first(self, seq: ActiveSequence, logits: torch.Tensor, mask: Any | None) -> Drawn:
        return self._draw(seq, logits, len(seq.prompt), mask)

    def decode(self, seqs: Sequence[ActiveSequence], masks: Sequence[Any | None]) -> list[Drawn]:
        drawn = []
        for seq, mask in zip(seqs, masks):
            self.slots.copy(seq.handle.slot, self.backup_slot(seq.row))
            state = self._state(seq, seq.frontier)
            logits = self.model.decode_step(seq.pending, state)  # [V], the distribution at frontier + 1
            self._write(seq, state, seq.frontier)
            drawn.append(self._draw(seq, logits, seq.frontier + 1, mask))
        return drawn

    def feed(self, seq: ActiveSequence, tokens: Sequence[int]) -> None:
        self._run(seq, seq.frontier, tokens)

    def record(self, committed: Sequence[tuple[int, Hashable, Sequence[int]]]) -> None:
        """Nothing to follow: a host draw reads the sequence's committed outputs directly."""
