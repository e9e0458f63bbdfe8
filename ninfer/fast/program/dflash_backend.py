"""The DFlash / DFlash2 backend of the fast Program (docs/speculative.md, "DFlash and DFlash2 (fast)"): the
drafter's context K/V in the plan's drafter page pools, advanced with every consumption, and one batched block pass
per round.

The context of position p lives at page position p of the sequence's own block table in ``pools.dk``/``pools.dv``
(the drafter's geometry), so it is a function of the consumed tokens exactly like the target's KV: every read is
bounded by the frontier (positions at and past it are rewritten before they are read), prefix sharing and
``copy_page`` carry it, and host replicas of pages include it (`DeviceState`). Nothing of it is in the GDN slot, so
backups, rollbacks and aborts need nothing extra. A draft block's own K/V go to the row's scratch pages
(``Pools.scratch_page``): the frontier's partial page is copied in first, so drafting writes no page of any
sequence. A draft window W is a first-key bound (keys max(0, F - W)..), the reference's "last W positions". Over a
prompt with images the context rotates at MRoPE's temporal row and a block at its positions + rope_delta, the
page positions staying the sequence indices (docs/speculative.md, "Images").

Extension: `advance` (prefill pieces, the eager verify) builds the positions and page slots on the host and queues
them without a wait; the verify graphs call `extend` with their static buffers' (`verify_graphs.py`).

Drafting: one block pass for all rows of the round and its draws, a CUDA graph per row count and draw variant
(`dflash_graphs.DFlashDraftGraphs`; the same buffers eagerly without CUDA or with --enforce-eager). DFlash draws
slot j's draft from its own logits, DFlash2 walks the candidate selector (`dflash_select`, all rows per slot) from
the pending token, each slot's drawn tokens staying on the device as the next slot's predecessors (in a lean greedy
round the whole walk is one launch, `dflash_walk`). Both draw on the device (`SpecSampler.draw_static`, the host
``draw_draft`` row by row: greedy rows the argmax, sampled rows the race with q kept) into a `DraftBlock`, so the
round's only host read is its readback after acceptance. Every row draws all k slots; a row's drafts past its own
room are not counted (``StaticDraws.room``), as the MTP head's chain does.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ninfer.contracts.media import PromptMedia
from ninfer.fast.hostcopy import to_device
from ninfer.fast.pools import Pools
from ninfer.fast.model.dflash import FastDrafter
from ninfer.fast.sampling.draft_block import DraftBlock
from ninfer.fast.sampling.spec import SpecSampler
from ninfer.fast.sampling.static_draws import StaticDraws
from ninfer.models.qwen3_5.drafter import DrafterKind
from ninfer.program_core import ActiveSequence
from ninfer.sampling import RowContext


class FastDFlashBackend:
    def __init__(self, drafter: FastDrafter, pools: Pools, block_size: int, window: int | None,
                 draft_vocab: int | None = None):
        """block_size: the pass's length (num_speculative_tokens + 1); window: context positions a block sees
        (None: all); draft_vocab: drafts from the token ids below it alone (None: all)."""
        if pools.dk is None:
            raise ValueError("the memory plan has no drafter page pools (plan_memory(..., drafter=cfg))")
        self.drafter, self.pools, self.block_size, self.window = drafter, pools, block_size, window
        self.draft_vocab = draft_vocab
        self.layers = drafter.cfg.target_layer_ids
        self.page_size = pools.plan.page_size
        self.k_pages, self.v_pages = list(pools.dk), list(pools.dv)  # per drafter layer [P', ps, nkv', d']
        # the draft's static buffers and graphs (`dflash_graphs.DFlashDraftGraphs`), made with the Program's sampler
        self.graphs = None

    def advance(self, rows: Sequence[int], starts: Sequence[int], lens: Sequence[int],
                taps: dict[int, torch.Tensor], media: Sequence[PromptMedia | None] | None = None) -> None:
        """Rows consumed lens[i] tokens at starts[i].. (packed along the taps' rows, [sum(lens), H] each): their
        context K/V into the rows' pages, rotated at `PromptMedia.drafter_positions` for a row of `media` with
        images (else the positions)."""
        dev, ps = self.pools.k.device, self.page_size
        pos = to_device([s + j for s, n in zip(starts, lens) for j in range(n)], dev, torch.long)  # [N]
        row = to_device([r for r, n in zip(rows, lens) for _ in range(n)], dev, torch.long)
        slots = self.pools.block_tables[row, pos // ps].long() * ps + pos % ps
        rope = pos.to(torch.int32)
        if media and any(m is not None for m in media):
            rope = to_device(np.concatenate([np.arange(s, s + n) if m is None else m.drafter_positions(s, s + n)
                                             for m, s, n in zip(media, starts, lens)]).tolist(), dev)
        self.extend(taps, rope, slots)

    def extend(self, taps: dict[int, torch.Tensor], rope: torch.Tensor, slots: torch.Tensor) -> None:
        """The context of N packed consumed tokens from the target's taps ([N, H] by layer): every drafter layer's
        K/V rotated at rope [N] int32 into the flat page slots [N] long (page * page_size + offset). Reads no
        host data: the body of a verify graph calls it."""
        feats = torch.cat([taps[i] for i in self.layers], dim=-1)  # [N, n_taps * H]
        self.drafter.extend(feats, rope, slots, self.k_pages, self.v_pages)

    def warm(self, tokens: int) -> None:
        """Run every drafter kernel once before serving (Triton compiles on first use): an extension of `tokens`
        zero taps into the dummy page and one block pass per block-table row over its scratch pages only. No
        sequence exists yet, so nothing any request reads is written."""
        plan, dev = self.pools.plan, self.pools.k.device
        width = len(self.layers) * self.drafter.cfg.hidden_size
        slots = plan.dummy_page * self.page_size + torch.arange(tokens, device=dev) % self.page_size
        self.drafter.extend(torch.zeros(tokens, width, device=dev, dtype=self.pools.dk.dtype),
                            torch.arange(tokens, device=dev, dtype=torch.int32), slots, self.k_pages, self.v_pages)
        rows = range(plan.max_seqs)
        tables = to_device([[self.pools.scratch_page(r, j) for j in range(plan.scratch_pages)] for r in rows], dev)
        logits, hidden = self.drafter.block([0] * len(rows), [0] * len(rows), tables, self.block_size, self.k_pages,
                                            self.v_pages, None if self.window is None else [0] * len(rows),
                                            draft_vocab=self.draft_vocab)
        if self.drafter.cfg.kind is DrafterKind.DFLASH2:
            self.selector(logits, hidden)(0, torch.zeros(len(rows), dtype=torch.long, device=dev))

    def tables(self, seqs: Sequence[ActiveSequence]) -> tuple[list[list[int]], list[int]]:
        """Each row's pages for positions < F + B: its context pages, then its scratch pages (what the block pass
        reads of the draft graphs' table row; the entries after them are never read, so they are not written);
        and per row the page whose partial prefix the block pass needs in its first scratch page (the page at the
        frontier, so the block's K/V land beside that page's context keys; the scratch page itself where the
        frontier starts a page), copied there by `copy_partial` inside the draft graph."""
        ps, out, partial = self.page_size, [], []
        for s in seqs:
            full, offset = divmod(s.frontier, ps)
            scratch = [self.pools.scratch_page(s.row, j) for j in range(self.pools.plan.scratch_pages)]
            partial.append(s.table[full] if offset else scratch[0])
            out.append(list(s.table[:full]) + scratch)
        return out, partial

    def copy_partial(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Drafter pages src [R] into dst [R] (int32, each row's first scratch page) in both K/V pools, every layer
        (graph-safe: device indices; a row whose src is its dst copies its page onto itself)."""
        src, dst = src.long(), dst.long()
        for pool in (self.pools.dk, self.pools.dv):  # [n_draft, pages, ps, nkv', d']
            pool.index_copy_(1, dst, pool.index_select(1, src))

    def draft(self, seqs: Sequence[ActiveSequence], ctxs: Sequence[RowContext], ks: Sequence[int],
              spec: SpecSampler) -> DraftBlock:
        """Up to ks[i] drafts for row i from one block pass over the rows with room, drawn on the device into a
        `DraftBlock` (`spec`: the round's draws) through the draft graphs' buffers (`DFlashDraftGraphs`, replayed
        on CUDA); nothing but the scratch pages is written."""
        block = DraftBlock.empty(ks, spec.k, spec.vocab, self.pools.k.device, [c.params.is_greedy for c in ctxs])
        live = [i for i, k in enumerate(ks) if k]
        if live:
            self.graphs.draft([seqs[i] for i in live], ks, spec.draft_rows(seqs, ctxs, spec.k), block, live)
        return block

    def candidates(self, logits: torch.Tensor, hidden: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """DFlash2's selector inputs over the block (logits [R, B-1, V], hidden [R, B-1, H]): each slot's top-K
        scores and ids (unary, cand [R, B-1, K]) and the hidden's projection (proj [R, B-1, r]). With a draft
        vocabulary the top-K reads its ids alone: every other id is -inf there, so it is the same choice."""
        V = logits.shape[-1] if self.draft_vocab is None else self.draft_vocab
        unary, cand = torch.topk(logits[..., :V], min(self.drafter.cfg.selector_top_k, V), dim=-1)
        return unary, cand, torch.nn.functional.linear(hidden, self.drafter.w.selector[0])

    def walk(self, logits: torch.Tensor, hidden: torch.Tensor, anchors: torch.Tensor, draws: StaticDraws,
             R: int) -> None:
        """DFlash2's greedy walk over the block in one launch (`dflash_walk`): rows 0..R-1's drafts and drawable
        counts into `draws`, what k lean greedy `draw_static` calls over `selector`'s slots leave there."""
        unary, cand, proj = self.candidates(logits, hidden)
        _, pred, succ = self.drafter.w.selector
        self.drafter.k.dflash_walk(unary, cand, proj, anchors, pred, succ, draws.room[:R], draws.drafts[:R],
                                   draws.num[:R])
        draws.j += unary.shape[1]

    def selector(self, logits: torch.Tensor, hidden: torch.Tensor):
        """DFlash2's selector over the block: select(j, previous [R] long) gives slot j's scores [R, V] on the
        device after each row's previous token (-inf outside the slot's top-K candidates)."""
        unary, cand, proj = self.candidates(logits, hidden)
        _, pred, succ = self.drafter.w.selector

        def select(j: int, previous: torch.Tensor) -> torch.Tensor:
            scores = self.drafter.k.dflash_select(unary[:, j].contiguous(), cand[:, j].contiguous(),
                                                  proj[:, j].contiguous(), previous, pred, succ)  # [R, K] fp32
            z = torch.full((logits.shape[0], logits.shape[-1]), float("-inf"), device=logits.device)
            return z.scatter_(1, cand[:, j], scores)
        return select
