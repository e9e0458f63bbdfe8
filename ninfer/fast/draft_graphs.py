"""CUDA graphs of the MTP head's draft: per exact number of drafting rows B, a ``start`` graph (each row's private
table, its frontier's partial page copied into its scratch, the chain seeded with the stored hidden and the pending
token, the draws reset) and one ``step`` graph per draw variant (one chained MTP step of every row: its pair's K/V
into the scratch, attention over the row's pages, the draft logits and their draw, ``SpecSampler.draw_static``; the
chain's hidden, position and drawn token advanced in place), replayed once per draft position. Each sampling
variant has a lean form for rounds without a logit bias, min_tokens or a penalty (``spec.LEAN``: steps 1-4 off).

Stability note: graphs are keyed by (kind, B, variant) alone; the per-round quantities (each row's slot, block-table
row, frontier, pending token, rope delta and room) are one int32 tensor of input data and the draws' parameter rows
another (``StaticDraws``), copied in once a round; page ids are read on the device from ``pools.block_tables``. The chain never writes a sequence's pages: chained pair F - 1 + j goes to page
position F + j, which the core takes only at verify, so a row's private table points its frontier's page and the
ones after at the row's scratch pages in the k/v pools (``Pools.scratch_page``; the dummy row has its own, which
warm-up and capture use), the partial page copied there first. The attention is one decode-attention row per draft
over the private table, keys 1..F + j (page position 0 holds no pair: ``first_keys``), rotated at F - 1 + j as the
eager ``MtpHead.draft`` rotates (+ rope_delta after a prompt with images: the pair's MRoPE position in all three
rows, docs/speculative.md "Images"). Without CUDA (or with ``use_graphs=False``) the same buffers run eagerly.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from ninfer.contracts.media import PromptMedia
from ninfer.fast.capture import no_collection_during_capture, warm_and_capture
from ninfer.fast.hostcopy import HostMirror
from ninfer.fast.model import FastModel
from ninfer.fast.model.layers import StepInputs
from ninfer.fast.sampling.rows import GREEDY
from ninfer.fast.sampling.draft_block import DraftBlock
from ninfer.fast.sampling.draw_variants import DRAW_VARIANTS, LEAN, base_variant, draw_steps, draw_variant
from ninfer.fast.sampling.row_params import RowParams
from ninfer.fast.sampling.spec import SpecSampler
from ninfer.fast.sampling.static_draws import StaticDraws

_ROWS = ("slot_ids", "table_rows", "frontiers", "pending", "rope_deltas", "room")


class DraftGraphRunner:
    def __init__(self, model: FastModel, max_batch: int, spec: SpecSampler, use_graphs: bool | None = None,
                 draft_vocab: int | None = None):
        """`draft_vocab`: drafts from the token ids below it alone (None: the whole vocabulary)."""
        plan, dev = model.plan, model.device
        if model.mtp is None or not plan.scratch_pages or not 1 <= max_batch <= plan.max_seqs:
            raise ValueError(f"draft graphs need the MTP head, scratch pages and 1..{plan.max_seqs} rows; the plan "
                             f"has mtp={plan.mtp}, {plan.scratch_pages} scratch pages")
        self.model, self.max_batch, self.spec, self.draft_vocab = model, max_batch, spec, draft_vocab
        self.draws = StaticDraws(max_batch, spec.k, model.cfg.vocab_size, dev)
        on_cuda = dev.type == "cuda" and torch.cuda.is_available()
        self.use_graphs = on_cuda if use_graphs is None else (use_graphs and on_cuda)
        self.mirror = HostMirror(len(_ROWS) * max_batch, dev)
        self.packed = self.mirror.device.view(len(_ROWS), max_batch)  # [6, max_batch]
        self.slot_ids, self.table_rows, self.frontiers, self.pending, self.rope_deltas, self.draws.room = \
            self.packed.unbind(0)
        self.table = torch.zeros(max_batch, plan.max_pages_per_seq, dtype=torch.int32, device=dev)  # private
        self.positions = torch.zeros(max_batch, dtype=torch.int32, device=dev)  # the chain's next page position
        self.hidden = torch.zeros(max_batch, model.cfg.hidden_size, dtype=plan.dtype, device=dev)  # [B, H]
        self.tokens = torch.zeros(max_batch, dtype=torch.long, device=dev)  # the next step's input tokens
        self._first = torch.ones(max_batch, dtype=torch.int32, device=dev)  # every row's first key
        self._rows = torch.arange(max_batch, dtype=torch.int32, device=dev)  # row b reads private table row b
        self.graphs: dict[tuple[str, int, str | None], torch.cuda.CUDAGraph] = {}
        self._pool = None

    def start(self, B: int) -> None:
        """The ``start`` graph's body: private tables, partial pages into the scratch, the chain seeded."""
        plan, pools, mtp = self.model.plan, self.model.pools, self.model.mtp
        # one launch (the op table's `draft_start`): tables, the partial pages into the scratch, the chain seeded
        self.model.kernels.draft_start(pools.block_tables, self.table_rows[:B], self.frontiers[:B], self.pending[:B],
                                       self.slot_ids[:B], mtp.hidden, pools.k[mtp.pool], pools.v[mtp.pool],
                                       self.table, self.hidden, self.tokens, self.positions, plan.num_pages,
                                       plan.scratch_pages)
        self.draws.reset(B)

    def step(self, B: int, variant: str) -> None:
        """The ``step`` graph's body: chained pair positions - 1 of every row, its draft drawn with the variant's
        steps (`SpecSampler.draw_static`) into ``draws`` and ``tokens`` (the next step's input)."""
        pools, mtp, plan = self.model.pools, self.model.mtp, self.model.plan
        pos, ps = self.positions[:B], plan.page_size
        # a row past its own room chains on (its drafts unread) and may run past its table's last page: its pairs
        # there stay at the table's last position, inside its scratch
        at = pos.clamp(max=plan.max_pages_per_seq * ps - 1)
        # the KV slot of each row's pair in one launch (a copy of the private table comes with it), not seven
        table, slots = self.model.kernels.decode_slots(self.table, self._rows[:B], at, ps)
        step = StepInputs(positions=at, slot_mapping=slots, slot_ids=self.slot_ids[:B],
                          block_table=table, context_lens=at + 1, first_keys=self._first[:B],
                          rope_positions=pos - 1 + self.rope_deltas[:B])
        h = mtp.forward(self.hidden[:B], F.embedding(self.tokens[:B], self.model.weights.embed), step,
                        pools.k[mtp.pool], pools.v[mtp.pool])
        self.hidden[:B].copy_(h)
        logits = self.model.logits(h, self.draft_vocab)  # [B, V] fp32
        self.tokens[:B].copy_(self.spec.draw_static(self.draws, B, draw_steps(variant), logits))
        self.positions[:B] += 1

    def capture(self, warmup: int = 2) -> None:
        """The start graph and one step graph per draw variant for every B, largest first, one shared pool, on the
        dummy slot and rows (the sampler tables' dummy row)."""
        if not self.use_graphs:
            return
        plan, stream = self.model.plan, torch.cuda.Stream(device=self.model.device)
        with no_collection_during_capture():
            for B in range(self.max_batch, 0, -1):
                self.fill([plan.dummy_slot] * B, [plan.dummy_row] * B, [1] * B, [0] * B, [0] * B, [self.spec.k] * B)
                self._capture(("start", B, None), lambda: self.start(B), stream, warmup)
                for variant in DRAW_VARIANTS:
                    self.draws.fill_dummy(B, base_variant(variant), self.spec.tables.dummy_row)
                    # each step from a fresh start: the draft index stays inside 0..k-1
                    self._capture(("step", B, variant), lambda: self.step(B, variant), stream, warmup,
                                  before=lambda: self.start(B))
        torch.cuda.synchronize(self.model.device)

    def _capture(self, key, body, stream: torch.cuda.Stream, warmup: int, before=None) -> None:
        """Warm `body` (each run after `before`) on a side stream, then capture it as graph `key`."""
        graph, _ = warm_and_capture(body, stream, self._pool, warmup, before)
        if self._pool is None:
            self._pool = graph.pool()
        self.graphs[key] = graph

    def dummy_draft(self, B: int, drafts: int) -> Callable[[], object]:
        """A greedy draft of `drafts` chained steps over B rows on the dummy slot and row, for timing (nothing of
        any sequence is read or written): the start and step graphs' replays, or their bodies."""
        plan = self.model.plan
        self.fill([plan.dummy_slot] * B, [plan.dummy_row] * B, [1] * B, [0] * B, [0] * B, [drafts] * B)
        self.draws.fill_dummy(B, GREEDY, self.spec.tables.dummy_row)

        def run() -> None:
            self.run("start", B)
            for _ in range(drafts):
                self.run("step", B, GREEDY + LEAN)
        return run

    def fill(self, slots: Sequence[int], rows: Sequence[int], frontiers: Sequence[int],
             pending: Sequence[int], rope_deltas: Sequence[int], room: Sequence[int]) -> int:
        """The rows' (slot, block-table row, frontier, pending token, rope delta, drafts it may take) into the
        inputs, one copy; returns B."""
        B = len(slots)
        self.mirror.open().reshape(len(_ROWS), self.max_batch)[:, :B] = (slots, rows, frontiers, pending,
                                                                          rope_deltas, room)
        self.mirror.send()
        return B

    def run(self, kind: str, B: int, variant: str | None = None) -> None:
        """Replay graph (kind, B, variant), or run its body eagerly when there is none."""
        graph = self.graphs.get((kind, B, variant))
        if graph is not None:
            graph.replay()
        elif kind == "start":
            self.start(B)
        else:
            self.step(B, variant)

    def draft(self, slots: Sequence[int], rows: Sequence[int], frontiers: Sequence[int], pending: Sequence[int],
              ks: Sequence[int], params: RowParams, block: DraftBlock,
              media: Sequence[PromptMedia | None] | None = None) -> None:
        """``MtpHead.draft`` with ``SpecSampler.draw`` through the graphs: max(ks) chained steps, each drawn on the
        device, for the rows with ks[i] > 0, from the round's parameter rows (``SpecSampler.draft_rows``); the
        drafts go into `block`. Nothing of any sequence changes. A row of `media` with images rotates at its
        positions + rope_delta."""
        live = [i for i, k in enumerate(ks) if k]
        if not live:
            return
        deltas = [0 if m is None else m.rope_delta for m in (media or [None] * len(ks))]
        B = self.fill(*([seq[i] for i in live] for seq in (slots, rows, frontiers, pending, deltas, ks)))
        variant = draw_variant(params.steps)
        at = self.draws.load(params, draw_steps(variant), live, len(block))
        self.run("start", B)
        for _ in range(max(ks)):
            self.run("step", B, variant)
        self.draws.store(block, at, B)

    def reset(self) -> None:
        """Drop the graphs and their pool (before the model's tensors are freed)."""
        self.graphs.clear()
        self._pool = None
