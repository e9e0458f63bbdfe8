"""Host-side accounting over the plan's device pools: page refcounts, free state slots and block-table rows, the
host tier, and the few device copies the transitions need (a GDN slot, a KV page, a block-table row).

Pages are counted with the allocator both Programs share (`ninfer.models.qwen3_5.pages`).
"""

from __future__ import annotations

import torch

from ninfer.fast.memory import Pools


class IdPool:
    """A fixed set of ids (state slots, block-table rows), each owned once or free."""

    def __init__(self, total: int, what: str):
        self.total, self.what = total, what
        self.free = list(range(total - 1, -1, -1))

    def take(self) -> int:
        if not self.free:
            raise RuntimeError(f"{self.what} pool exhausted")
        return self.free.pop()

    def give(self, i: int) -> None:
        assert i not in self.free, f"{self.what} {i} freed twice"
        self.free.append(i)


class DeviceState:
    """The device copies: GDN slots (conv windows and S of every GDN layer), KV pages, block-table rows."""

    def __init__(self, pools: Pools):
        self.pools = pools

    def copy_slot(self, src: int, dst: int) -> None:
        self.pools.conv[:, dst].copy_(self.pools.conv[:, src])  # [n_gdn, conv_dim, K-1]
        self.pools.ssm[:, dst].copy_(self.pools.ssm[:, src])  # [n_gdn, HV, dk, dv]

    def clear_slot(self, slot: int) -> None:
        self.pools.reset_slot(slot)

    def load_slot(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A host copy of one slot (conv [n_gdn, conv_dim, K-1], S [n_gdn, HV, dk, dv]) for the host tier."""
        return self.pools.conv[:, slot].to("cpu", copy=True), self.pools.ssm[:, slot].to("cpu", copy=True)

    def store_slot(self, slot: int, state: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.pools.conv[:, slot].copy_(state[0])
        self.pools.ssm[:, slot].copy_(state[1])

    def copy_page(self, src: int, dst: int) -> None:
        self.pools.k[:, dst].copy_(self.pools.k[:, src])  # [n_attn, page_size, nkv, d]
        self.pools.v[:, dst].copy_(self.pools.v[:, src])

    def write_row(self, row: int, table: list[int]) -> None:
        """Publish a block table to its device row (entries past len(table) are never read: context_lens bound
        every read)."""
        if table:
            src = torch.tensor(table, dtype=torch.int32)
            self.pools.block_tables[row, :len(table)].copy_(src)

    def read_row(self, row: int, n: int) -> list[int]:
        return self.pools.block_tables[row, :n].tolist()


class HostTier:
    """Host copies of inactive checkpoints' GDN state, within a byte budget (KV pages stay in the pool)."""

    def __init__(self, budget: int, state_bytes: int):
        self.budget, self.state_bytes = budget, state_bytes
        self.entries: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # checkpoint id value -> (conv, S)

    @property
    def used(self) -> int:
        return len(self.entries) * self.state_bytes

    def fits(self) -> bool:
        return self.used + self.state_bytes <= self.budget
