"""The reference Program's physical stores: a refcounted KV page pool and GDN state slots as CPU tensors, and the
`TensorStore` that offers both to the shared Program core (`ninfer.program_core.PhysicalStore`).

KV pages are real tensors, so sharing a page by reference and copying a partial page are real operations, not
bookkeeping only: a sequence reads its KV by gathering its block table and writes new positions into its own pages.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ninfer.models.qwen3_5.config import Qwen35Config
from ninfer.models.qwen3_5.pages import PageAllocator
from ninfer.reference.state import GDNState, KVCache

__all__ = ["MTPState", "TensorStore", "KVPages", "StateSlots"]


@dataclass
class MTPState:
    """The MTP backend's state at frontier t: each MTP layer's KV over the pairs (h_p, x_{p+1}) for p < t - 1,
    and the target's final-normed hidden h_{t-1} that the next pair (with the pending token) starts from."""

    kv: list[KVCache]
    hidden: torch.Tensor | None  # [H], None before any token

    def clone(self) -> "MTPState":
        return MTPState([c.clone() for c in self.kv], None if self.hidden is None else self.hidden.clone())


class KVPages:
    """K/V storage by page: k[p, layer, kv_head, offset, d] holds position `j * page_size + offset` of the
    sequence whose block table names page p at index j."""

    def __init__(self, cfg: Qwen35Config, num_pages: int, page_size: int, dtype: torch.dtype):
        self.layers = tuple(cfg.attention_layers)
        self.page_size = page_size
        shape = (num_pages, len(self.layers), cfg.num_key_value_heads, page_size, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype)
        self.v = torch.zeros(shape, dtype=dtype)
        self.alloc = PageAllocator(num_pages)

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
    Program core's); slot s holds every GDN layer's conv window and recurrent state."""

    def __init__(self, cfg: Qwen35Config, total: int, dtype: torch.dtype, mtp: bool = False):
        self.layers = tuple(cfg.linear_layers)
        # with the MTP backend, a slot also holds its MTP state: a checkpoint, a backup and a host replica are
        # complete only with the backend's state at the same frontier
        kv = (cfg.num_key_value_heads, 0, cfg.head_dim)
        self._empty_mtp = MTPState([KVCache(torch.zeros(kv, dtype=dtype), torch.zeros(kv, dtype=dtype))
                                    for _ in range(cfg.mtp_num_hidden_layers)], None) if mtp else None
        self.mtp: list[MTPState | None] = [None] * total
        n, K = len(self.layers), cfg.linear_conv_kernel_dim
        s_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        self.conv = torch.zeros(total, n, cfg.conv_dim, K - 1, dtype=dtype)  # [slots, n, conv_dim, K-1]
        self.recurrent = torch.zeros(total, n, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                                     cfg.linear_value_head_dim, dtype=s_dtype)  # [slots, n, HV, dk, dv]

    def load(self, slot: int) -> dict[int, GDNState]:
        """A private copy of the slot's state, for the model to advance."""
        return {layer: GDNState(self.conv[slot, i].clone(), self.recurrent[slot, i].clone())
                for i, layer in enumerate(self.layers)}

    def store(self, slot: int, gdn: dict[int, GDNState]) -> None:
        for i, layer in enumerate(self.layers):
            self.conv[slot, i] = gdn[layer].conv
            self.recurrent[slot, i] = gdn[layer].recurrent

    def load_mtp(self, slot: int) -> MTPState | None:
        """A private copy of the slot's MTP state (None without the backend)."""
        m = self.mtp[slot]
        return None if m is None else m.clone()

    def store_mtp(self, slot: int, state: MTPState | None) -> None:
        self.mtp[slot] = state

    def clear(self, slot: int) -> None:
        """The state before any token: zero conv windows and recurrent state, an empty MTP state."""
        self.conv[slot].zero_()
        self.recurrent[slot].zero_()
        self.mtp[slot] = None if self._empty_mtp is None else self._empty_mtp.clone()

    def copy(self, src: int, dst: int) -> None:
        self.conv[dst] = self.conv[src]
        self.recurrent[dst] = self.recurrent[src]
        self.mtp[dst] = self.load_mtp(src)


class TensorStore:
    """The physical store the Program core drives: slots and pages as above; block-table rows are ids only, since
    the model gathers each sequence's table itself."""

    def __init__(self, pages: KVPages, slots: StateSlots):
        self.pages, self.slots = pages, slots

    def clear_slot(self, slot: int) -> None:
        self.slots.clear(slot)

    def copy_slot(self, src: int, dst: int) -> None:
        self.slots.copy(src, dst)

    def load_slot(self, slot: int) -> tuple[dict[int, GDNState], MTPState | None]:
        return self.slots.load(slot), self.slots.load_mtp(slot)

    def store_slot(self, slot: int, state: tuple[dict[int, GDNState], MTPState | None]) -> None:
        self.slots.store(slot, state[0])
        self.slots.store_mtp(slot, None if state[1] is None else state[1].clone())

    def copy_page(self, src: int, dst: int) -> None:
        self.pages.copy_page(src, dst)

    def load_pages(self, pages: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pages.load(pages)

    def store_pages(self, pages: list[int], data: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.pages.store(pages, data)

    def write_row(self, row: int | None, table: list[int]) -> None:
        """No rows: the block table travels with the sequence."""
