"""CUDA graphs of the speculative round's target pass: one per exact number of rows B (blocks of at most k + 1
tokens, every row's [pending, d1..dk'] at its frontier), with each row's backup copy first, and one for B = 1
without it: tokens consumed in place (`FastExecutor.feed`: a control suffix of at most k + 1 tokens). A DFlash plan
without step slots (below) has one without backups per (B, width) too: a commit replays the kept tokens of every
cut block in one such pass (`FastExecutor.feed_rows`, `speculation.replay`).

Where the plan keeps step slots (the MTP backend always; DFlash where their share of the budget allows,
``memory.verify_steps``) a verify pass keeps every block position's state: GDN step j of a row reads the state step
j - 1 wrote and writes its own into the row's step slot j (``plan.step_slot``), the last step into the row's slot,
and the MTP head stores each position's hidden beside it; a partly accepted block then takes its state from step
slot n - 1 (`FastExecutor.select`) instead of a second target pass over the kept tokens. A feed steps in place.

Widths: a round of the adaptive draft policy (``program_core/draft_policy.py``) may verify blocks shorter than
k + 1, down to the pending token alone (width 1: the plain step with the backend's state kept). The runner holds
the static buffers of each of its ``widths`` and captures every (B, width) verify graph, so a narrow round pays
for its own tokens, not the full block's; a pass takes the narrowest width its longest block fits.

Stability note: a graph is keyed by (B, width, backup) alone; the per-round quantities are graph *input data* in static
buffers (``VerifyInputs``): the tokens, each row's GDN slot, block-table row and frontier, each token's position,
rotary position and row, the packed block starts and the GDN recurrence's steps with the slots each reads and
writes. Page ids are read on the device from ``pools.block_tables`` through the rows, as the decode graph does.

Layout of a pass over B rows of lens n_i <= width = k + 1 (N = sum n_i real tokens, T = B * width rows in all): the
real blocks packed at rows 0..N-1 exactly as ``FastModel.verify`` packs them, then T - N pad rows forming one more
block on the plan's dummy row (positions 0.., prefix 0), so every pad token writes its K/V into the dummy page and
attends there (finite values, no live page touched). The GDN recurrence runs width steps over B rows each; step j
of a row whose block is shorter points at the last pad row with slots -1, which reads zeros and writes nothing, and
stores its hidden in the dummy slot.

With the round's grammar rows (``masks``, `PrefixMasks`) each (B, width) verify graph has a masked twin whose body
forks the rows' bracket (D2H drafts, the host function's fill, H2D words) onto a side stream before the pass and
joins it before the graph ends: the seed's one captured step for structured output over device drafts.

Without CUDA (or with ``use_graphs=False``) the same static buffers drive an eager pass, so CPU tests prove this
path. The output (``logits`` [T, V] fp32) is a buffer allocated once beside the graphs and counted in the memory
plan (``plan.verify_rows``); the next pass overwrites it.

With the MTP head the pass also advances it (`MtpHead.advance_paged`): every consumed token completes one pair,
written at the target's KV slot (the MTP layer's pair p sits at page position p + 1) and attending over its row's
pages from key 1 with one decode-attention row per token, so the graph needs no gathered copy of the MTP KV.

With a DFlash / DFlash2 backend (``dflash``; blocks of up to k + 1 = 16 or 8 tokens) the pass taps the target's
layers and writes every consumed token's drafter context K/V at its own page slot (the target's KV slot: the
drafter's pages are indexed by the same block tables), rotated at the token's rotary position, which for a verified
or replayed token (always past the prompt) is MRoPE's temporal row, the drafter's position. The pad block's context
lands in the dummy page, like its K/V.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import torch

from ninfer.fast.capture import no_collection_during_capture
from ninfer.fast.hostcopy import HostMirror
from ninfer.fast.model import FastModel
from ninfer.fast.model.layers import StepInputs
from ninfer.fast.model.addressing import step_slots

if TYPE_CHECKING:  # the backend lives in the Program's package, which imports this module
    from ninfer.fast.program.dflash_backend import FastDFlashBackend
    from ninfer.fast.sampling.prefix_masks import PrefixMasks


class VerifyInputs:
    """Every host-made index of a pass in one int32 tensor (one pinned copy a pass on CUDA); tokens apart, since
    a round's drafts are already on the device."""

    def __init__(self, max_batch: int, width: int, device: torch.device):
        self.max_batch, self.width = max_batch, width
        T, R = max_batch * width, max_batch + 1  # token rows; rows with the pad block
        # (name, length) in packing order
        # per token: its table row, its keys (position + 1), whether it is a block's (1) or the pad's (0), the MTP
        # pair's rotary position (the token's - 1): derived here once, not by a dozen small launches a pass
        self.layout = (("slot_ids", R), ("table_rows", R), ("starts", R), ("cu", R + 1), ("positions", T),
                       ("rope_positions", T), ("block", T), ("h_src", T), ("token_rows", T), ("key_lens", T),
                       ("in_block", T), ("mtp_rope", T), ("step_rows", width * max_batch),
                       ("step_slots", width * max_batch), ("step_outs", width * max_batch),
                       ("h_dst", width * max_batch))
        self.mirror = HostMirror(sum(n for _, n in self.layout), device)
        self.packed = self.mirror.device
        self.tokens = torch.zeros(T, dtype=torch.long, device=device)  # [T]
        self.views, self._host_views, at = {}, {}, 0
        for name, n in self.layout:
            self.views[name] = self.packed[at:at + n]
            self._host_views[name] = self.mirror.host[at:at + n]
            at += n
        for name in ("step_rows", "step_slots", "step_outs", "h_dst"):  # [width, max_batch]
            self.views[name] = self.views[name].view(width, max_batch)
            self._host_views[name] = self._host_views[name].reshape(width, max_batch)

    def fill(self, slots: Sequence[int], rows: Sequence[int], starts: Sequence[int], lens: Sequence[int],
             rope_deltas: Sequence[int], pad_row: int, pad_slot: int,
             steps: tuple[list[list[int]], list[list[int]]] | None = None) -> int:
        """Write one pass's indices (B rows, lens[i] <= width) into the mirror and queue its copy; returns B. The pad
        block sits on table row `pad_row` and state slot `pad_slot` (the dummy ones). ``steps``: the slots each
        row's GDN steps read and write (``addressing.step_slots``; None: in place), each step's hidden stored in the
        slot it writes where that is not the row's slot, else in the pad slot, and in the row's slot after its
        last."""
        B, W = len(lens), self.width
        if not 1 <= B <= self.max_batch or min(lens) < 1 or max(lens) > W:
            raise ValueError(f"a verify pass takes 1..{self.max_batch} blocks of 1..{W} tokens, got {list(lens)}")
        self.mirror.open()
        h = self._host_views
        T, N = B * W, sum(lens)
        h["slot_ids"][:B], h["slot_ids"][B] = slots, pad_slot
        h["table_rows"][:B], h["table_rows"][B] = rows, pad_row
        h["starts"][:B], h["starts"][B] = starts, 0
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        h["cu"][:B + 2] = cu + [T]
        h["positions"][:N] = [s + j for s, n in zip(starts, lens) for j in range(n)]
        h["positions"][N:T] = range(T - N)
        h["rope_positions"][:T] = h["positions"][:T]
        h["rope_positions"][:N] += [d for d, n in zip(rope_deltas, lens) for _ in range(n)]
        h["block"][:N] = [i for i, n in enumerate(lens) for _ in range(n)]
        h["block"][N:T] = B
        h["token_rows"][:N] = [r for r, n in zip(rows, lens) for _ in range(n)]
        h["token_rows"][N:T] = pad_row
        h["key_lens"][:T] = h["positions"][:T] + 1
        h["in_block"][:N], h["in_block"][N:T] = 1, 0
        h["mtp_rope"][:T] = h["rope_positions"][:T] - 1
        # the MTP pair of token t: the hidden before it, the row's stored one (row T + i) for its first token
        h["h_src"][:T] = range(-1, T - 1)
        h["h_src"][cu[:B]] = [T + i for i in range(B)]
        if N < T:
            h["h_src"][N] = T + B
        reads, writes = steps or ([[s] * n for s, n in zip(slots, lens)],) * 2
        for j in range(W):
            h["step_rows"][j, :B] = [c + j if n > j else T - 1 for c, n in zip(cu, lens)]
            h["step_slots"][j, :B] = [r[j] if n > j else -1 for r, n in zip(reads, lens)]
            h["step_outs"][j, :B] = [w[j] if n > j else -1 for w, n in zip(writes, lens)]
            h["h_dst"][j, :B] = [w[j] if n > j and (w[j] != s or n == j + 1) else pad_slot
                                 for w, s, n in zip(writes, slots, lens)]
        self.mirror.send()
        return B

    def fill_dummy(self, B: int, dummy_slot: int, dummy_row: int, start: int = 1) -> None:
        """Warm-up/capture (and benchmark) inputs: B full blocks at position `start` of the dummy slot and row (which
        maps every position to the dummy page)."""
        self.fill([dummy_slot] * B, [dummy_row] * B, [start] * B, [self.width] * B, [0] * B, dummy_row, dummy_slot)
        self.tokens.zero_()


class VerifyGraphRunner:
    def __init__(self, model: FastModel, max_batch: int, width: int, backup_base: int,
                 use_graphs: bool | None = None, dflash: "FastDFlashBackend | None" = None,
                 widths: Sequence[int] = (), masks: "PrefixMasks | None" = None):
        """`width`: the full block (k + 1); `widths`: the narrower verify widths to capture too (the draft policy's;
        the full one is always there). `dflash`: the DFlash backend whose drafter context every pass extends
        (None: MTP, whose head the model carries). `masks`: the round's grammar rows, whose bracket the masked
        graphs run beside the pass."""
        plan = model.plan
        if not 1 <= max_batch <= plan.max_seqs or max_batch * width > plan.verify_rows:
            raise ValueError(f"{max_batch} blocks of {width} tokens exceed the plan's {plan.max_seqs} rows or its "
                             f"{plan.verify_rows} verify rows")
        self.model, self.max_batch, self.width, self.backup_base = model, max_batch, width, backup_base
        self.widths = tuple(sorted({width, *(w for w in widths if 1 <= w < width)}))
        self.dflash, self.masks = dflash, masks
        # the pad block's positions and keys must stay inside the dummy row's table (past it: a device assert)
        self.max_pad = plan.max_pages_per_seq * plan.page_size
        # pipeline stages on separate GPUs run the pass eagerly: one graph cannot hold their devices' copies
        on_cuda = model.device.type == "cuda" and torch.cuda.is_available() and len(set(model.devices)) == 1
        self.use_graphs = on_cuda if use_graphs is None else (use_graphs and on_cuda)
        self.inputs = {w: VerifyInputs(max_batch, w, model.device) for w in self.widths}
        T = max_batch * width
        # [T, V], shared by every width: a narrower pass writes its first B * w rows
        self.logits = torch.zeros(T, model.cfg.vocab_size, dtype=torch.float32, device=model.device)
        self.graphs: dict[tuple[int, int, bool, bool], torch.cuda.CUDAGraph] = {}  # (B, width, backup, masked)
        self._pool = None

    def _step_inputs(self, B: int, width: int) -> tuple[StepInputs, torch.Tensor]:
        """The pass's addressing from the static buffers, on the device (graph-safe: no host read), and each
        token's row of the block tables [T, max_pages] (the MTP layer's attention reads it)."""
        m, v, T = self.model, self.inputs[width].views, B * width
        tables = m.pools.block_tables
        table = tables.index_select(0, v["table_rows"][:B + 1])  # [B + 1, max_pages]
        pos = v["positions"][:T]
        # each token's table row and its KV slot, in one launch
        token_tables, slots = m.kernels.decode_slots(tables, v["token_rows"][:T], pos, m.plan.page_size)
        # the per-position recurrence's steps (`GDN_BLOCK_VERIFY` off; gdn_decode reads int32 token rows)
        steps = [(v["step_rows"][j, :B], v["step_slots"][j, :B], v["step_outs"][j, :B]) for j in range(width)]
        return StepInputs(positions=pos, slot_mapping=slots, slot_ids=v["slot_ids"][:B],
                          block_table=table, cu_seqlens=v["cu"][:B + 2], prefix_lens=v["starts"][:B + 1],
                          max_prefix=self.model.plan.max_context, gdn_steps=steps,
                          gdn_outs=v["step_outs"][:, :B], rope_positions=v["rope_positions"][:T]), token_tables

    def _mtp_inputs(self, B: int, width: int, step: StepInputs, token_tables: torch.Tensor) -> StepInputs:
        """The MTP layer's addressing of the same tokens: pair p = position - 1 at the target's KV slot, one decode
        attention row per token over its row's pages, keys 1..position (the pad block's from key 0), rotating at
        the target's rotary position - 1: p + rope_delta after a prompt with images, which is p's MRoPE position in
        all three rows (for p the prompt's last index too, since a prompt with images ends in text:
        docs/speculative.md, "Images")."""
        v, T = self.inputs[width].views, B * width
        return StepInputs(positions=step.positions, slot_mapping=step.slot_mapping, slot_ids=v["slot_ids"][:B],
                          block_table=token_tables, context_lens=v["key_lens"][:T],
                          first_keys=v["in_block"][:T], rope_positions=v["mtp_rope"][:T])

    def body(self, B: int, backup: bool, width: int | None = None, masked: bool = False) -> None:
        """The graph body: the rows' backup copies (verify), the target pass into ``logits``, and with the MTP head
        its advance over the consumed tokens (`MtpHead.advance_paged`, each step's hidden stored where ``h_dst``
        says), with a DFlash backend their drafter context (`FastDFlashBackend.extend`). `width`: blocks of at most
        that many tokens (None: the full block). `masked`: the grammar rows' bracket beside it all."""
        width = width or self.width
        m, inputs, T = self.model, self.inputs[width], B * width
        v = inputs.views
        if masked:
            self.masks.fork(B)
        if backup:
            m.backup_slots(v["slot_ids"][:B], v["table_rows"][:B], self.backup_base)
        step, token_tables = self._step_inputs(B, width)
        tokens = inputs.tokens[:T]
        taps: dict[int, torch.Tensor] | None = None if self.dflash is None else {}
        hidden = m.hidden_states(tokens, step, taps)
        self.logits[:T].copy_(m.logits(hidden))
        if self.dflash is not None:
            self.dflash.extend(taps, step.rope_positions, step.slot_mapping)
        if m.mtp is not None:
            m.mtp.advance_paged(hidden, tokens, self._mtp_inputs(B, width, step, token_tables), v["h_src"][:T],
                                v["slot_ids"][:B + 1], v["h_dst"][:, :B].flatten(), v["step_rows"][:, :B].flatten())
        if masked:
            self.masks.join()

    def capture(self, warmup: int = 2) -> None:
        """Every (B, width, backup, masked) graph, largest first, one shared pool: each verify with its masked twin
        where there are grammar rows; the feed's is (1, full width, no backup, unmasked), and where the plan keeps
        no step states every (B, width) has one without backups for the replays. The warm runs' bracket fills no
        row."""
        if not self.use_graphs:
            return
        twins = (False, True) if self.masks is not None else (False,)
        plan = self.model.plan
        pairs = [(B, w) for w in reversed(self.widths) for B in range(self.max_batch, 0, -1)]
        keys = [(B, w, True, m) for B, w in pairs for m in twins]
        # without step slots a commit replays every cut block's kept tokens in one pass (`feed_rows`): a graph per
        # (B, width) without backups; with them only the feed's
        feeds = [(B, w, False, False) for B, w in pairs] if not plan.step_slots else [(1, self.width, False, False)]
        stream = torch.cuda.Stream(device=self.model.device)
        with no_collection_during_capture():
            for B, width, backup, masked in keys + feeds:
                self.inputs[width].fill_dummy(B, plan.dummy_slot, plan.dummy_row)
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    for _ in range(warmup):
                        self.body(B, backup, width, masked)
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self._pool):
                    self.body(B, backup, width, masked)
                if self._pool is None:
                    self._pool = graph.pool()
                self.graphs[B, width, backup, masked] = graph
        torch.cuda.synchronize(self.model.device)
        if self.masks is not None:
            self.masks.function.take_error()

    def width_for(self, lens: Sequence[int], backup: bool = True) -> int | None:
        """The width whose static buffers take blocks of `lens` (None: the eager pass): at most max_batch blocks,
        the narrowest captured width at least the longest block (without backups, where the plan keeps step
        states, the full width's alone: that pass is a feed), with no more pad rows than the dummy row's table
        addresses (many short blocks beside a small max_context)."""
        if not 1 <= len(lens) <= self.max_batch:
            return None
        for width in self.widths if backup or not self.model.plan.step_slots else (self.width,):
            if max(lens) <= width:
                return width if len(lens) * width - sum(lens) <= self.max_pad else None
        return None

    def fits(self, lens: Sequence[int], backup: bool = True) -> bool:
        return self.width_for(lens, backup) is not None

    def run(self, tokens: torch.Tensor, slots: Sequence[int], rows: Sequence[int], starts: Sequence[int],
            lens: Sequence[int], rope_deltas: Sequence[int], backup: bool, keep_steps: bool = False,
            masked: bool = False) -> torch.Tensor:
        """tokens [N = sum lens] on the device, packed as ``FastModel.verify`` takes them. Replays the graph of
        (B, the narrowest width that fits, backup, masked), or runs the same pass eagerly; ``keep_steps``: every
        block position's state kept in the rows' step slots (``FastModel.verify``'s); ``masked``: the grammar rows
        staged by ``masks.queue(..., in_pass=True)`` are filled beside the pass. Returns logits [N, V] fp32, a view
        of the static output that the next pass overwrites."""
        plan = self.model.plan
        width = self.width_for(lens, backup)
        if width is None:
            raise ValueError(f"blocks of lens {list(lens)} fit no verify width of {self.widths}")
        steps = step_slots(plan, slots, rows, lens, True) if keep_steps else None
        inputs = self.inputs[width]
        B = inputs.fill(slots, rows, starts, lens, rope_deltas, plan.dummy_row, plan.dummy_slot, steps)
        N = tokens.shape[0]
        if N != sum(lens):
            raise ValueError(f"{N} tokens for blocks of lens {list(lens)}")
        inputs.tokens[:N].copy_(tokens)
        if masked and (self.masks is None or not backup):
            raise ValueError("grammar rows run beside a verify pass of a runner that has them")
        graph = self.graphs.get((B, width, backup, masked))
        if graph is not None:
            graph.replay()
        else:
            self.body(B, backup, width, masked)
        return self.logits[:N]

    def dummy_pass(self, B: int, width: int, backup: bool = True) -> Callable[[], object]:
        """A verify pass (`backup`; else a replay's) of B full blocks of `width` on the dummy slot and row, for
        timing (no live state is touched): its graph's replay, or the eager body."""
        plan, T = self.model.plan, B * width
        self.inputs[width].fill_dummy(B, plan.dummy_slot, plan.dummy_row)
        # tokens spread over the vocabulary: a MoE pass routes them to about as many experts as text does (one
        # token id everywhere sends every row to the same few experts, which no served round does)
        spread = torch.randint(0, self.model.cfg.vocab_size, (T,), generator=torch.Generator().manual_seed(T))
        self.inputs[width].tokens[:T].copy_(spread)
        graph = self.graphs.get((B, width, backup, False))
        return graph.replay if graph is not None else lambda: self.body(B, backup, width)

    def reset(self) -> None:
        """Drop the graphs and their pool (before the model's tensors are freed)."""
        self.graphs.clear()
        self._pool = None
