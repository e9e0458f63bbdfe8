"""CUDA graphs of mixed passes: B decode rows and a short prefill piece of another sequence in one model pass
(`FastModel.mixed_piece`), one graph per (piece bucket, B). An eager mixed pass pays the host time of a whole
model's launches (about 17 ms on the 9B, more than a 512-token piece's device time), which is what keeps the decode
rows waiting; a replay does not pay it, so a chunk riding in a decode round costs about its device time.

Stability note: a graph is keyed by (bucket, B) alone. The decode rows' tokens, GDN slots, table rows and positions,
and the piece's tokens (padded with id 0 to the bucket), slot, table row, first position and real length are graph
*input data*, copied in one copy from one pinned mirror (`MixedInputs`). The body backs the decode rows up (each
row's GDN state into its table row's backup slot, as the decode graphs do), then runs the pass; a start at position
0 resets the piece's slot before the replay (host-known). The buckets are the prefill graphs' (`PrefillGraphRunner`),
and the graphs are captured into the prefill graphs' pool: one pass of the largest bucket plus B rows, which the
memory plan counts (``prefill_graph_bytes`` with the decode rows). Without CUDA the same static buffers drive an
eager call, so CPU tests run the code the graphs replay.

NOTE: the logits ``run`` returns are a view of one buffer all the graphs write (a copy of [B + 1, V] at the end of
each: no graph keeps an output of its own in the pool); the next ``run`` overwrites them.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ninfer.fast.capture import no_collection_during_capture, warm_and_capture
from ninfer.fast.prefill_graphs import PrefillGraphRunner


class MixedInputs:
    """One int32 device tensor mirrored by one pinned host tensor: the tokens [max_batch + largest] (the decode
    rows' right-aligned before the piece's, so every B reads one contiguous slice), the piece's slot, table row,
    start and length, then the decode rows' slots, table rows and positions [max_batch] each."""

    SCALARS = 4

    def __init__(self, max_batch: int, largest: int, device: torch.device):
        self.max_batch, self.largest = max_batch, largest
        n = max_batch + largest + self.SCALARS + 3 * max_batch
        self.packed = torch.zeros(n, dtype=torch.int32, device=device)
        pin = device.type == "cuda" and torch.cuda.is_available()
        self.staging = torch.zeros(n, dtype=torch.int32, pin_memory=pin)
        self._np = self.staging.numpy()
        self._copied = torch.cuda.Event() if pin else None  # the mirror's last copy; reuse waits for it
        at = max_batch + largest
        self.slot, self.row, self.start, self.length = (self.packed[at + i:at + i + 1] for i in range(self.SCALARS))
        at += self.SCALARS
        self.slots, self.rows, self.positions = (self.packed[at + i * max_batch:at + (i + 1) * max_batch]
                                                 for i in range(3))

    def tokens(self, B: int, bucket: int) -> torch.Tensor:
        """[B + bucket]: the decode rows' tokens, then the padded piece's."""
        return self.packed[self.max_batch - B:self.max_batch + bucket]

    def fill(self, piece: Sequence[int], slot: int, row: int, start: int, bucket: int,
             decode: tuple[Sequence[int], Sequence[int], Sequence[int], Sequence[int]]) -> None:
        """The piece padded with id 0 to `bucket` tokens, its addressing, and the decode rows' (tokens, slots,
        table rows, positions), in one copy."""
        if self._copied is not None:
            self._copied.synchronize()
        tokens, slots, rows, positions = decode
        mb, n, B = self.max_batch, len(piece), len(tokens)
        self._np[mb - B:mb] = tokens
        self._np[mb:mb + n] = piece
        self._np[mb + n:mb + bucket] = 0
        at = mb + self.largest
        self._np[at:at + self.SCALARS] = (slot, row, start, n)
        at += self.SCALARS
        for i, values in enumerate((slots, rows, positions)):
            self._np[at + i * mb:at + i * mb + B] = values
        self.packed.copy_(self.staging, non_blocking=True)
        if self._copied is not None:
            self._copied.record()


class MixedGraphRunner:
    def __init__(self, pieces: PrefillGraphRunner, max_batch: int, backup_base: int):
        """Graphs for the prefill graphs' buckets at B = 1..max_batch decode rows; `backup_base` + table row is a
        decode row's backup slot."""
        self.pieces, self.model, self.max_batch, self.backup_base = pieces, pieces.model, max_batch, backup_base
        self.buckets, self.use_graphs = pieces.buckets, pieces.use_graphs
        self.inputs = MixedInputs(max_batch, pieces.largest, self.model.device)
        # [max_batch + 1, V] fp32: every graph's logits land here, so no graph keeps its own output in the pool
        self.logits = torch.empty(max_batch + 1, self.model.cfg.vocab_size, dtype=torch.float32,
                                  device=self.model.device)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}

    def fits(self, n: int, B: int) -> bool:
        """Whether an n-token piece beside B decode rows replays a graph (or, off CUDA, runs its padded body)."""
        return 1 <= B <= self.max_batch and 1 <= n <= self.pieces.largest

    def body(self, bucket: int, B: int) -> torch.Tensor:
        """The graph body over the static inputs: the decode rows' backup, then the pass. Logits [B + 1, V] (a view
        of the shared buffer)."""
        s = self.inputs
        slots, rows = s.slots[:B], s.rows[:B]
        self.model.backup_slots(slots, rows, self.backup_base)
        out = self.logits[:B + 1]
        return out.copy_(self.model.mixed_piece(s.tokens(B, bucket), s.slot, s.row, s.start, s.length,
                                                (slots, rows, s.positions[:B])))

    def capture(self, warmup: int = 2) -> None:
        """One graph per (bucket, B), largest first, in the prefill graphs' pool (captured before these)."""
        if not self.use_graphs:
            return
        plan, stream = self.model.plan, torch.cuda.Stream(device=self.model.device)
        with no_collection_during_capture():
            for bucket in reversed(self.buckets):
                for B in range(self.max_batch, 0, -1):
                    # the dummy slot and row on every side: its writes land on the dummy page and slot alone
                    self.inputs.fill([0] * bucket, plan.dummy_slot, plan.dummy_row, 0, bucket,
                                     ([0] * B, [plan.dummy_slot] * B, [plan.dummy_row] * B, [0] * B))
                    self.graphs[bucket, B], _ = warm_and_capture(lambda: self.body(bucket, B), stream,
                                                                 self.pieces.pool, warmup)
        torch.cuda.synchronize(self.model.device)

    def run(self, piece: Sequence[int], slot: int, row: int, start: int,
            decode: tuple[Sequence[int], Sequence[int], Sequence[int], Sequence[int]]) -> torch.Tensor:
        """Back the decode rows up and run them (tokens, GDN slots, table rows, positions) beside `piece`
        (1..largest prompt tokens of the sequence at `slot` and `row` from `start`; 0: the slot is reset first), all
        pages already in the rows: the graph of (bucket, B) replayed, or the same padded body run eagerly. Returns
        logits [B + 1, V] fp32 (the shared buffer): each decode row's, then the piece's last token's."""
        B, bucket = len(decode[0]), self.pieces.bucket(len(piece))
        if bucket is None or not self.fits(len(piece), B):
            raise ValueError(f"a graphed mixed pass holds 1..{self.pieces.largest} prompt tokens beside 1.."
                             f"{self.max_batch} rows, got {len(piece)} beside {B}")
        if start == 0:
            for pools in self.model.ranks:  # every pipeline stage's GDN layers
                pools.reset_slot(slot)
        self.inputs.fill(piece, slot, row, start, bucket, decode)
        if (bucket, B) in self.graphs:
            self.graphs[bucket, B].replay()
            return self.logits[:B + 1]
        return self.body(bucket, B)
