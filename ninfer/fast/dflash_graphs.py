"""CUDA graphs of the DFlash / DFlash2 draft: per exact number of drafting rows R and draw variant, one graph of the
drafter's block pass over [anchor, MASK x (B-1)] (`FastDrafter.block_on`) and the k = B-1 draws of its slots
(`SpecSampler.draw_static`; DFlash2 walks its candidate selector from each row's pending token, each slot's drawn
tokens staying on the device as the next slot's predecessors), replayed once a round.

Run eagerly, the pass and its draws took 13.6-18.3 ms of a 35 ms round at B=1 on the 9B shape (H100,
docs/performance.md), where the verify pass of the same round took 51 ms eagerly and 14.5 ms as a graph.

Without penalties in the round (most requests) a DFlash block's k draws are independent (no draft's penalties see
the ones before it) and run as one pass over R * k rows (`SpecSampler.draw_block_static`), a graph of its own;
with penalties they run slot by slot. DFlash2's selector walk runs slot by slot too (each slot's candidates are
scored after the token drawn before it), except in a lean greedy round, where every draw is the argmax of the raw
scores and the walk is one launch (`dflash_walk`).

Stability note: graphs are keyed by (R, variant, block draw) alone. The per-round quantities (each row's anchor,
frontier, rope delta, first key, room) are one int32 tensor of input data, the draws' parameter rows another
(``StaticDraws``), and each row's page table one [max_batch, max_pages_per_seq + scratch_pages] int32 tensor: the
row's context pages, then its scratch pages, padded with its last scratch page (entries past frontier + B are never
read). The frontier's partial page is copied into the row's first scratch page before the replay
(`FastDFlashBackend.tables`), so nothing of any sequence is written. Without CUDA (or with ``use_graphs=False``) the
same buffers run eagerly.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import torch

from ninfer.fast.capture import no_collection_during_capture, warm_and_capture
from ninfer.fast.hostcopy import HostMirror
from ninfer.fast.sampling.rows import GREEDY
from ninfer.fast.sampling.draft_block import DraftBlock
from ninfer.fast.sampling.draw_variants import DRAW_VARIANTS, LEAN, base_variant, draw_steps, draw_variant
from ninfer.fast.sampling.row_params import RowParams
from ninfer.fast.sampling.spec import SpecSampler
from ninfer.fast.sampling.static_draws import StaticDraws
from ninfer.models.qwen3_5.drafter import DrafterKind

_ROWS = ("anchors", "frontiers", "deltas", "first_keys", "room", "partial_src", "partial_dst")


class DFlashDraftGraphs:
    def __init__(self, backend, max_batch: int, spec: SpecSampler, use_graphs: bool | None = None):
        """backend: the `FastDFlashBackend` whose drafter, pools and block size the graphs run."""
        plan, dev = backend.pools.plan, backend.pools.k.device
        if not 1 <= max_batch <= plan.max_seqs or spec.k != backend.block_size - 1:
            raise ValueError(f"DFlash draft graphs take 1..{plan.max_seqs} rows of {backend.block_size - 1} "
                             f"drafts, got {max_batch} rows of {spec.k}")
        self.backend, self.max_batch, self.spec = backend, max_batch, spec
        self.draws = StaticDraws(max_batch, spec.k, backend.drafter.cfg.vocab_size, dev)
        on_cuda = dev.type == "cuda" and torch.cuda.is_available()
        self.use_graphs = on_cuda if use_graphs is None else (use_graphs and on_cuda)
        # a frontier below max_context plus a block: at most max_pages_per_seq + scratch_pages pages a table row
        width, rows = plan.max_pages_per_seq + plan.scratch_pages, len(_ROWS) * max_batch
        self.mirror = HostMirror(rows + max_batch * width, dev)  # the rows' fields, then their tables: one copy
        self.packed = self.mirror.device[:rows].view(len(_ROWS), max_batch)  # [7, max_batch]
        self.table = self.mirror.device[rows:].view(max_batch, width)
        (self.anchors, self.frontiers, self.deltas, self.first_keys, self.draws.room, self.partial_src,
         self.partial_dst) = self.packed.unbind(0)
        self.graphs: dict[tuple[int, str, bool], torch.cuda.CUDAGraph] = {}
        self._pool = None

    def block_draws(self, variant: str) -> tuple[bool, ...]:
        """The draw forms this drafter captures per (R, variant): slot by slot, and for DFlash the one-pass block
        draw of rounds without penalties (a lean variant's only form: it has no penalties)."""
        if self.backend.drafter.cfg.kind is not DrafterKind.DFLASH:
            return (False,)
        return (True,) if variant != base_variant(variant) else (False, True)

    def body(self, R: int, variant: str, block_draw: bool = False) -> None:
        """The graph body: the block pass of rows 0..R-1 and every slot's draw into ``draws`` (``block_draw``: all
        slots in one pass, a round without penalties)."""
        bk = self.backend
        bk.copy_partial(self.partial_src[:R], self.partial_dst[:R])
        first = None if bk.window is None else self.first_keys[:R]
        logits, hidden = bk.drafter.block_on(self.anchors[:R], self.frontiers[:R], self.deltas[:R], first,
                                             self.table[:R], bk.block_size, bk.k_pages, bk.v_pages,
                                             bk.draft_vocab)  # [R, B-1, .]
        self.draws.reset(R)
        steps = draw_steps(variant)
        if block_draw:
            self.spec.draw_block_static(self.draws, R, dataclasses.replace(steps, penalties=False), logits)
            return
        if bk.drafter.cfg.kind is DrafterKind.DFLASH:
            for j in range(self.spec.k):
                self.spec.draw_static(self.draws, R, steps, logits[:, j].contiguous())
            return
        if not steps.reads_params:  # a lean greedy round: argmax draws of the raw scores, the walk in one launch
            bk.walk(logits, hidden, self.anchors[:R], self.draws, R)
            return
        select = bk.selector(logits, hidden)
        previous = self.anchors[:R].long()  # [R]: each row's walk starts at its pending token
        for j in range(self.spec.k):
            previous = self.spec.draw_static(self.draws, R, steps, select(j, previous))

    def capture(self, warmup: int = 2) -> None:
        """One graph per R (largest first, one shared pool) and draw variant, on the rows' own scratch pages and
        the sampler tables' dummy row."""
        if not self.use_graphs:
            return
        stream = torch.cuda.Stream(device=self.packed.device)
        with no_collection_during_capture():
            for R in range(self.max_batch, 0, -1):
                self.fill_dummy(R)
                for variant in DRAW_VARIANTS:
                    self.draws.fill_dummy(R, base_variant(variant), self.spec.tables.dummy_row)
                    for block in self.block_draws(variant):
                        self._capture((R, variant, block), lambda: self.body(R, variant, block), stream, warmup)
        torch.cuda.synchronize(self.packed.device)

    def fill_dummy(self, R: int) -> None:
        """Capture inputs: R blocks at position 0, row r over its own scratch pages (the drafter pools hold none for
        the dummy row; capture runs before any sequence exists, so nothing any request reads is written)."""
        width, n = self.table.shape[1], self.backend.pools.plan.scratch_pages
        tables = [[self.backend.pools.scratch_page(r, j % n) for j in range(width)] for r in range(R)]
        scratch = [self.backend.pools.scratch_page(r, 0) for r in range(R)]  # copied onto themselves
        self._send([[0] * R, [0] * R, [0] * R, [0] * R, [self.spec.k] * R, scratch, scratch], tables)

    def _send(self, fields: list[list[int]], tables: list[list[int]]) -> None:
        """R rows' fields (in `_ROWS` order) and block tables into the inputs, in one copy (up to row R's table:
        a long context's tables are most of the buffer). A table row shorter than the buffer's fills its start:
        what the block pass reads (its context and scratch pages), so the host's work follows the context read,
        not the longest context the plan allows."""
        host, R = self.mirror.open(), len(tables)
        rows, width = len(_ROWS) * self.max_batch, self.table.shape[1]
        host[:rows].reshape(len(_ROWS), self.max_batch)[:, :R] = fields
        table = host[rows:].reshape(self.max_batch, width)
        for r, pages in enumerate(tables):
            table[r, :len(pages)] = pages
        self.mirror.send(rows + R * width)

    def dummy_draft(self, R: int, drafts: int) -> Callable[[], object]:
        """A greedy draft over R rows on their scratch pages, for timing (`fill_dummy`): its graph's replay, or the
        body. The block pass costs the same for any number of drafts up to the block."""
        self.fill_dummy(R)
        self.draws.fill_dummy(R, GREEDY, self.spec.tables.dummy_row)
        variant = GREEDY + LEAN  # a greedy round without bias, min_tokens or penalties: the common one
        one_pass = True in self.block_draws(variant)
        graph = self.graphs.get((R, variant, one_pass))
        return graph.replay if graph is not None else lambda: self.body(R, variant, one_pass)

    def _capture(self, key, body, stream: torch.cuda.Stream, warmup: int) -> None:
        """Warm `body` on a side stream, then capture it as graph `key`."""
        graph, _ = warm_and_capture(body, stream, self._pool, warmup)
        if self._pool is None:
            self._pool = graph.pool()
        self.graphs[key] = graph

    def draft(self, rows: Sequence, ks: Sequence[int], params: RowParams, block: DraftBlock, live: list[int]
              ) -> None:
        """The drafts of the drafting rows (`live`: their indices in the round, `rows` their sequences, ks[i] the
        drafts row i may take) through the graph of their count and variant, into `block`."""
        bk, R = self.backend, len(live)
        tables, partial = bk.tables(rows)
        first = [0 if bk.window is None else max(0, s.frontier - bk.window) for s in rows]
        deltas = [0 if s.media is None else s.media.rope_delta for s in rows]
        scratch = [bk.pools.scratch_page(s.row, 0) for s in rows]
        self._send([[s.pending for s in rows], [s.frontier for s in rows], deltas, first, [ks[i] for i in live],
                    partial, scratch], tables)
        variant = draw_variant(params.steps)
        at = self.draws.load(params, draw_steps(variant), live, len(block))
        one_pass = not params.penalized and True in self.block_draws(variant)
        graph = self.graphs.get((R, variant, one_pass))
        if graph is not None:
            graph.replay()
        else:
            self.body(R, variant, one_pass)
        self.draws.store(block, at, R)

    def reset(self) -> None:
        """Drop the graphs and their pool (before the model's tensors are freed)."""
        self.graphs.clear()
        self._pool = None
