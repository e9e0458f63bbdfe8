"""The decode step of a model cut into pipeline stages (docs/pipeline.md), in the pieces the graph runner captures one
CUDA graph each of, per exact B: rank 0's front (its backups, the embedding, its layers), each later rank's middle
(its backups, its layers), and rank 0's tail (the runner's: final norm, head, sampler). Every piece reads its rank's
static inputs (`StaticInputs.rank`) and the residual pair that the previous piece left in this rank's static carry
buffers; `carry` moves the pair there through the model's `PeerLink`, outside the graphs.

A piece builds a fresh `Residual` over the carry buffers on every call: a sublayer sets `Residual.delta`, so a
Residual kept across calls would hand a capture the warm-up's delta.
"""

from __future__ import annotations

from typing import Callable

import torch

from ninfer.fast.model import FastModel
from ninfer.fast.model.kernels import Residual

Pair = tuple[torch.Tensor, torch.Tensor | None]  # the residual h [B, H] and its pending delta [B, H] (or None)


class StagePieces:
    def __init__(self, model: FastModel, inputs, max_batch: int, backup_base: int | None):
        self.model, self.inputs, self.max_batch, self.backup_base = model, inputs, max_batch, backup_base
        self._carry: dict[tuple[int, str, torch.dtype], torch.Tensor] = {}  # (rank, "h" | "delta", dtype) -> buffer

    @property
    def ranks(self) -> int:
        return len(self.model.ranks)

    def _stage(self, rank: int, B: int, res: Residual) -> Residual:
        """Rank `rank`'s backups and layers on its static inputs."""
        tokens, slots, rows, ctx, pos, rope = (t[:B] for t in self.inputs.rank(rank))
        if self.backup_base is not None:
            self.model.backup_slots(slots, rows, self.backup_base, rank=rank)
        self.model.run_stage(rank, res, self.model.decode_inputs(rank, slots, rows, ctx, pos, rope))
        return res

    def front(self, B: int) -> Residual:
        return self._stage(0, B, self.model.embed(self.inputs.rank(0)[0][:B]))

    def middle(self, rank: int, B: int, pair: Pair) -> Residual:
        return self._stage(rank, B, Residual(*pair))

    def carry(self, res: Residual, src: int, dst: int, B: int) -> Pair:
        """The pair `res` of rank `src` in rank `dst`'s carry buffers (rows :B), through the link."""
        link = self.model.link
        h = link.pass_into(res.h, self._buffer(dst, "h", res.h)[:B], src, dst)
        return h, None if res.delta is None else link.pass_into(res.delta, self._buffer(dst, "delta", res.delta)[:B],
                                                                 src, dst)

    def _buffer(self, rank: int, kind: str, like: torch.Tensor) -> torch.Tensor:
        key = (rank, kind, like.dtype)
        if key not in self._carry:
            self._carry[key] = torch.zeros(self.max_batch, *like.shape[1:], dtype=like.dtype,
                                           device=self.model.devices[rank])
        return self._carry[key]

    def eager(self, B: int, tail: Callable[[Pair], tuple]) -> tuple:
        """The whole step without graphs: front, middles, then `tail` on rank 0."""
        res = self.front(B)
        for rank in range(1, self.ranks):
            res = self.middle(rank, B, self.carry(res, rank - 1, rank, B))
        return tail(self.carry(res, self.ranks - 1, 0, B))

    def capture(self, B: int, tail: Callable[[Pair], tuple], captured) -> tuple["GraphChain", tuple]:
        """B's chain of graphs; `captured(device, fn) -> (graph, output)` warms `fn` up and captures it. Each carry
        runs once eagerly before the next piece is captured (its buffers exist and hold the pair) and again before
        that piece's every replay."""
        devices, chain = self.model.devices, GraphChain()
        graph, res = captured(devices[0], lambda: self.front(B))
        chain.add(devices[0], graph)
        for rank in range(1, self.ranks + 1):
            dst, prev = rank % self.ranks, res  # the last carry goes back to rank 0's tail
            pair = self.carry(prev, rank - 1, dst, B)
            if dst:
                graph, res = captured(devices[dst], lambda r=dst, p=pair: self.middle(r, B, p))
            else:
                graph, res = captured(devices[0], lambda p=pair: tail(p))
            # prev holds the previous graph's static outputs: its replay refills them before this carry
            chain.add(devices[dst], graph, lambda s=prev, a=rank - 1, d=dst: self.carry(s, a, d, B))
        return chain, res


class GraphChain:
    """B's staged step as one replayable object: each piece's graph on its device, after the carry into it (torch's
    cross-device copy waits for the source stream and makes the destination's wait for it, with CUDA events)."""

    def __init__(self):
        self.links: list[tuple[torch.device, torch.cuda.CUDAGraph, Callable[[], object] | None]] = []

    def add(self, device: torch.device, graph: torch.cuda.CUDAGraph, before: Callable[[], object] | None = None
            ) -> None:
        self.links.append((device, graph, before))

    def replay(self) -> None:
        for device, graph, before in self.links:
            if before is not None:
                before()
            with torch.cuda.device(device):
                graph.replay()
