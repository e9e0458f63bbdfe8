"""CUDA graphs of the whole decode step, one per exact batch size B in 1..max_batch: embedding to fp32 logits
(optionally to their argmax) or, with a ``DeviceSampler``, embedding to sampled tokens.

Stability note: a graph is keyed by B (and, with a sampler, by its variant: greedy, sample or sort, see
``ninfer.fast.sampling.rows``) alone. Request identity and page ids are graph *input data*: before a replay the
caller's tokens, slot ids, block-table row ids, context lengths and positions are copied into static buffers that
the graph reads, and the sampler's per-row parameters and masks into its own, so any B sequences replay the same
graph at any context length. There is no padding: the Engine runs compact decode rounds of exactly B rows.

Capture runs the real decode, so warm-up and capture address the plan's dummy slot and dummy block-table row (which
points only at the dummy page): no live sequence's KV or GDN state is touched. Graphs are captured largest first
into one shared memory pool. Without CUDA (or with ``use_graphs=False``) the same static buffers drive an eager
call, which keeps this file's buffer logic testable on a CPU.

NOTE: the outputs returned by ``run`` are the graph's own buffers; the next ``run`` of the same B overwrites them.
With a sampler ``run`` returns nothing: the results sit in the sampler's static buffers (``DeviceSampler.collect``),
and no graph keeps its logits alive, so the pool holds one step's transients, not one logits tensor per graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ninfer.fast.capture import no_collection_during_capture
from ninfer.fast.model import FastModel
from ninfer.fast.sampling import DeviceSampler


@dataclass
class StaticInputs:
    """Decode inputs at the largest batch size; a batch of B uses the first B rows."""
    tokens: torch.Tensor  # [max_batch] int64
    slot_ids: torch.Tensor  # [max_batch] int32
    table_rows: torch.Tensor  # [max_batch] int32, rows of pools.block_tables
    context_lens: torch.Tensor  # [max_batch] int32
    positions: torch.Tensor  # [max_batch] int32

    @classmethod
    def allocate(cls, max_batch: int, device: torch.device) -> "StaticInputs":
        i32 = dict(dtype=torch.int32, device=device)
        return cls(tokens=torch.zeros(max_batch, dtype=torch.int64, device=device),
                   slot_ids=torch.zeros(max_batch, **i32), table_rows=torch.zeros(max_batch, **i32),
                   context_lens=torch.zeros(max_batch, **i32), positions=torch.zeros(max_batch, **i32))

    def fill(self, tokens, slot_ids, table_rows, context_lens, positions) -> int:
        """Copy one batch in (host or device tensors, any int dtype); returns B."""
        B = tokens.shape[0]
        for dst, src in ((self.tokens, tokens), (self.slot_ids, slot_ids), (self.table_rows, table_rows),
                         (self.context_lens, context_lens), (self.positions, positions)):
            if src.shape != (B,):
                raise ValueError(f"decode inputs must all be [B={B}], got {tuple(src.shape)}")
            dst[:B].copy_(src, non_blocking=True)
        return B

    def fill_dummy(self, B: int, dummy_slot: int, dummy_row: int) -> None:
        """Warm-up/capture inputs: every row is a one-token sequence in the dummy slot and dummy row."""
        self.tokens[:B].zero_()
        self.slot_ids[:B].fill_(dummy_slot)
        self.table_rows[:B].fill_(dummy_row)
        self.context_lens[:B].fill_(1)
        self.positions[:B].zero_()


def graphs_available() -> bool:
    return torch.cuda.is_available()


class DecodeGraphRunner:
    def __init__(self, model: FastModel, max_batch: int, greedy: bool = False, use_graphs: bool | None = None,
                 sampler: DeviceSampler | None = None):
        if not 1 <= max_batch <= model.plan.max_seqs:
            raise ValueError(f"max_batch {max_batch} must lie in 1..{model.plan.max_seqs} (the plan's max_seqs)")
        if sampler is not None and sampler.max_batch < max_batch:
            raise ValueError(f"the sampler serves {sampler.max_batch} rows, the runner {max_batch}")
        self.model = model
        self.max_batch = max_batch
        self.greedy = greedy
        self.sampler = sampler
        self.variants: tuple[str | None, ...] = sampler.VARIANTS if sampler is not None else (None,)
        on_cuda = model.device.type == "cuda" and graphs_available()
        self.use_graphs = on_cuda if use_graphs is None else (use_graphs and on_cuda)
        self.inputs = StaticInputs.allocate(max_batch, model.device)
        self.graphs: dict[tuple[int, str | None], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, str | None], tuple[torch.Tensor, ...]] = {}
        self._pool = None

    def _step(self, B: int, variant: str | None = None) -> tuple[torch.Tensor, ...]:
        s = self.inputs
        logits = self.model.decode(s.tokens[:B], s.slot_ids[:B], s.table_rows[:B], s.context_lens[:B],
                                   s.positions[:B])
        if self.sampler is not None:
            self.sampler.stages(logits, variant)
            return ()
        return (logits, logits.argmax(-1)) if self.greedy else (logits,)

    def capture(self, batch_sizes: list[int] | None = None, warmup: int = 2) -> None:
        """Capture one graph per batch size (default every B in 1..max_batch) and variant, largest first, one shared
        pool."""
        if not self.use_graphs:
            return
        sizes = sorted(batch_sizes or range(1, self.max_batch + 1), reverse=True)
        stream = torch.cuda.Stream(device=self.model.device)
        with no_collection_during_capture():
            self._capture(sizes, stream, warmup)
        torch.cuda.synchronize(self.model.device)

    def _capture(self, sizes: list[int], stream: torch.cuda.Stream, warmup: int) -> None:
        plan = self.model.plan
        for B in sizes:
            for variant in self.variants:
                self.inputs.fill_dummy(B, plan.dummy_slot, plan.dummy_row)
                if self.sampler is not None:
                    self.sampler.fill_dummy(B, variant)
                # warm-up on a side stream compiles the Triton kernels and settles the allocator before capture
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    for _ in range(warmup):
                        self._step(B, variant)
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self._pool):
                    self.outputs[B, variant] = self._step(B, variant)
                if self._pool is None:
                    self._pool = graph.pool()
                self.graphs[B, variant] = graph

    def can_use_graph(self, B: int, variant: str | None = None) -> bool:
        return (B, variant) in self.graphs

    def run(self, tokens: torch.Tensor, slot_ids: torch.Tensor, table_rows: torch.Tensor,
            context_lens: torch.Tensor, positions: torch.Tensor,
            variant: str | None = None) -> tuple[torch.Tensor, ...] | None:
        """Fill the static inputs and replay B's graph (or run eagerly on the same buffers when B has no graph).
        Returns (logits [B, V] fp32,) or, with ``greedy``, (logits, argmax tokens [B]). With a sampler the caller has
        filled its inputs (``DeviceSampler.prepare``, which names the variant) and collects the tokens afterwards;
        nothing is returned."""
        if not 1 <= tokens.shape[0] <= self.max_batch:
            raise ValueError(f"batch {tokens.shape[0]} must lie in 1..{self.max_batch} (the runner's max_batch)")
        if variant not in self.variants:
            raise ValueError(f"variant {variant!r} is not one of this runner's {self.variants}")
        B = self.inputs.fill(tokens, slot_ids, table_rows, context_lens, positions)
        if self.can_use_graph(B, variant):
            self.graphs[B, variant].replay()
            out = self.outputs[B, variant]
        else:
            out = self._step(B, variant)
        return None if self.sampler is not None else out

    def reset(self) -> None:
        """Drop the graphs and their pool (before the model's tensors are freed)."""
        self.graphs.clear()
        self.outputs.clear()
        self._pool = None
