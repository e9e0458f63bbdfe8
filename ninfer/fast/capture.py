"""A guard for CUDA-graph capture shared by the decode graph runner and the device sampler."""

from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def no_collection_during_capture():
    """Collect dead objects first and keep the cyclic garbage collector off while graphs are captured. A dead
    Program (an earlier one in the same process) holds CUDA graphs, graph pools and pinned host buffers in reference
    cycles; were the collector to free them in the middle of a capture, their cudaFree / event calls would invalidate
    it ("operation failed due to a previous error during capture"). torch.cuda.graph no longer collects by itself."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
