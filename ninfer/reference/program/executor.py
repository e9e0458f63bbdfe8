"""ReferenceExecutor: the reference Program's model calls behind the Program core's `ModelExecutor` interface.

Each call assembles a private SequenceState from the stores (the slot's GDN state, the block table's KV up to the
frontier), runs the reference model on it and writes the new positions and the advanced GDN state back, so the
stores always hold the live state and the core's backup slot holds the committed one. Draws are
`ninfer.sampling.draw` on the host.

With the MTP backend every consumption of tokens also advances the slot's MTP state by the pairs it completes
(`_advance_mtp`), so the MTP state is a function of the consumed tokens like the rest of the live state: backups,
checkpoints, replays and resumes carry it without a second bookkeeping. Drafting (`draft`) runs on a private copy.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Sequence

import torch

from ninfer.program_core import ActiveSequence, Drawn
from ninfer.reference.model import ReferenceModel
from ninfer.reference.state import SequenceState
from ninfer.sampling import RowContext, SamplingError, draw, draw_draft

from .stores import KVPages, MTPState, StateSlots


def _mtp_view(mtp: MTPState) -> SequenceState:
    """A SequenceState that holds only MTP KV (what ReferenceModel.mtp_forward reads and extends)."""
    return SequenceState(gdn={}, kv={}, mtp_kv=mtp.kv)


class ReferenceExecutor:
    def __init__(self, model: ReferenceModel, pages: KVPages, slots: StateSlots, eos_token_ids: tuple[int, ...],
                 backup_slot: Callable[[int], int]):
        self.model, self.pages, self.slots = model, pages, slots
        self.eos_token_ids, self.backup_slot = eos_token_ids, backup_slot

    # ---- state between the stores and the model ----------------------------------------------------------
    def _state(self, seq: ActiveSequence, start: int) -> SequenceState:
        """A private SequenceState at position `start`: the slot's GDN state and the table's KV before `start`."""
        return SequenceState(gdn=self.slots.load(seq.handle.slot), kv=self.pages.gather(seq.table, start),
                             next_position=start)

    def _write(self, seq: ActiveSequence, state: SequenceState, start: int, tokens: Sequence[int],
               hidden: torch.Tensor) -> None:
        """The positions consumed from `start`, the advanced GDN state and (with the backend) the MTP state back
        into the stores; hidden [T, H] is the target's final-normed output over `tokens`."""
        slot = seq.handle.slot
        self.pages.write(seq.table, state.kv, start, state.next_position)
        self.slots.store(slot, state.gdn)
        mtp = self.slots.load_mtp(slot)
        if mtp is not None:
            self._advance_mtp(mtp, hidden, tokens, start)
            self.slots.store_mtp(slot, mtp)

    def _run(self, seq: ActiveSequence, start: int, tokens: Sequence[int], chunked: bool) -> torch.Tensor:
        """Consume `tokens` at positions start.. on the live state in place; logits [T, V]. The step recurrence
        (`chunked=False`) is what a decode round runs, so a verified or replayed block equals the same tokens
        decoded one by one."""
        state = self._state(seq, start)
        logits, hidden = self.model.prefill(torch.tensor(tokens), state, chunked=chunked, return_hidden=True)
        self._write(seq, state, start, tokens, hidden)
        return logits

    def _advance_mtp(self, mtp: MTPState, hidden: torch.Tensor, tokens: Sequence[int], start: int) -> None:
        """The MTP pairs that consuming `tokens` at start.. completes: (h_p, x_{p+1}) for p = start-1 .. end-2
        (h_{start-1} is the stored hidden; there is none at position 0), then h_{end-1} becomes the stored one."""
        assert mtp.kv[0].length == max(start - 1, 0), "MTP state out of step with the frontier"
        if start == 0:
            h_in, x_in = hidden[:-1], tokens[1:]
        else:
            h_in, x_in = torch.cat([mtp.hidden[None], hidden[:-1]]), tokens
        if len(x_in):
            self.model.mtp_forward(h_in, torch.tensor(x_in), _mtp_view(mtp), step=0)
        mtp.hidden = hidden[-1].clone()

    def _draw(self, seq: ActiveSequence, logits: torch.Tensor, position: int, mask: Any | None) -> Drawn:
        """Draw at absolute `position` from fp32 logits [V]; the row's RowFailure when the sampler cannot."""
        try:
            return draw(logits, seq.params, seq.seed, position, prompt=seq.prompt, outputs=seq.outputs,
                        eos_token_ids=self.eos_token_ids, mask=mask)
        except SamplingError as e:
            return e.failure

    # ---- ModelExecutor -------------------------------------------------------------------------------------
    def prefill(self, seq: ActiveSequence, start: int, end: int) -> torch.Tensor:
        return self._run(seq, start, seq.prompt[start:end], chunked=True)[-1]  # [V]

    def draw_first(self, seq: ActiveSequence, logits: torch.Tensor, mask: Any | None) -> Drawn:
        return self._draw(seq, logits, len(seq.prompt), mask)

    def decode(self, seqs: Sequence[ActiveSequence], masks: Sequence[Any | None]) -> list[Drawn]:
        drawn = []
        for seq, mask in zip(seqs, masks):
            self.slots.copy(seq.handle.slot, self.backup_slot(seq.row))
            state = self._state(seq, seq.frontier)
            logits, hidden = self.model.decode_step(seq.pending, state, return_hidden=True)  # [V] at frontier + 1
            self._write(seq, state, seq.frontier, (seq.pending,), hidden[None])
            drawn.append(self._draw(seq, logits, seq.frontier + 1, mask))
        return drawn

    def feed(self, seq: ActiveSequence, tokens: Sequence[int]) -> None:
        self._run(seq, seq.frontier, tokens, chunked=False)

    def record(self, committed: Sequence[tuple[int, Hashable, Sequence[int]]]) -> None:
        """Nothing to follow: a host draw reads the sequence's committed outputs directly."""

    # ---- speculative backend (MTP) -------------------------------------------------------------------------
    def draft(self, seqs: Sequence[ActiveSequence], ctxs: Sequence[RowContext], ks: Sequence[int]
              ) -> list[tuple[tuple[int, ...], list[torch.Tensor | None]]]:
        """k drafts per row from the committed MTP state: the first from (h_{t-1}, pending), each next one from the
        previous MTP output and draft (the MTP layer applied recursively), on a private copy of the MTP KV."""
        out = []
        for seq, ctx, k in zip(seqs, ctxs, ks):
            drafts: list[int] = []
            qs: list[torch.Tensor | None] = []
            if k:
                mtp = self.slots.load_mtp(seq.handle.slot)
                h, x, view = mtp.hidden, seq.pending, _mtp_view(mtp)
                for j in range(k):
                    logits, h_out = self.model.mtp_forward(h[None], torch.tensor([x]), view, step=j,
                                                           return_hidden=True)  # [1, V], [1, H]
                    try:
                        x, q = draw_draft(logits[0], ctx, seq.frontier + 1 + j, drafts)
                    except SamplingError:
                        break  # a draft distribution that cannot be drawn from ends the drafts, not the request
                    drafts.append(x)
                    qs.append(q)
                    h = h_out[0]
            out.append((tuple(drafts), qs))
        return out

    def verify(self, seqs: Sequence[ActiveSequence], feds: Sequence[tuple[int, ...]]) -> list[torch.Tensor]:
        """Back each row up, then consume [pending, d1..dk] at the frontier in one pass: logits [k + 1, V]."""
        out = []
        for seq, fed in zip(seqs, feds):
            self.slots.copy(seq.handle.slot, self.backup_slot(seq.row))
            out.append(self._run(seq, seq.frontier, fed, chunked=False))
        return out
