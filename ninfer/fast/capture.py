"""CUDA-graph capture shared by the graph runners and the device sampler: the collector guard, and a body warmed on a
side stream then captured into a shared pool."""

from __future__ import annotations

import contextlib
import gc
from typing import Callable

import torch


@contextlib.contextmanager
def no_collection_during_capture(collect: bool = True):
    """Collect dead objects first and keep the cyclic garbage collector off while graphs are captured. A dead
    Program (an earlier one in the same process) holds CUDA graphs, graph pools and pinned host buffers in reference
    cycles; were the collector to free them in the middle of a capture, their cudaFree / event calls would invalidate
    it ("operation failed due to a previous error during capture"). torch.cuda.graph no longer collects by itself.
    ``collect=False`` (a capture while serving, where a full collection would stall every request): only the
    collector's pause, which is what keeps the capture valid."""
    if collect:
        gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def warm_and_capture(body: Callable[[], object], stream: "torch.cuda.Stream", pool, warmup: int,
                     before: Callable[[], object] | None = None) -> tuple["torch.cuda.CUDAGraph", object]:
    """`body` run `warmup` times on the side `stream` (each run after `before`: Triton compiles and the allocator
    settles off the capture), `before` once more for the captured run's inputs, then captured into `pool` (None: the
    graph's own, ``graph.pool()`` to share next); returns the graph and the captured run's output."""
    before = before or (lambda: None)
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            before()
            body()
        before()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = body()
    return graph, out
