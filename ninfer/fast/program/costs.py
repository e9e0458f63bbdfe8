"""The fast Program's physical costs for the context cache's cost model, measured once at start on CUDA (after the
prefill warm-up, on the dummy slot, row and page, so no live state is touched): prefill throughput of one piece,
and a pinned host-to-device copy of one GDN slot's state (the bulk of a short replica) and of one KV page (the
fixed cost of a copy). Off CUDA the Program reports the generic fallback (`CostFacts()`, docs/context-cache.md).
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from ninfer.contracts import CostFacts
from ninfer.fast.model import FastModel

from .stores import DeviceState

MEASURE_TOKENS = 2048  # the timed prefill piece (at most the Program's own piece and context)


def measure_costs(model: FastModel, store: DeviceState, tokens: int) -> CostFacts:
    device, plan = model.device, model.plan
    ids = torch.zeros(min(tokens, MEASURE_TOKENS), dtype=torch.long, device=device)
    prefill = _best(device, lambda: model.prefill(ids, plan.dummy_slot, plan.dummy_row, 0), repeats=2)
    state = store.load_slot(plan.dummy_slot)  # pinned host copies, as a replica's
    page = store.load_pages([plan.dummy_page])
    bulk = _best(device, lambda: store.store_slot(plan.dummy_slot, state))
    latency = _best(device, lambda: store.store_pages([plan.dummy_page], page))
    nbytes = sum(t.numel() * t.element_size() for t in state)
    return CostFacts(copy_bytes_per_s=nbytes / max(bulk - latency, 1e-7), copy_latency_s=latency,
                     prefill_tokens_per_s=len(ids) / prefill, measured=True)


def _best(device: torch.device, fn: Callable[[], object], repeats: int = 3) -> float:
    """The shortest of `repeats` synchronized runs, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best
