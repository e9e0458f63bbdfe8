"""The fast Program's physical store: the few device copies the Program core's transitions and the model
transactions need (a GDN slot, a KV page, a block-table row, a host replica's state and pages) over the plan's pools.
The host-side accounting (page refcounts, slot and row pools, the host tier) is the Program core's
(`ninfer.program_core`).
"""

from __future__ import annotations

import torch

from ninfer.fast.memory import Pools

PAGE_CHUNK = 64  # pages per gather or scatter of a host replica: 16 MiB of K (or V) on the 9B shape


class DeviceState:
    """The device copies (a `PhysicalStore`): GDN slots (conv windows and S of every GDN layer, and with the MTP
    head the stored hidden h_{t-1}: the backend's slot state moves with the GDN state), KV pages (every attention
    layer's, the MTP layer's included, and a DFlash drafter's context K/V: `Pools.page_pools`), block-table rows."""

    def __init__(self, pools: Pools):
        self.pools = pools

    def copy_slot(self, src: int, dst: int) -> None:
        self.pools.conv[:, dst].copy_(self.pools.conv[:, src])  # [n_gdn, conv_dim, K-1]
        self.pools.ssm[:, dst].copy_(self.pools.ssm[:, src])  # [n_gdn, HV, dk, dv]
        if self.pools.mtp_hidden is not None:
            self.pools.mtp_hidden[dst].copy_(self.pools.mtp_hidden[src])  # [H]

    def clear_slot(self, slot: int) -> None:
        self.pools.reset_slot(slot)

    def load_slot(self, slot: int) -> tuple[torch.Tensor, ...]:
        """A host replica of one slot (conv [n_gdn, conv_dim, K-1], S [n_gdn, HV, dk, dv], and the MTP hidden [H]
        with the backend) for the host tier, in pinned memory on CUDA so that promoting it back is a direct DMA."""
        parts = [self.pools.conv[:, slot], self.pools.ssm[:, slot]]
        if self.pools.mtp_hidden is not None:
            parts.append(self.pools.mtp_hidden[slot])
        return tuple(_host_copy(t) for t in parts)

    def store_slot(self, slot: int, state: tuple[torch.Tensor, ...]) -> None:
        self.pools.conv[:, slot].copy_(state[0])
        self.pools.ssm[:, slot].copy_(state[1])
        if self.pools.mtp_hidden is not None:
            self.pools.mtp_hidden[slot].copy_(state[2])

    def copy_page(self, src: int, dst: int) -> None:
        for pool in self.pools.page_pools():
            pool[:, dst].copy_(pool[:, src])  # [n_layers, page_size, nkv, d]

    def load_pages(self, pages: list[int]) -> tuple[torch.Tensor, ...]:
        """Host copies of these pages in every page pool (K and V, then the drafter's K and V), each
        [len(pages), n_layers, page_size, nkv, d] (page-major, so each chunk's copy is one contiguous DMA), pinned on
        CUDA; PAGE_CHUNK pages at a time so the device temporary stays small."""
        return tuple(self._gather(pool, pages) for pool in self.pools.page_pools())

    def store_pages(self, pages: list[int], data: tuple[torch.Tensor, ...]) -> None:
        pools = self.pools.page_pools()
        assert len(data) == len(pools), f"a replica of {len(data)} page pools for {len(pools)}"
        for pool, host in zip(pools, data):
            for i in range(0, len(pages), PAGE_CHUNK):
                idx = torch.tensor(pages[i:i + PAGE_CHUNK], dtype=torch.long, device=pool.device)
                chunk = host[i:i + PAGE_CHUNK].to(pool.device, non_blocking=True)  # [c, n_attn, ps, nkv, d]
                pool.index_copy_(1, idx, chunk.transpose(0, 1))

    @staticmethod
    def _gather(pool: torch.Tensor, pages: list[int]) -> torch.Tensor:
        out = _host_empty((len(pages), pool.shape[0], *pool.shape[2:]), pool)
        for i in range(0, len(pages), PAGE_CHUNK):
            idx = torch.tensor(pages[i:i + PAGE_CHUNK], dtype=torch.long, device=pool.device)
            # queued in stream order, the host does not wait (see _host_copy)
            out[i:i + len(idx)].copy_(pool.index_select(1, idx).transpose(0, 1).contiguous(),
                                      non_blocking=pool.is_cuda)
        return out

    def write_row(self, row: int, table: list[int]) -> None:
        """Publish a block table to its device row (entries past len(table) are never read: context_lens bound
        every read). Queued in stream order without waiting (pinned on CUDA: a copy from pageable memory first waits
        for the stream, so a row growing beside a decode round launched ahead would stall the host)."""
        if table:
            src = torch.tensor(table, dtype=torch.int32)
            dst = self.pools.block_tables[row, :len(table)]
            dst.copy_(src.pin_memory() if dst.is_cuda else src, non_blocking=dst.is_cuda)

    def read_row(self, row: int, n: int) -> list[int]:
        return self.pools.block_tables[row, :n].tolist()



def _host_empty(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """A host tensor for a replica of `like`'s data: pinned on CUDA, so that promotion is a direct DMA."""
    return torch.empty(shape, dtype=like.dtype, pin_memory=like.is_cuda)


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """A device-to-host copy queued in stream order without the host waiting for it (a demotion used to wait for every
    queued prefill piece first: 98 ms a copy in the 4-conversation agent benchmark, 11 s of 113 demotions). Safe
    without a sync: the device pages the core frees after it are rewritten only by kernels queued later on the same
    stream, a promotion's host-to-device copy is queued after it too, and the pinned block is held by the caching host
    allocator until the copy's event completes. Nothing reads a replica on the host."""
    out = _host_empty(tuple(t.shape), t)
    out.copy_(t, non_blocking=t.is_cuda)
    return out
