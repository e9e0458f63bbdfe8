"""The fast Program's physical store: the few device copies the Program core's transitions and the model
transactions need (a GDN slot, a KV page, a block-table row, a host replica's state and pages) over the plan's pools.
The host-side accounting (page refcounts, slot and row pools, the host tier) is the Program core's
(`ninfer.program_core`).
"""

from __future__ import annotations

import torch

from ninfer.fast.pools import Pools

PAGE_CHUNK = 64  # pages per gather or scatter of a host replica: 16 MiB of K (or V) on the 9B shape


class DeviceState:
    """The device copies (a `PhysicalStore`): GDN slots (conv windows and S of every GDN layer, and with the MTP
    head the stored hidden h_{t-1}: the backend's slot state moves with the GDN state), KV pages (every attention
    layer's, the MTP layer's included, and a DFlash drafter's context K/V: `Pools.page_pools`), block-table rows.

    Over pipeline stages (docs/pipeline.md) `ranks` holds every rank's pools and each copy fans out to all of them
    (the reference Program's `StagedSlots` / `StagedPages`): a backup, a capture, a resume and a host replica are
    complete only with every stage's state at the same frontier. A replica holds each rank's part in rank order."""

    def __init__(self, ranks: Pools | list[Pools]):
        self.ranks = [ranks] if isinstance(ranks, Pools) else list(ranks)
        self.pools = self.ranks[0]

    def _slot_parts(self, slot: int) -> list[torch.Tensor]:
        """Views of one slot on every rank: conv [n_gdn, conv_dim, K-1], S [n_gdn, HV, dk, dv], then rank 0's MTP
        hidden [H] with the backend."""
        parts = [t for p in self.ranks for t in (p.conv[:, slot], p.ssm[:, slot])]
        if self.pools.mtp_hidden is not None:
            parts.append(self.pools.mtp_hidden[slot])
        return parts

    def _page_pools(self) -> list[torch.Tensor]:
        return [pool for p in self.ranks for pool in p.page_pools()]

    def copy_slot(self, src: int, dst: int) -> None:
        for d, s in zip(self._slot_parts(dst), self._slot_parts(src)):
            d.copy_(s)

    def clear_slot(self, slot: int) -> None:
        for p in self.ranks:
            p.reset_slot(slot)

    def load_slot(self, slot: int) -> tuple[torch.Tensor, ...]:
        """A host replica of one slot (every rank's conv and S, and the MTP hidden with the backend) for the host
        tier, in pinned memory on CUDA so that promoting it back is a direct DMA."""
        return tuple(_host_copy(t) for t in self._slot_parts(slot))

    def store_slot(self, slot: int, state: tuple[torch.Tensor, ...]) -> None:
        for d, s in zip(self._slot_parts(slot), state, strict=True):
            d.copy_(s)

    def copy_page(self, src: int, dst: int) -> None:
        for pool in self._page_pools():
            pool[:, dst].copy_(pool[:, src])  # [n_layers, page_size, nkv, d]

    def load_pages(self, pages: list[int]) -> tuple[torch.Tensor, ...]:
        """Host copies of these pages in every page pool of every rank (K and V, then the drafter's K and V), each
        [len(pages), n_layers, page_size, nkv, d] (page-major, so each chunk's copy is one contiguous DMA), pinned on
        CUDA; PAGE_CHUNK pages at a time so the device temporary stays small."""
        return tuple(self._gather(pool, pages) for pool in self._page_pools())

    def store_pages(self, pages: list[int], data: tuple[torch.Tensor, ...]) -> None:
        pools = self._page_pools()
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
        """Publish a block table to its device row on every rank (entries past len(table) are never read:
        context_lens bound every read). Queued in stream order without waiting (pinned on CUDA: a copy from pageable
        memory first waits for the stream, so a row growing beside a decode round launched ahead would stall the
        host)."""
        if table:
            src = torch.tensor(table, dtype=torch.int32)
            if self.pools.block_tables.is_cuda:
                src = src.pin_memory()
            for p in self.ranks:
                dst = p.block_tables[row, :len(table)]
                dst.copy_(src, non_blocking=dst.is_cuda)

    def read_row(self, row: int, n: int, rank: int = 0) -> list[int]:
        return self.ranks[rank].block_tables[row, :n].tolist()


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
