"""CUDA graphs of the vision tower's encode, one per image grid (t, h, w): an encode is some 250 launches (seven a
block, 27 blocks at the real geometry), and below about 6000 patches the host's launches, not the GPU, set its pace
(docs/performance.md, ninth session: a 512x512 image took 14.5 ms against a 1.3 ms FLOP floor).

Policy: a grid's first encode runs eagerly (it builds the grid's tables and compiles or plans every kernel at its
shapes); its second is captured and replayed, and later ones replay. So a grid seen once costs nothing extra, and a
capture while serving never runs a kernel for the first time. At most ``limit`` graphs are kept (least recently used
first out), all in one memory pool; the tower drops them all when it plans a new workspace (they address the old
one). The first failed capture turns graphs off for the tower, with the reason kept (``failed``), and the encode
runs eagerly.

Stability note: a graph is keyed by its grid alone. Its inputs are the pixels the tower stages into its workspace
before the replay (the same buffer every encode), and its tables are the grid's cached ones; the output is the
captured run's features tensor, which the next replay overwrites, so each replay returns a copy.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Callable

import torch

from ninfer.fast.capture import no_collection_during_capture, warm_and_capture

Grid = tuple[int, int, int]
Capture = Callable[[Callable[[], torch.Tensor], object], tuple[object, torch.Tensor]]
log = logging.getLogger(__name__)


def cuda_capture(body: Callable[[], torch.Tensor], pool) -> tuple["torch.cuda.CUDAGraph", torch.Tensor]:
    """The encode's body captured on a side stream into `pool`, with no warm-up run (the grid's eager encode was
    one) and no full collection first (this runs while serving)."""
    with no_collection_during_capture(collect=False):
        return warm_and_capture(body, torch.cuda.Stream(), pool, warmup=0)


class VisionGraphs:
    def __init__(self, enabled: bool, limit: int, capture: Capture = cuda_capture):
        self.enabled, self.limit, self._capture = enabled, limit, capture
        self.graphs: OrderedDict[Grid, tuple[object, torch.Tensor]] = OrderedDict()
        self.seen: OrderedDict[Grid, None] = OrderedDict()  # grids encoded eagerly once, not captured (bounded)
        self.failed: str | None = None
        self._pool = None

    def clear(self) -> None:
        """Drop every graph and its pool (the tower planned a new workspace)."""
        self.graphs.clear()
        self.seen.clear()
        self._pool = None

    def run(self, grid: Grid, body: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The features of `body` (the encode after its pixels are staged): the grid's graph replayed (a copy of
        its output), or `body` run eagerly, captured first at the grid's second encode."""
        hit = self.graphs.get(grid)
        if hit is not None:
            self.graphs.move_to_end(grid)
            graph, out = hit
            graph.replay()
            return out.clone()
        if not self.enabled:
            return body()
        if grid not in self.seen:
            self.seen[grid] = None
            while len(self.seen) > 4 * self.limit:
                self.seen.popitem(last=False)
            return body()
        del self.seen[grid]
        try:
            graph, out = self._capture(body, self._pool)
        except RuntimeError as e:  # a kernel that cannot be captured: eager from now on, the reason kept
            self.enabled, self.failed = False, str(e).splitlines()[0] if str(e) else type(e).__name__
            self.graphs.clear()
            log.warning("vision tower: CUDA graphs off after a failed capture (%s); encodes run eagerly", self.failed)
            return body()
        if self._pool is None:
            self._pool = graph.pool()
        self.graphs[grid] = (graph, out)
        while len(self.graphs) > self.limit:
            self.graphs.popitem(last=False)
        graph.replay()
        return out.clone()
