"""The reference Program's physical stores: a refcounted KV page pool and GDN state slots as CPU tensors, and the
`TensorStore` that offers both to the shared Program core (`ninfer.program_core.PhysicalStore`).

KV pages are real tensors, so sharing a page by reference and copying a partial page are real operations, not
bookkeeping only: a sequence reads its KV by gathering its block table and writes new positions into its own pages.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.pages import PageAllocator
from ninfer.reference.state import GDNState, KVCache

__all__ = ["TensorStore", "KVPages", "StateSlots"]


class KVPages:
    """K/V storage by page: k[p, layer, kv_head, offset, d] holds position `j * page_size + offset` of the
    sequence whose block table names page p at index j."""

    def __init__(self, cfg: Qwen35Config, num_pages: int, page_size: int, dtype: torch.dtype,
                 layers: tuple[int, ...] | None = None, alloc: PageAllocator | None = None, device: str = "cpu"):
        """`layers` (default: every attention layer), `alloc` and `device`: one pipeline stage's plane over the
        allocator all planes share (`stages.StagedPages`)."""
        self.layers = tuple(cfg.attention_layers) if layers is None else layers
        self.page_size = page_size
        shape = (num_pages, len(self.layers), cfg.num_key_value_heads, page_size, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.alloc = PageAllocator(num_pages) if alloc is None else alloc

    def gather(self, table: list[int], length: int) -> dict[int, KVCache]:
        """Positions < length of the block table as contiguous per-layer caches [nkv, length, d]."""
        idx = torch.tensor(table, dtype=torch.long)
        n, L = len(table), len(self.layers)
        _, _, nkv, ps, d = self.k.shape
        k = self.k[idx].permute(1, 2, 0, 3, 4).reshape(L, nkv, n * ps, d)[:, :, :length]  # [L, nkv, length, d]
        v = self.v[idx].permute(1, 2, 0, 3, 4).reshape(L, nkv, n * ps, d)[:, :, :length]
        return {layer: KVCache(k[i].clone(), v[i].clone()) for i, layer in enumerate(self.layers)}

    def write(self, table: list[int], caches: dict[int, KVCache], start: int, end: int) -> None:
        """Copy positions [start, end) of the contiguous caches into the table's pages."""
        ps = self.page_size
        for j in range(start // ps, -(-end // ps)):
            lo, hi = max(start, j * ps), min(end, (j + 1) * ps)
            for i, layer in enumerate(self.layers):
                self.k[table[j], i, :, lo - j * ps:hi - j * ps] = caches[layer].k[:, lo:hi]
                self.v[table[j], i, :, lo - j * ps:hi - j * ps] = caches[layer].v[:, lo:hi]

    def copy_page(self, src: int, dst: int) -> None:
        self.k[dst] = self.k[src]
        self.v[dst] = self.v[src]

    def load(self, table: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Private copies of these pages' K and V, each [len(table), L, nkv, page_size, d]."""
        idx = torch.tensor(table, dtype=torch.long)
        return self.k[idx].clone(), self.v[idx].clone()

    def store(self, table: list[int], data: tuple[torch.Tensor, torch.Tensor]) -> None:
        idx = torch.tensor(table, dtype=torch.long)
        self.k[idx], self.v[idx] = data


class StateSlots:
    """A fixed number of GDN state slots (the allocatable ones, then one backup per lane: which is free is the
    Program core's); slot s holds every GDN layer's conv window and recurrent state, and with a speculative
    backend that backend's state (anything with `clone()`: the MTP state, the drafter's context)."""

    def __init__(self, cfg: Qwen35Config, total: int, dtype: torch.dtype,
                 backend_empty: Callable[[], Any] | None = None, layers: tuple[int, ...] | None = None,
                 device: str = "cpu"):
        """`layers` (default: every GDN layer) and `device`: one pipeline stage's slots (`stages.StagedSlots`)."""
        self.layers = tuple(cfg.linear_layers) if layers is None else layers
        # a slot also holds the backend's state: a checkpoint, a backup and a host replica are complete only with
        # the backend's state at the same frontier
        self._backend_empty = backend_empty
        self.backend: list[Any | None] = [None] * total
        n, K = len(self.layers), cfg.linear_conv_kernel_dim
        s_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        self.conv = torch.zeros(total, n, cfg.conv_dim, K - 1, dtype=dtype, device=device)  # [slots, n, conv_dim, K-1]
        self.recurrent = torch.zeros(total, n, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                                     cfg.linear_value_head_dim, dtype=s_dtype, device=device)  # [slots, n, HV, dk, dv]

    def load(self, slot: int) -> dict[int, GDNState]:
        """A private copy of the slot's state, for the model to advance."""
        return {layer: GDNState(self.conv[slot, i].clone(), self.recurrent[slot, i].clone())
                for i, layer in enumerate(self.layers)}

    def store(self, slot: int, gdn: dict[int, GDNState]) -> None:
        for i, layer in enumerate(self.layers):
            self.conv[slot, i] = gdn[layer].conv
            self.recurrent[slot, i] = gdn[layer].recurrent

    def load_backend(self, slot: int) -> Any | None:
        """A private copy of the slot's backend state (None without a backend)."""
        m = self.backend[slot]
        return None if m is None else m.clone()

    def store_backend(self, slot: int, state: Any | None) -> None:
        self.backend[slot] = state

    def clear(self, slot: int) -> None:
        """The state before any token: zero conv windows and recurrent state, an empty backend state."""
        self.conv[slot].zero_()
        self.recurrent[slot].zero_()
        self.backend[slot] = None if self._backend_empty is None else self._backend_empty()

    def copy(self, src: int, dst: int) -> None:
        self.conv[dst] = self.conv[src]
        self.recurrent[dst] = self.recurrent[src]
        self.backend[dst] = self.load_backend(src)


class TensorStore:
    """The physical store the Program core drives: slots and pages as above; block-table rows are ids only, since
    the model gathers each sequence's table itself."""

    def __init__(self, pages: KVPages, slots: StateSlots):
        self.pages, self.slots = pages, slots

    def clear_slot(self, slot: int) -> None:
        self.slots.clear(slot)

    def copy_slot(self, src: int, dst: int) -> None:
        self.slots.copy(src, dst)

    def load_slot(self, slot: int) -> tuple[dict[int, GDNState], Any | None]:
        return self.slots.load(slot), self.slots.load_backend(slot)

    def store_slot(self, slot: int, state: tuple[dict[int, GDNState], Any | None]) -> None:
        self.slots.store(slot, state[0])
        self.slots.store_backend(slot, None if state[1] is None else state[1].clone())

    def copy_page(self, src: int, dst: int) -> None:
        self.pages.copy_page(src, dst)

    def load_pages(self, pages: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pages.load(pages)

    def store_pages(self, pages: list[int], data: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.pages.store(pages, data)

    def write_row(self, row: int | None, table: list[int]) -> None:
        """No rows: the block table travels with the sequence."""
