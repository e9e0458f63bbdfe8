"""CUDA graphs of short prefill pieces of one sequence, one per piece-length bucket (64, 128, 256, .. tokens up to
the plan's ``prefill_graph_tokens``): an eager prefill piece launches ~300 kernels (0.8B) from Python, ~12 ms of
host time whatever its length (docs/fast-model.md), which a replay does not pay.

Stability note: a graph is keyed by its bucket alone. The piece's tokens (padded with id 0 to the bucket), its GDN
slot, block-table row, first position and real length are graph *input data*: ``run`` copies them into one static
int32 buffer (through one pinned host mirror: one copy) and replays the smallest bucket that holds the piece. The
body is ``FastModel.prefill_piece``, whose padding rows write no KV (slot -1), leave the GDN state and conv window
as the real rows leave them, and whose attention takes the number of key-walk shares from the prefix on the device
(a fixed grid of `grid_splits` shares). A start at position 0 resets the slot before the replay (host-known).

Capture runs the real body on the plan's dummy slot and row, largest bucket first, into one private pool, which
the memory plan counts (``MemoryPlan.prefill_graph_bytes``). Without CUDA (or ``use_graphs=False``) the same
static buffers drive an eager call, so CPU tests run the padded code the graphs replay.

NOTE: the logits ``run`` returns are the bucket graph's own buffer; the next ``run`` of that bucket overwrites them.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ninfer.fast.capture import no_collection_during_capture, warm_and_capture
from ninfer.fast.graph_runner import graphs_available
from ninfer.fast.hostcopy import HostMirror
from ninfer.fast.model import FastModel
from ninfer.fast.model.layers import GDN_CHUNK


def prefill_buckets(largest: int, piece: int, max_context: int) -> tuple[int, ...]:
    """The piece lengths with a graph: GDN_CHUNK doubling up to `largest`, none longer than the model's prefill
    piece or the context (a longer piece would be cut or refused before it reached a graph)."""
    buckets, n = [], GDN_CHUNK
    while n <= min(largest, piece, max_context):
        buckets.append(n)
        n *= 2
    return tuple(buckets)


class PrefillInputs:
    """tokens [largest bucket] then the slot, table row, start and length, in one int32 device tensor mirrored by
    one pinned host tensor on CUDA."""

    SCALARS = 4

    def __init__(self, largest: int, device: torch.device):
        self.largest = largest
        self.mirror = HostMirror(largest + self.SCALARS, device)
        self.packed = self.mirror.device
        self.tokens = self.packed[:largest]
        # [1] each: GDN slot, block-table row, the piece's first position, its real token count
        self.slot, self.row, self.start, self.length = (self.packed[largest + i:largest + i + 1]
                                                        for i in range(self.SCALARS))

    def fill(self, tokens: Sequence[int], slot: int, row: int, start: int, bucket: int) -> None:
        """The piece padded with id 0 to `bucket` tokens, and its addressing, in one copy."""
        host, n = self.mirror.open(), len(tokens)
        host[:n] = tokens
        host[n:bucket] = 0
        host[self.largest:] = (slot, row, start, n)
        self.mirror.send()

    def fill_dummy(self, bucket: int, dummy_slot: int, dummy_row: int) -> None:
        """Warm-up / capture inputs: a whole bucket of token 0 at position 0 in the dummy slot and row."""
        self.tokens.zero_()
        self.slot.fill_(dummy_slot)
        self.row.fill_(dummy_row)
        self.start.zero_()
        self.length.fill_(bucket)


class PrefillGraphRunner:
    def __init__(self, model: FastModel, largest: int | None = None, use_graphs: bool | None = None):
        """Buckets up to `largest` tokens (default: the plan's ``prefill_graph_tokens``, what its pool counts)."""
        plan = model.plan
        self.model = model
        largest = plan.prefill_graph_tokens if largest is None else largest
        self.buckets = prefill_buckets(largest, plan.max_prefill_tokens, plan.max_context)
        if not self.buckets:
            raise ValueError(f"no prefill graph bucket fits {largest} tokens, the piece {plan.max_prefill_tokens} "
                             f"and the context {plan.max_context} (the smallest is {GDN_CHUNK})")
        # pipeline stages on one device run in one graph (the residual's passes are copies on it); over separate
        # GPUs the padded piece runs eagerly: one graph cannot span devices
        on_cuda = model.device.type == "cuda" and graphs_available() and len(set(model.devices)) == 1
        self.use_graphs = on_cuda if use_graphs is None else (use_graphs and on_cuda)
        self.inputs = PrefillInputs(self.buckets[-1], model.device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self._pool = None

    @property
    def largest(self) -> int:
        return self.buckets[-1]

    @property
    def pool(self):
        """The graphs' private memory pool (None before the first capture): the mixed graphs capture into it."""
        return self._pool

    def bucket(self, n: int) -> int | None:
        """The smallest bucket holding an n-token piece (None: longer than every bucket)."""
        return next((b for b in self.buckets if n <= b), None)

    def body(self, bucket: int) -> torch.Tensor:
        """The graph body over the static inputs: what a replay runs, launched eagerly (a benchmark profiles it)."""
        s = self.inputs
        return self.model.prefill_piece(s.tokens[:bucket], s.slot, s.row, s.start, s.length)[0]  # [V] fp32

    def capture(self, warmup: int = 2) -> None:
        """One graph per bucket, largest first, one private pool (two warm-up runs each on a side stream compile
        the kernels and settle the autotuners before capture)."""
        if not self.use_graphs:
            return
        stream = torch.cuda.Stream(device=self.model.device)
        with no_collection_during_capture():
            for bucket in reversed(self.buckets):
                self._capture(bucket, stream, warmup)
        torch.cuda.synchronize(self.model.device)

    def _capture(self, bucket: int, stream: torch.cuda.Stream, warmup: int) -> None:
        plan = self.model.plan
        self.inputs.fill_dummy(bucket, plan.dummy_slot, plan.dummy_row)
        graph, self.outputs[bucket] = warm_and_capture(lambda: self.body(bucket), stream, self._pool, warmup)
        if self._pool is None:
            self._pool = graph.pool()
        self.graphs[bucket] = graph

    def run(self, tokens: Sequence[int], slot: int, row: int, start: int) -> torch.Tensor:
        """Prefill `tokens` (1..largest) of the sequence at GDN slot `slot` and table row `row` from position
        `start` (0: the slot is reset first), its pages already in the row: the bucket's graph replayed, or the same
        padded body run eagerly. Returns the last token's logits [V] fp32 (the graph's buffer)."""
        bucket = self.bucket(len(tokens))
        if not tokens or bucket is None:
            raise ValueError(f"a graphed prefill piece holds 1..{self.largest} tokens, got {len(tokens)}")
        if start == 0:
            for pools in self.model.ranks:  # every pipeline stage's GDN layers
                pools.reset_slot(slot)
        self.inputs.fill(tokens, slot, row, start, bucket)
        if bucket in self.graphs:
            self.graphs[bucket].replay()
            return self.outputs[bucket]
        return self.body(bucket)

    def reset(self) -> None:
        """Drop the graphs and their pool (before the model's tensors are freed)."""
        self.graphs.clear()
        self.outputs.clear()
        self._pool = None
