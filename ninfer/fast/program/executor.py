"""FastExecutor: the fast Program's model calls behind the Program core's `ModelExecutor` interface.

Prefill and control run FastModel's prefill on the live slot and block-table row; decode replays the per-exact-B
graph, which starts with each row's backup copy (live slot -> the backup slot of its row) and ends with the device
sampler's draw. The sampler's per-row tables follow the committed outputs (`record`).

With the MTP backend (`model.mtp`), a round is `draft` (the MTP head, k' chained steps per row, each draft drawn on
the device), `verify` (each row backed up, then every row's [pending, drafts] in one multi-query target pass,
`FastModel.verify`, reading the drafts on the device) and `accept` (`SpecSampler`: p per verified position and
`spec_accept` on the device, one host copy of the results). The target pass and a short forced suffix run from the
verify graphs' static buffers (`VerifyGraphRunner`, one graph per exact B on CUDA), which back the rows up
themselves; the MTP head's chained draft steps, each with its draw, run from the draft graphs'
(`DraftGraphRunner`). Every consumption of tokens (prefill, verify, feed) also advances the slot's MTP state
(`MtpHead.advance`), so backups, checkpoints and resumes carry it, and `feed` runs the decode recurrence
(`FastModel.verify`), so forced tokens equal the same tokens decoded. A verify pass keeps the state after each block
position (GDN state and stored hidden) in the row's step slots (``plan.step_slot``), graphed or eager alike, and a
partly kept block takes its state from there (`select`): the commit copies one slot and runs no target pass.

With the DFlash backend (`dflash`, `dflash_backend.FastDFlashBackend`) the same consumptions ask the model for the
target taps and write the drafter context of their positions into the drafter's pages (inside the verify graphs, at
blocks of k + 1 = 16 or 8 tokens, for the verify and replay passes); `draft` is its one batched block pass (and
DFlash2's selector walk), drawn on the device into a `DraftBlock` like the MTP head's drafts.

A sequence with images (`seq.media`, `images.py`): prefill pieces embed the pad id at the placeholders, take the
tower's features there and rotate with the 3-row MRoPE positions; decode and forced tokens rotate at position +
rope_delta (a graph input row, so a text row's delta 0 costs nothing); the sampler's tables see the model ids. With a
backend, verify rotates every query at position + rope_delta, and the backend's state follows with the positions
docs/speculative.md ("Images") fixes: the MTP pairs at their MRoPE positions with an image token embedded by its
feature, the drafter context at MRoPE's temporal row.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Hashable, Sequence

import torch

from ninfer.fast.draft_graphs import DraftGraphRunner
from ninfer.fast.graph_runner import DecodeGraphRunner
from ninfer.fast.hostcopy import to_device
from ninfer.fast.mixed_graphs import MixedGraphRunner
from ninfer.fast.verify_graphs import VerifyGraphRunner
from ninfer.fast.model import FastModel
from ninfer.fast.model.layers import GDN_CHUNK
from ninfer.fast.model.addressing import piece_rows, step_slots
from ninfer.fast.prefill_graphs import PrefillGraphRunner
from ninfer.contracts import RowFailure
from ninfer.fast.sampling import DeviceSampler, SampleRow
from ninfer.fast.sampling.draft_block import DraftBlock, LazyFed
from ninfer.fast.sampling.spec import SpecSampler
from ninfer.program_core import ActiveSequence, Drawn
from ninfer.sampling import Accepted, RowContext

from .dflash_backend import FastDFlashBackend
from .images import ImageInputs, ModelHistory
from .stores import DeviceState


def _sample_rows(seqs: Sequence[ActiveSequence], masks: Sequence[Any | None], ahead: int = 0) -> list[SampleRow]:
    """One device draw per sequence at its next position (the pending token, if any, is consumed first), or
    `ahead` positions past it (a chained step's, one output more)."""
    return [SampleRow(s.params, s.seed, s.frontier + (s.pending is not None) + ahead, s.row, s.handle,
                      s.num_outputs + ahead, s if s.media is None else ModelHistory(s), m) for s, m in zip(seqs, masks)]


def _mixed_rope(piece: torch.Tensor | None, start: int, end: int, seqs: Sequence[ActiveSequence],
                device: torch.device) -> torch.Tensor | None:
    """A mixed pass's rotary positions over its B + n rows, None when every row rotates at its position: each
    decode row's position + rope_delta (MRoPE's three rows equal there) beside the piece's MRoPE rows [3, n] (a
    prompt with images)."""
    deltas = [ImageInputs.rope_delta(s) for s in seqs]
    if piece is None and not any(deltas):
        return None
    rows = to_device([s.frontier + d for s, d in zip(seqs, deltas)], device)  # [B]
    if piece is None:
        return torch.cat([rows, torch.arange(start, end, device=device, dtype=torch.int32)])
    return torch.cat([rows.expand(3, -1), piece.to(device, torch.int32)], dim=1)  # [3, B + n]


class FastExecutor:
    def __init__(self, model: FastModel, runner: DecodeGraphRunner, sampler: DeviceSampler, store: DeviceState,
                 backup_slot: Callable[[int], int], dflash: FastDFlashBackend | None = None,
                 images: ImageInputs | None = None, draft_tokens: int = 0,
                 verifier: VerifyGraphRunner | None = None, drafter: DraftGraphRunner | None = None,
                 pieces: PrefillGraphRunner | None = None, draft_vocab: int | None = None,
                 mixed: MixedGraphRunner | None = None):
        self.model, self.runner, self.sampler = model, runner, sampler
        self.draft_vocab = draft_vocab  # the MTP head's drafts from the token ids below it alone (None: all)
        self.pieces = pieces  # the short prefill pieces' graphs (None: every piece eager)
        self.mixed_graphs = mixed  # the decode rounds with a short chunk riding (None: every mixed pass eager)
        self.store, self.backup_slot = store, backup_slot
        self.device = model.device
        self.images = images or ImageInputs(None, model.device)
        self.mtp = model.mtp  # the speculative backend's head (None: plain decoding or DFlash)
        self.dflash = dflash  # the DFlash / DFlash2 backend (None: plain decoding or MTP)
        # a round's draws and acceptance on the device (None: plain decoding)
        # (the draft graphs' own when they exist: one sampler's workspaces)
        # (its grammar rows the verify graphs' `PrefixMasks`, whose masked twins fill them beside the pass)
        self.spec = drafter.spec if drafter is not None else \
            SpecSampler(sampler, draft_tokens, masks=None if verifier is None else verifier.masks) \
            if draft_tokens else None
        # the verify and replay graphs of the round (None: eager multi-query passes)
        self.verifier = verifier
        self._masked_pass = False  # the next verify pass runs the grammar rows' bracket (`fill_masks`)
        # the MTP draft's graphs (None: the head's eager chained steps over a gathered copy of its KV)
        self.drafter = drafter

    def _tokens(self, tokens: Sequence[int]) -> torch.Tensor:
        """[T] on the device. On CUDA through pinned memory, queued without waiting: a copy from pageable memory
        first waits for the stream, so a prefill would wait for a decode round launched ahead of it."""
        host = torch.tensor(tokens, dtype=torch.long)
        if self.device.type != "cuda":
            return host.to(self.device)
        return host.pin_memory().to(self.device, non_blocking=True)

    def _inputs(self, seq: ActiveSequence, start: int, end: int) -> tuple[torch.Tensor, dict]:
        """Model ids [T] of prompt indices start..end on the device and, for a prompt with images, prefill's
        `rope_positions` and `embeds` (`ImageInputs.prefill_args`)."""
        if seq.media is None:
            return self._tokens(seq.prompt[start:end]), {}
        return self.images.prefill_args(seq, start, end)

    def prefill(self, seq: ActiveSequence, start: int, end: int,
                captures: Sequence[tuple[int, int]] = ()) -> torch.Tensor:
        slot = seq.handle.slot
        if self.dflash is not None:
            return self._prefill_dflash(seq, start, end, captures)
        if self.mtp is None and seq.media is None and self._piece_graphed(end - start):
            return self._prefill_graphed(seq, start, end, captures)
        ids, image_args = self._inputs(seq, start, end)
        if self.mtp is None:
            return self.model.prefill(ids, slot, seq.row, start, captures=captures, **image_args)  # [V] fp32
        logits, hidden = self.model.prefill(ids, slot, seq.row, start, return_hidden=True, captures=captures,
                                            **image_args)
        # the MTP layer advances segment by segment up to each capture, whose slot then takes the stored hidden,
        # and in the model's prefill pieces inside a segment: the calls a prefill cut at the captures would make
        piece = self.model.plan.max_prefill_tokens
        bounds = [start, *(f for f, _ in captures), end]
        for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
            for s in range(a, b, piece):
                e = min(s + piece, b)
                self.mtp.advance([slot], [seq.row], [s], ids[s - start:e - start], [hidden[s - start:e - start]],
                                 [seq.media], piece_rows(image_args.get("embeds"), s - start, e - s))
            if i < len(captures):
                self.mtp.hidden[captures[i][1]].copy_(self.mtp.hidden[slot])
        return logits

    def _prefill_dflash(self, seq: ActiveSequence, start: int, end: int,
                        captures: Sequence[tuple[int, int]]) -> torch.Tensor:
        """Prefill in the model's own pieces, each piece's taps turned into drafter context at once (so the taps of
        every layer are held for one piece only, as the memory plan counts them); a capture on a piece boundary
        takes the live slot there, one inside a piece is the model's. The context is paged: captures copy nothing
        of it."""
        slot, piece = seq.handle.slot, max(GDN_CHUNK, self.model.plan.max_prefill_tokens // GDN_CHUNK * GDN_CHUNK)
        for at in range(start, end, piece):
            n = min(piece, end - at)
            for f, cap in captures:
                if f == at:
                    self.store.copy_slot(slot, cap)
            taps: dict[int, torch.Tensor] = {}
            ids, image_args = self._inputs(seq, at, at + n)
            logits = self.model.prefill(ids, slot, seq.row, at, taps=taps,
                                        captures=[(f, c) for f, c in captures if at < f < at + n], **image_args)
            self.dflash.advance([seq.row], [at], [n], taps, [seq.media])
        return logits  # [V] fp32 of the last token

    def _piece_graphed(self, n: int) -> bool:
        """Whether an n-token piece of a plain text prefill replays prefill graphs (a piece past the largest bucket
        runs eagerly)."""
        return self.pieces is not None and self.pieces.bucket(n) is not None

    def _prefill_graphed(self, seq: ActiveSequence, start: int, end: int,
                         captures: Sequence[tuple[int, int]]) -> torch.Tensor:
        """The piece through the prefill graphs, cut at each checkpoint inside it: the live state after a cut is
        the checkpoint's (an eager call restarts its GDN chunk grid at a checkpoint too, so the states are the
        same; KV is paged: nothing to copy). Returns the last token's logits [V] fp32 (the graph's buffer)."""
        slot = seq.handle.slot
        bounds = [start, *(f for f, _ in captures), end]
        for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
            logits = self.pieces.run(seq.prompt[a:b], slot, seq.row, a)
            if i < len(captures):
                self.store.copy_slot(slot, captures[i][1])
        return logits

    def mixed_launch(self, seqs: Sequence[ActiveSequence], masks: Sequence[Any | None], pseq: ActiveSequence,
                     start: int, end: int, captures: Sequence[tuple[int, int]] = ()
                     ) -> tuple[Callable[[], list[Drawn]], torch.Tensor]:
        """`decode` of `seqs` and `prefill` of pseq's prompt[start:end] in one pass, queued: each row backed up,
        then one token of every row and the piece through the layers, every weight read once for both; through the
        mixed graph of (bucket, B) where one holds it (a text piece without captures inside, text rows), else
        eagerly (`FastModel.mixed`); the rows' draws queued after it. Returns the call that waits for the draws and
        reads them (the round's one host sync, as `launch`'s) and the piece's last logits [V] fp32, for
        `draw_first` once the draws are read. A chunk longer than one piece runs as its own prefill, then the decode
        step."""
        if end - start > self.model.plan.max_prefill_tokens or self.mtp is not None or self.dflash is not None:
            logits = self.prefill(pseq, start, end, captures)
            return self.launch(seqs, masks), logits
        slots, rows, frontiers = [s.handle.slot for s in seqs], [s.row for s in seqs], [s.frontier for s in seqs]
        pending = [s.pending for s in seqs]
        text = pseq.media is None and not any(ImageInputs.rope_delta(s) for s in seqs)
        if text and not captures and self.mixed_graphs is not None and self.mixed_graphs.fits(end - start, len(seqs)):
            logits = self.mixed_graphs.run(pseq.prompt[start:end], pseq.handle.slot, pseq.row, start,
                                           (pending, slots, rows, frontiers))
        else:
            ids, image_args = self._inputs(pseq, start, end)
            self.model.backup_slots(to_device(slots, self.device), to_device(rows, self.device), self.backup_slot(0))
            rope = _mixed_rope(image_args.pop("rope_positions", None), start, end, seqs, self.device)
            logits = self.model.mixed(ids, pseq.handle.slot, pseq.row, start,
                                      (self._tokens(pending), slots, rows, frontiers), captures, rope, **image_args)
        self.sampler.queue(logits[:-1], _sample_rows(seqs, masks))  # [B + 1, V]: the rows', then the piece's
        return self.sampler.readback(), logits[-1]

    def draw_first(self, seq: ActiveSequence, logits: torch.Tensor, mask: Any | None) -> Drawn:
        (drawn,) = self.sampler.sample(logits[None], _sample_rows([seq], [mask]))  # position len(prompt)
        return drawn

    def decode(self, seqs: Sequence[ActiveSequence], masks: Sequence[Any | None]) -> list[Drawn]:
        return self.launch(seqs, masks)()

    def launch(self, seqs: Sequence[ActiveSequence], masks: Sequence[Any | None], bank: int = 0,
               behind: bool = False) -> Callable[[], list[Drawn]]:
        """Queue the decode graph without waiting for it; the returned call waits for this step's draws alone and
        reads them (the one host sync of a step). Async scheduling holds it across the Engine's host work.
        `bank` 1 backs each row up into its chained backup (`chained_backup`) instead of its backup slot;
        `behind`: the step after the one just queued for the same rows in the same order, unmasked, its tokens
        that step's draws on the device (a chained step: one position past each frontier, the host never reads
        those tokens before it is queued)."""
        off = int(behind)
        pos = [s.frontier + off for s in seqs]
        variant = self.sampler.prepare(_sample_rows(seqs, masks, off))  # positions frontier + off + 1
        rope = [p + ImageInputs.rope_delta(s) for p, s in zip(pos, seqs)]
        backups = [s.row if bank == 0 else self.chained_backup(s.row) - self.backup_slot(0) for s in seqs]
        tokens = self.sampler.picked[:len(seqs), 0] if behind else None
        self.runner.run_lists(([0 if behind else s.pending for s in seqs], [s.handle.slot for s in seqs],
                               [s.row for s in seqs], [p + 1 for p in pos], pos, rope, backups), variant=variant,
                              tokens=tokens)
        return self.sampler.readback()

    @property
    def chains(self) -> bool:
        """Whether a decode step can be launched behind another (`launch(..., behind=True)`): plain decoding on one
        stage, whose plan keeps a chained backup per row."""
        return self.model.plan.chain_slots > 0 and self.runner.pieces is None and self.spec is None

    def chained_backup(self, row: int) -> int:
        """The slot a chained step (bank 1) backs row `row`'s state up into."""
        return self.model.plan.chain_backup(row)

    def feed(self, seq: ActiveSequence, tokens: Sequence[int]) -> None:
        if self.mtp is None and self.dflash is None:
            rope = ImageInputs.feed_positions(seq, seq.frontier, len(tokens), self.device)
            if rope is None and self._piece_graphed(len(tokens)):
                self.pieces.run(tokens, seq.handle.slot, seq.row, seq.frontier)
                return
            self.model.prefill(self._tokens(tokens), seq.handle.slot, seq.row, seq.frontier, rope_positions=rope)
            return
        self._step([seq], [tuple(tokens)])

    def feed_rows(self, seqs: Sequence[ActiveSequence], feds: Sequence[tuple[int, ...]]) -> None:
        """`feed` of several rows in one pass (a commit's replays of cut blocks, a backend on): through the verify
        graph without backups of (B, width) where the plan captured one, else eagerly."""
        self._step(seqs, [tuple(f) for f in feds])

    def draft(self, seqs: Sequence[ActiveSequence], ctxs: Sequence[RowContext], ks: Sequence[int]) -> DraftBlock:
        """The MTP head's or the DFlash drafter's drafts drawn on the device (a `DraftBlock`: the host sees them
        only through the round's readback)."""
        if self.dflash is not None:
            return self.dflash.draft(seqs, ctxs, ks, self.spec)
        block = DraftBlock.empty(ks, self.spec.k, self.model.cfg.vocab_size, self.device,
                                 [c.params.is_greedy for c in ctxs])
        rows = self.spec.draft_rows(seqs, ctxs, self.spec.k)
        args = ([s.handle.slot for s in seqs], [s.row for s in seqs], [s.frontier for s in seqs],
                [s.pending for s in seqs], ks)
        if self.drafter is None:
            self.mtp.draft(*args, lambda j, live, logits: self.spec.draw(rows, block, j, live, logits),
                           [s.media for s in seqs], self.draft_vocab)
        else:
            self.drafter.draft(*args, rows, block, [s.media for s in seqs])
        return block

    def verify(self, seqs: Sequence[ActiveSequence], feds: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Back each row up, then consume every row's [pending, d1..dk'] at its frontier in one target pass, the
        state after each block position kept in the row's step slots (when the plan has them); fp32 logits
        [k' + 1, V] per row, on the device. Fed blocks of a `DraftBlock` are read there."""
        if not self._verify_graphed([len(f) for f in feds]):
            for s in seqs:
                self.store.copy_slot(s.handle.slot, self.backup_slot(s.row))
        masked, self._masked_pass = self._masked_pass, False
        logits = self._step(seqs, feds, backup=True, masked=masked)  # [N, V]
        return list(torch.split(logits, [len(f) for f in feds]))

    def _verify_graphed(self, lens: Sequence[int], backup: bool = True) -> bool:
        """Whether these blocks run through the verify graphs' static buffers (`verify_graphs.py`)."""
        return self.verifier is not None and self.verifier.fits(lens, backup)

    def fill_masks(self, drafts, grammar: Sequence[Any]):
        """The round's grammar rows queued before its verify pass (`SpecSampler.queue_masks`): a `DraftMasks` row
        over drafts on the device is filled by the prefix masks' host function in stream order, inside the verify
        graph (its masked twin) where the blocks fit one, else queued on a side stream now."""
        lens, tokens = (drafts.lens, drafts.tokens) if isinstance(drafts, DraftBlock) else \
            ([len(d) for d, _ in drafts], None)
        in_pass = self._verify_graphed([n + 1 for n in lens])
        queued = self.spec.queue_masks(lens, tokens, grammar, in_pass)
        self._masked_pass = queued is not None and in_pass
        return queued

    def accept(self, seqs: Sequence[ActiveSequence], ctxs: Sequence[RowContext], drafts, targets: Sequence[Any],
               grammar) -> Callable[[], list[Accepted | RowFailure]]:
        """Every row's acceptance queued on the device (`SpecSampler.accept_later`, with what `fill_masks` queued)
        with one host copy for the batch; the returned call waits for it and reads the results."""
        block = drafts if isinstance(drafts, DraftBlock) else \
            DraftBlock.from_host(drafts, [c.params.is_greedy for c in ctxs], self.spec.k, self.model.cfg.vocab_size,
                                 self.device)
        return self.spec.accept_later(seqs, ctxs, block, targets, grammar)

    def select(self, seq: ActiveSequence, keep: int) -> bool:
        """The state after fed[:keep] of the block this row's last `verify` consumed (0 < keep < its length) into
        its slot: step slot keep - 1's GDN state and stored hidden, on every stage (`DeviceState.copy_slot`). KV and
        the MTP pairs past the new frontier stay where the pass wrote them, never read before they are rewritten.
        False when the plan keeps no step states (a DFlash backend whose states would pass their share of the
        budget, `verify_steps`): the core then replays the kept tokens."""
        plan = self.model.plan
        if not plan.step_slots:
            return False
        self.store.copy_slot(plan.step_slot(seq.row, keep - 1), seq.handle.slot)
        return True

    def _step(self, seqs: Sequence[ActiveSequence], feds: Sequence[tuple[int, ...]], backup: bool = False,
              masked: bool = False) -> torch.Tensor:
        """Consume feds[i] at seqs[i]'s frontier with the decode recurrence, the backend's state following; logits
        [N, V] fp32. Through the verify graph of (B, backup, masked) where the blocks fit it (that graph backs the
        rows up first; `masked`: and fills the grammar rows `fill_masks` staged), else the eager multi-query pass. A
        verify (`backup`) keeps every block position's state in the rows' step slots where the plan has them;
        forced tokens step in place."""
        slots, rows, starts = [s.handle.slot for s in seqs], [s.row for s in seqs], [s.frontier for s in seqs]
        lens = [len(f) for f in feds]
        keep = backup and self.model.plan.step_slots > 0
        deltas = [ImageInputs.rope_delta(s) for s in seqs]
        taps: dict[int, torch.Tensor] | None = None if self.dflash is None else {}
        if feds and isinstance(feds[0], LazyFed):
            tokens = feds[0].block.fed_tokens([s.pending for s in seqs])
        else:
            tokens = self._tokens([t for f in feds for t in f])
        if self._verify_graphed(lens, backup):  # the graph advances the MTP head or the drafter context too
            return self.verifier.run(tokens, slots, rows, starts, lens, deltas, backup, keep_steps=keep,
                                     masked=masked)
        logits, hidden = self.model.verify(tokens, slots, rows, starts, lens, taps=taps, rope_deltas=deltas,
                                           keep_steps=keep)
        media = [s.media for s in seqs]
        if self.mtp is not None:
            self.mtp.advance(slots, rows, starts, tokens, list(torch.split(hidden, lens)), media)
            if keep:
                self._store_step_hidden(slots, rows, lens, hidden)
        if self.dflash is not None:
            self.dflash.advance(rows, starts, lens, taps, media)
        return logits

    def _store_step_hidden(self, slots: Sequence[int], rows: Sequence[int], lens: Sequence[int],
                           hidden: torch.Tensor) -> None:
        """Each block position but the last stores its final-normed hidden (of hidden [N, H], blocks packed) beside
        its step slot's GDN state (the slot `step_slots` gave that position's GDN step): the eager twin of the
        verify graphs' ``h_dst``."""
        _, writes = step_slots(self.model.plan, slots, rows, lens, True)
        dst = [w for out in writes for w in out[:-1]]  # the last position's state went to the row's slot
        src = [first + j for first, n in zip(itertools.accumulate(lens, initial=0), lens) for j in range(n - 1)]
        if dst:
            self.mtp.store(to_device(dst, self.device), hidden.index_select(0, to_device(src, self.device, torch.long)))

    def record(self, committed: Sequence[tuple[int, Hashable, Sequence[int]]]) -> None:
        self.sampler.record(committed)
