"""The reference Program's stores cut into pipeline stages (docs/pipeline.md): each rank owns a KV plane (its
attention layers' K and V of every page) and GDN state slots (its GDN layers) on its device, over one page
allocator, so a page id or a slot id names the same positions or sequence on every rank.

Every store operation fans out to all ranks: a backup, a checkpoint, a resume and a host replica are complete only
with every stage's state at the same frontier. The speculative backend's state lives on rank 0 (MTP stays there).
`StagedPages` and `StagedSlots` offer `KVPages`' and `StateSlots`' operations, so the executor and `TensorStore`
drive them unchanged.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.pages import PageAllocator
from ninfer.pipeline import StagePlan
from ninfer.reference.state import GDNState, KVCache

from .stores import KVPages, StateSlots


class StagedPages:
    """One KV plane per rank, bound to its device; one allocator for all."""

    def __init__(self, cfg: Qwen35Config, plan: StagePlan, num_pages: int, page_size: int, dtype: torch.dtype):
        self.alloc = PageAllocator(num_pages)
        self.page_size = page_size
        self.layers = tuple(cfg.attention_layers)
        self.planes = [KVPages(cfg, num_pages, page_size, dtype, layers=plan.owned(rank, cfg.attention_layers),
                               alloc=self.alloc, device=device) for rank, device in enumerate(plan.devices)]

    def gather(self, table: list[int], length: int) -> dict[int, KVCache]:
        """Every attention layer's cache, each on its rank's device."""
        out: dict[int, KVCache] = {}
        for plane in self.planes:
            out.update(plane.gather(table, length))
        return out

    def write(self, table: list[int], caches: dict[int, KVCache], start: int, end: int) -> None:
        for plane in self.planes:
            plane.write(table, caches, start, end)

    def copy_page(self, src: int, dst: int) -> None:
        for plane in self.planes:
            plane.copy_page(src, dst)

    def load(self, table: list[int]) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        """Private copies of these pages on every plane, in rank order."""
        return tuple(plane.load(table) for plane in self.planes)

    def store(self, table: list[int], data: tuple[tuple[torch.Tensor, torch.Tensor], ...]) -> None:
        for plane, part in zip(self.planes, data, strict=True):
            plane.store(table, part)


class StagedSlots:
    """One set of GDN state slots per rank (its GDN layers, on its device); the backend state on rank 0."""

    def __init__(self, cfg: Qwen35Config, plan: StagePlan, total: int, dtype: torch.dtype,
                 backend_empty: Callable[[], Any] | None = None):
        self.layers = tuple(cfg.linear_layers)
        self.ranks = [StateSlots(cfg, total, dtype, backend_empty if rank == 0 else None,
                                 layers=plan.owned(rank, cfg.linear_layers), device=device)
                      for rank, device in enumerate(plan.devices)]

    def load(self, slot: int) -> dict[int, GDNState]:
        out: dict[int, GDNState] = {}
        for r in self.ranks:
            out.update(r.load(slot))
        return out

    def store(self, slot: int, gdn: dict[int, GDNState]) -> None:
        for r in self.ranks:
            r.store(slot, gdn)

    def load_backend(self, slot: int) -> Any | None:
        return self.ranks[0].load_backend(slot)

    def store_backend(self, slot: int, state: Any | None) -> None:
        self.ranks[0].store_backend(slot, state)

    def clear(self, slot: int) -> None:
        for r in self.ranks:
            r.clear(slot)

    def copy(self, src: int, dst: int) -> None:
        for r in self.ranks:
            r.copy(src, dst)
