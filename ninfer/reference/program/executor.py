"""ReferenceExecutor: the reference Program's model calls behind the Program core's `ModelExecutor` interface.

Each call assembles a private SequenceState from the stores (the slot's GDN state, the block table's KV up to the
frontier), runs the reference model on it and writes the new positions and the advanced GDN state back, so the
stores always hold the live state and the core's backup slot holds the committed one. Draws are
`ninfer.sampling.draw` on the host.

With a speculative backend (`mtp_backend`, `dflash_backend`) every consumption of tokens also advances the slot's
backend state (the MTP pairs it completes, the drafter context of its positions), so that state is a function of
the consumed tokens like the rest of the live state: backups, checkpoints, replays and resumes carry it without a
second bookkeeping. Drafting (`draft`) runs on a private copy. A backend sees what the target consumed: the model
ids, the image rows and the sequence's MRoPE positions (a verify rotates at index + rope_delta like a decode).

A sequence with images (`seq.media`) embeds the pad id at each placeholder, replaces those rows with the image's
features from the vision tower, and rotates with the Frontend's MRoPE positions (index + rope_delta after the
prompt). An image is encoded whole whenever a prefill piece reaches any of its pads (a resume from a checkpoint
inside an image takes the rest of its rows); the last few encodings are kept, so an image spanning several pieces
is encoded once.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Hashable, Protocol, Sequence

import torch

from ninfer.contracts.media import PromptMedia
from ninfer.program_core import ActiveSequence, Drawn
from ninfer.reference.model import ReferenceModel
from ninfer.reference.state import SequenceState
from ninfer.reference.vision import VisionTower
from ninfer.sampling import RowContext, SamplingError, draw

from .stores import KVPages, StateSlots


def _rows_in(embeds: tuple[torch.Tensor, torch.Tensor] | None, a: int, b: int):
    """The (rows, features) of `embeds` among token rows [a, b), rows relative to a (None when there are none)."""
    if embeds is None:
        return None
    keep = (embeds[0] >= a) & (embeds[0] < b)
    return (embeds[0][keep] - a, embeds[1][keep]) if bool(keep.any()) else None


class Backend(Protocol):
    """A speculative backend's state and drafts (`mtp_backend` describes the calls)."""

    wants_taps: bool

    def empty(self) -> Any: ...

    def advance(self, state: Any, tokens: Sequence[int], start: int, hidden: torch.Tensor, taps: dict,
                media: PromptMedia | None = None, embeds: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> None: ...

    def draft(self, state: Any, seq: ActiveSequence, ctx: RowContext, k: int
              ) -> tuple[tuple[int, ...], list[torch.Tensor | None]]: ...


FEATURE_CACHE = 4  # encoded images kept (an image's pads may span several prefill pieces)


class ReferenceExecutor:
    def __init__(self, model: ReferenceModel, pages: KVPages, slots: StateSlots, eos_token_ids: tuple[int, ...],
                 backup_slot: Callable[[int], int], backend: Backend | None = None, vision: VisionTower | None = None):
        self.model, self.pages, self.slots = model, pages, slots
        self.eos_token_ids, self.backup_slot, self.backend = eos_token_ids, backup_slot, backend
        self.vision = vision
        self._features: OrderedDict[tuple, torch.Tensor] = OrderedDict()

    def _image_features(self, img) -> torch.Tensor:
        key = (img.digest, img.grid)
        if key not in self._features:
            if self.vision is None:
                raise RuntimeError("a sequence with images reached a Program without the vision tower")
            self._features[key] = self.vision.encode(torch.from_numpy(img.pixels), img.grid)
            while len(self._features) > FEATURE_CACHE:
                self._features.popitem(last=False)
        self._features.move_to_end(key)
        return self._features[key]

    def _model_inputs(self, seq: ActiveSequence, start: int, tokens: Sequence[int]) -> dict:
        """Model ids, MRoPE positions [3, T] and image rows of `tokens` at sequence indices start.. (only the ids
        for a text sequence)."""
        media = seq.media
        if media is None:
            return {"tokens": torch.tensor(tokens)}
        end = start + len(tokens)
        rows, feats = [], []
        for img in media.images:
            lo, hi = max(start, img.offset), min(end, img.end)
            if lo < hi:
                rows.append(torch.arange(lo - start, hi - start))
                feats.append(self._image_features(img)[lo - img.offset:hi - img.offset])
        embeds = (torch.cat(rows), torch.cat(feats)) if rows else None
        return {"tokens": torch.tensor(media.model_ids(tokens)),
                "positions": torch.from_numpy(media.positions_for(start, end)), "embeds": embeds}

    def _state(self, seq: ActiveSequence, start: int) -> SequenceState:
        """A private SequenceState at position `start`: the slot's GDN state and the table's KV before `start`."""
        return SequenceState(gdn=self.slots.load(seq.handle.slot), kv=self.pages.gather(seq.table, start),
                             next_position=start)

    def _taps(self) -> dict[int, torch.Tensor] | None:
        """The dict the model fills with every layer's output, when the backend conditions on them."""
        return {} if self.backend is not None and self.backend.wants_taps else None

    def _write(self, seq: ActiveSequence, state: SequenceState, start: int, tokens: Sequence[int],
               hidden: torch.Tensor, taps: dict[int, torch.Tensor] | None,
               captures: Sequence[tuple[int, int]] = (), at: Sequence[SequenceState] = (),
               embeds: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """The positions consumed from `start`, the advanced GDN state and (with a backend) the backend state back
        into the stores; hidden [T, H] is the target's final-normed output over `tokens` (model ids), taps its
        layers', `embeds` the image rows it embedded. Each capture (frontier, slot) gets the GDN state `at` its
        frontier and the backend state there: the backend advances segment by segment between the captures, as a
        prefill cut at them would."""
        slot = seq.handle.slot
        self.pages.write(seq.table, state.kv, start, state.next_position)
        self.slots.store(slot, state.gdn)
        for (_, cap), ck in zip(captures, at):
            self.slots.store(cap, ck.gdn)
        bstate = None if self.backend is None else self.slots.load_backend(slot)
        bounds = [start, *(f for f, _ in captures), start + len(tokens)]
        for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
            if bstate is not None:
                part = None if taps is None else {n: t[a - start:b - start] for n, t in taps.items()}
                self.backend.advance(bstate, tokens[a - start:b - start], a, hidden[a - start:b - start], part,
                                     seq.media, _rows_in(embeds, a - start, b - start))
            if i < len(captures):
                self.slots.store_backend(captures[i][1], None if bstate is None else bstate.clone())
        if bstate is not None:
            self.slots.store_backend(slot, bstate)

    def _run(self, seq: ActiveSequence, start: int, tokens: Sequence[int], chunked: bool,
             captures: Sequence[tuple[int, int]] = ()) -> torch.Tensor:
        """Consume `tokens` at positions start.. on the live state in place; logits [T, V]. The step recurrence
        (`chunked=False`) is what a decode round runs, so a verified or replayed block equals the same tokens
        decoded one by one. `captures` (frontier, slot) inside the tokens (chunked only): their slots get the
        state at the frontier, the model's chunks restarting there."""
        state, taps = self._state(seq, start), self._taps()
        inputs = self._model_inputs(seq, start, tokens)
        ids = inputs.pop("tokens")
        at: list[SequenceState] | None = [] if captures else None
        logits, hidden = self.model.prefill(ids, state, chunked=chunked, return_hidden=True, taps=taps,
                                            checkpoints=at, at=[f - start for f, _ in captures] or None, **inputs)
        self._write(seq, state, start, ids.tolist(), hidden, taps, captures, at or (), inputs.get("embeds"))
        return logits

    def _draw(self, seq: ActiveSequence, logits: torch.Tensor, position: int, mask: Any | None) -> Drawn:
        """Draw at absolute `position` from fp32 logits [V]; the row's RowFailure when the sampler cannot."""
        try:
            prompt = seq.prompt if seq.media is None else seq.media.model_ids(seq.prompt)
            return draw(logits, seq.params, seq.seed, position, prompt=prompt, outputs=seq.outputs,
                        eos_token_ids=self.eos_token_ids, mask=mask)
        except SamplingError as e:
            return e.failure

    def prefill(self, seq: ActiveSequence, start: int, end: int,
                captures: Sequence[tuple[int, int]] = ()) -> torch.Tensor:
        return self._run(seq, start, seq.prompt[start:end], chunked=True, captures=captures)[-1]  # [V]

    def draw_first(self, seq: ActiveSequence, logits: torch.Tensor, mask: Any | None) -> Drawn:
        return self._draw(seq, logits, len(seq.prompt), mask)

    def decode(self, seqs: Sequence[ActiveSequence], masks: Sequence[Any | None]) -> list[Drawn]:
        drawn = []
        for seq, mask in zip(seqs, masks):
            self.slots.copy(seq.handle.slot, self.backup_slot(seq.row))
            state, taps = self._state(seq, seq.frontier), self._taps()
            positions = None if seq.media is None else torch.from_numpy(seq.media.positions_for(seq.frontier,
                                                                                                seq.frontier + 1))
            logits, hidden = self.model.decode_step(seq.pending, state, return_hidden=True, taps=taps,
                                                    positions=positions)  # [V], [H]
            self._write(seq, state, seq.frontier, (seq.pending,), hidden[None], taps)
            drawn.append(self._draw(seq, logits, seq.frontier + 1, mask))
        return drawn

    def feed(self, seq: ActiveSequence, tokens: Sequence[int]) -> None:
        self._run(seq, seq.frontier, tokens, chunked=False)

    def record(self, committed: Sequence[tuple[int, Hashable, Sequence[int]]]) -> None:
        """Nothing to follow: a host draw reads the sequence's committed outputs directly."""

    def draft(self, seqs: Sequence[ActiveSequence], ctxs: Sequence[RowContext], ks: Sequence[int]
              ) -> list[tuple[tuple[int, ...], list[torch.Tensor | None]]]:
        """k drafts per row from the committed backend state, on a private copy of it."""
        return [self.backend.draft(self.slots.load_backend(seq.handle.slot), seq, ctx, k) if k else ((), [])
                for seq, ctx, k in zip(seqs, ctxs, ks)]

    def verify(self, seqs: Sequence[ActiveSequence], feds: Sequence[tuple[int, ...]]) -> list[torch.Tensor]:
        """Back each row up, then consume [pending, d1..dk] at the frontier in one pass: logits [k + 1, V]."""
        out = []
        for seq, fed in zip(seqs, feds):
            self.slots.copy(seq.handle.slot, self.backup_slot(seq.row))
            out.append(self._run(seq, seq.frontier, fed, chunked=False))
        return out
