"""CUDA graphs of the whole decode step, one per exact batch size B in 1..max_batch: embedding to fp32 logits
(optionally to their argmax) or, with a ``DeviceSampler``, embedding to sampled tokens.

Stability note: a graph is keyed by B (and, with a sampler, by its variant: greedy, sample or sort, see
``ninfer.fast.sampling.rows``) alone. Request identity and page ids are graph *input data*: before a replay the
caller's tokens, slot ids, block-table row ids, context lengths, positions and rotary positions (position +
rope_delta for a prompt with images, the position itself otherwise: the same kernels either way) are copied into
static buffers that
the graph reads, and the sampler's per-row parameters and masks into its own, so any B sequences replay the same
graph at any context length. There is no padding: the Engine runs compact decode rounds of exactly B rows.

Capture runs the real decode, so warm-up and capture address the plan's dummy slot and dummy block-table row (which
points only at the dummy page): no live sequence's KV or GDN state is touched. Graphs are captured largest first
into one shared memory pool. Without CUDA (or with ``use_graphs=False``) the same static buffers drive an eager
call, which keeps this file's buffer logic testable on a CPU.

Pipeline stages (docs/pipeline.md): each rank has its own static inputs on its device, filled from the one pinned
mirror, and B's step is a chain of graphs, rank 0's front (its backups, the embedding and its layers), each later
rank's (its backups and layers), then rank 0's tail (final norm, head, sampler). Between two graphs the residual pair
crosses into the next graph's static carry buffers through the ``PeerLink``: torch's device copy orders itself after
the source's stream and before the destination's with CUDA events, so rank r's graph waits for rank r-1's hidden;
on ``0,0`` the ranks share the device and its stream. Without CUDA the same pieces run eagerly in the same order.

NOTE: the outputs returned by ``run`` are the graph's own buffers; the next ``run`` of the same B overwrites them.
With a sampler ``run`` returns nothing: the results sit in the sampler's static buffers (``DeviceSampler.collect``),
and no graph keeps its logits alive, so the pool holds one step's transients, not one logits tensor per graph.
"""

from __future__ import annotations

from typing import Callable

import torch

from ninfer.fast.capture import no_collection_during_capture
from ninfer.fast.model import FastModel
from ninfer.fast.model.kernels import Residual
from ninfer.fast.stage_graphs import GraphChain, Pair, StagePieces
from ninfer.fast.sampling import DeviceSampler
from ninfer.fast.sampling.rows import GREEDY


class StaticInputs:
    """Decode inputs at the largest batch size; a batch of B uses the first B columns. The seven int32 rows live in
    one device tensor, mirrored (on CUDA) by one pinned host tensor, so a step's inputs cross in one copy (one per
    pipeline rank: each has its own ``by_rank`` tensor on its device; the row attributes are rank 0's)."""

    ROWS = ("tokens", "slot_ids", "table_rows", "context_lens", "positions", "rope_positions", "backup_rows")

    def __init__(self, max_batch: int, device: torch.device, devices: list[torch.device] | None = None):
        # [7, max_batch] per rank
        self.by_rank = [torch.zeros(len(self.ROWS), max_batch, dtype=torch.int32, device=d)
                        for d in devices or [device]]
        self.packed = self.by_rank[0]
        pin = device.type == "cuda" and torch.cuda.is_available()
        self.staging = torch.zeros(len(self.ROWS), max_batch, dtype=torch.int32, pin_memory=pin)  # host mirror
        self._staging_np = self.staging.numpy()
        # the mirror's last copy to each rank; reuse waits for them
        self._copied = [torch.cuda.Event() for _ in self.by_rank] if pin else None
        # tokens [max_batch]; slot_ids: GDN slots; table_rows: rows of pools.block_tables; context_lens: keys to
        # attend to, the current token included; positions: the token's absolute position (its KV address);
        # rope_positions: its rotary position (position + the prompt's MRoPE rope_delta, 0 for a text prompt);
        # backup_rows: the step's backup slot less the backup base (the row's own, or its chained backup: a step
        # launched behind another keeps the state between the two there, `MemoryPlan.chain_backup`)
        (self.tokens, self.slot_ids, self.table_rows, self.context_lens, self.positions, self.rope_positions,
         self.backup_rows) = self.packed.unbind(0)

    @classmethod
    def allocate(cls, max_batch: int, device: torch.device, devices: list[torch.device] | None = None
                 ) -> "StaticInputs":
        return cls(max_batch, torch.device(device), devices)

    def rank(self, r: int) -> tuple[torch.Tensor, ...]:
        """Rank r's six addressing rows (tokens, slot_ids, table_rows, context_lens, positions, rope_positions;
        staged steps back up into their table rows' own slots)."""
        return self.by_rank[r].unbind(0)[:6]

    def fill(self, tokens, slot_ids, table_rows, context_lens, positions, rope_positions=None) -> int:
        """Copy one batch in (host or device tensors, any int dtype; rope_positions default to positions, backup
        rows to the table rows); returns B."""
        B = tokens.shape[0]
        rope = positions if rope_positions is None else rope_positions
        for row, src in enumerate((tokens, slot_ids, table_rows, context_lens, positions, rope, table_rows)):
            if src.shape != (B,):
                raise ValueError(f"decode inputs must all be [B={B}], got {tuple(src.shape)}")
            for packed in self.by_rank:
                packed[row, :B].copy_(src, non_blocking=True)
        return B

    def fill_lists(self, columns: tuple[list[int], ...]) -> int:
        """The same from five, six or seven host lists of ints (rope positions default to positions, backup rows
        to the table rows), through the pinned mirror in one copy; returns B."""
        B = len(columns[0])
        if len(columns) == len(self.ROWS) - 2:
            columns = (*columns, columns[-1])
        if len(columns) == len(self.ROWS) - 1:
            columns = (*columns, columns[2])
        if len(columns) != len(self.ROWS) or any(len(c) != B for c in columns):
            raise ValueError(f"decode inputs must all have B={B} entries, got {[len(c) for c in columns]}")
        if self._copied is not None:
            for event in self._copied:
                event.synchronize()
        self._staging_np[:, :B] = columns
        for r, packed in enumerate(self.by_rank):
            packed[:, :B].copy_(self.staging[:, :B], non_blocking=True)
            if self._copied is not None:
                with torch.cuda.device(packed.device):
                    self._copied[r].record()
        return B

    def fill_dummy(self, B: int, dummy_slot: int, dummy_row: int) -> None:
        """Warm-up/capture inputs: every row is a one-token sequence in the dummy slot and dummy row."""
        for packed in self.by_rank:
            packed[:, :B].zero_()
            packed[1, :B].fill_(dummy_slot)  # slot_ids
            packed[2, :B].fill_(dummy_row)  # table_rows
            packed[3, :B].fill_(1)  # context_lens
            packed[6, :B].fill_(dummy_row)  # backup_rows: the dummy row's backup is the dummy slot


def graphs_available() -> bool:
    return torch.cuda.is_available()


class DecodeGraphRunner:
    def __init__(self, model: FastModel, max_batch: int, greedy: bool = False, use_graphs: bool | None = None,
                 sampler: DeviceSampler | None = None, backup_base: int | None = None):
        if not 1 <= max_batch <= model.plan.max_seqs:
            raise ValueError(f"max_batch {max_batch} must lie in 1..{model.plan.max_seqs} (the plan's max_seqs)")
        if sampler is not None and sampler.max_batch < max_batch:
            raise ValueError(f"the sampler serves {sampler.max_batch} rows, the runner {max_batch}")
        self.model = model
        self.max_batch = max_batch
        self.greedy = greedy
        self.sampler = sampler
        # with a backup base, each step first copies every row's GDN state to slot backup_base + its table row
        self.backup_base = backup_base
        self.variants: tuple[str | None, ...] = sampler.VARIANTS if sampler is not None else (None,)
        on_cuda = model.device.type == "cuda" and graphs_available()
        self.use_graphs = on_cuda if use_graphs is None else (use_graphs and on_cuda)
        self.inputs = StaticInputs.allocate(max_batch, model.device, model.devices)
        # pipeline stages: the step in pieces per rank (stage_graphs.py); None: one stage, one piece
        self.pieces = StagePieces(model, self.inputs, max_batch, backup_base) if len(model.ranks) > 1 else None
        # one graph per (B, variant), or over stages a GraphChain of them; both replay()
        self.graphs: dict[tuple[int, str | None], torch.cuda.CUDAGraph | GraphChain] = {}
        self.outputs: dict[tuple[int, str | None], tuple[torch.Tensor, ...]] = {}
        self._pools: dict[torch.device, tuple] = {}  # each device's graphs share one memory pool
        self._streams: dict[torch.device, torch.cuda.Stream] = {}  # each device's warm-up stream

    def body(self, B: int, variant: str | None = None) -> tuple[torch.Tensor, ...]:
        """The graph body over the static inputs: what a replay runs, launched eagerly (a benchmark profiles it)."""
        if self.pieces is not None:
            return self.pieces.eager(B, lambda pair: self._tail(B, variant, pair))
        s = self.inputs
        if self.backup_base is not None:
            self.model.backup_slots(s.slot_ids[:B], s.backup_rows[:B], self.backup_base)
        logits = self.model.decode(s.tokens[:B], s.slot_ids[:B], s.table_rows[:B], s.context_lens[:B],
                                   s.positions[:B], s.rope_positions[:B])
        return self._head(logits, variant)

    def _tail(self, B: int, variant: str | None, pair: Pair) -> tuple[torch.Tensor, ...]:
        """Rank 0's end of a staged step: final norm, head, sampler."""
        return self._head(self.model.logits(self.model.final_norm(Residual(*pair))), variant)

    def _head(self, logits: torch.Tensor, variant: str | None) -> tuple[torch.Tensor, ...]:
        if self.sampler is not None:
            self.sampler.stages(logits, variant)
            return ()
        return (logits, logits.argmax(-1)) if self.greedy else (logits,)

    def capture(self, batch_sizes: list[int] | None = None, warmup: int = 2) -> None:
        """Capture one graph per batch size (default every B in 1..max_batch) and variant (over pipeline stages one
        per rank and a tail, chained), largest first, one shared pool per device."""
        if not self.use_graphs:
            return
        sizes = sorted(batch_sizes or range(1, self.max_batch + 1), reverse=True)
        with no_collection_during_capture():
            self._capture(sizes, warmup)
        for device in set(self.model.devices):
            torch.cuda.synchronize(device)

    def _capture(self, sizes: list[int], warmup: int) -> None:
        for B in sizes:
            for variant in self.variants:
                self._fill_dummy(B, variant)
                if self.pieces is None:
                    self.graphs[B, variant], self.outputs[B, variant] = self._captured(
                        self.model.device, lambda: self.body(B, variant), warmup)
                else:
                    self.graphs[B, variant], self.outputs[B, variant] = self.pieces.capture(
                        B, lambda pair: self._tail(B, variant, pair),
                        lambda device, fn: self._captured(device, fn, warmup))

    def _captured(self, device: torch.device, fn: Callable[[], object], warmup: int
                  ) -> tuple[torch.cuda.CUDAGraph, object]:
        """`fn` warmed up on a side stream of `device` (the Triton kernels compile and the allocator settles before
        capture), then captured into the device's shared pool; returns the graph and `fn`'s static output."""
        with torch.cuda.device(device):
            if device not in self._streams:
                self._streams[device] = torch.cuda.Stream(device=device)
            stream = self._streams[device]
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(warmup):
                    fn()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pools.get(device)):
                out = fn()
            self._pools.setdefault(device, graph.pool())
        return graph, out

    def _fill_dummy(self, B: int, variant: str | None) -> None:
        """Capture inputs: B one-token rows on the plan's dummy slot and row, the sampler's rows of `variant`."""
        plan = self.model.plan
        self.inputs.fill_dummy(B, plan.dummy_slot, plan.dummy_row)
        if self.sampler is not None:
            self.sampler.fill_dummy(B, variant)

    def dummy_step(self, B: int) -> Callable[[], object]:
        """Fill B greedy dummy rows (as a capture does) and return their step, for the start-up cost measurement to
        time: B's graph replayed, or the eager step on the same buffers where B has none (no CUDA, graphs off)."""
        variant = GREEDY if self.sampler is not None else None
        self._check(B, variant)
        self._fill_dummy(B, variant)
        return lambda: self._replay(B, variant)

    def can_use_graph(self, B: int, variant: str | None = None) -> bool:
        return (B, variant) in self.graphs

    def run(self, tokens: torch.Tensor, slot_ids: torch.Tensor, table_rows: torch.Tensor,
            context_lens: torch.Tensor, positions: torch.Tensor, variant: str | None = None,
            rope_positions: torch.Tensor | None = None) -> tuple[torch.Tensor, ...] | None:
        """Fill the static inputs and replay B's graph (or run eagerly on the same buffers when B has no graph).
        Returns (logits [B, V] fp32,) or, with ``greedy``, (logits, argmax tokens [B]). With a sampler the caller has
        filled its inputs (``DeviceSampler.prepare``, which names the variant) and collects the tokens afterwards;
        nothing is returned."""
        self._check(tokens.shape[0], variant)
        return self._replay(self.inputs.fill(tokens, slot_ids, table_rows, context_lens, positions, rope_positions),
                            variant)

    def run_lists(self, columns: tuple[list[int], ...], variant: str | None = None,
                  tokens: torch.Tensor | None = None) -> tuple[torch.Tensor, ...] | None:
        """``run`` from five host lists (tokens, slot ids, table rows, context lengths, positions), six with the
        rotary positions, seven with the backup rows: one copy in. ``tokens`` [B] int32 on the device replaces the
        token row after that copy (a chained step's: the draws of the step before it, never read by the host;
        clamped into the vocabulary, since a failed row's draw is dropped by the commit but its step still runs)."""
        self._check(len(columns[0]), variant)
        B = self.inputs.fill_lists(columns)
        if tokens is not None:
            torch.clamp(tokens, 0, self.model.cfg.vocab_size - 1, out=self.inputs.tokens[:B])
        return self._replay(B, variant)

    def _check(self, B: int, variant: str | None) -> None:
        if not 1 <= B <= self.max_batch:
            raise ValueError(f"batch {B} must lie in 1..{self.max_batch} (the runner's max_batch)")
        if variant not in self.variants:
            raise ValueError(f"variant {variant!r} is not one of this runner's {self.variants}")

    def _replay(self, B: int, variant: str | None) -> tuple[torch.Tensor, ...] | None:
        if self.can_use_graph(B, variant):
            self.graphs[B, variant].replay()
            out = self.outputs[B, variant]
        else:
            out = self.body(B, variant)
        return None if self.sampler is not None else out

    def reset(self) -> None:
        """Drop the graphs and their pool (before the model's tensors are freed)."""
        self.graphs.clear()
        self.outputs.clear()
        self._pools.clear()
