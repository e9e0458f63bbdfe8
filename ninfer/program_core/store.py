"""The physical-store interface the core drives, and the id pools and host tier that both Programs account with.

The core decides which slot, page or row moves; a `PhysicalStore` moves the bytes (CPU tensors in the reference
Program, the planned device pools in the fast one). Slot states are opaque to the core: it only carries what
`load_slot` and `load_pages` return to the host tier and hands them back to `store_slot` and `store_pages`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class PhysicalStore(Protocol):
    """Where GDN state slots, KV pages and block-table rows physically live."""

    def clear_slot(self, slot: int) -> None:
        """The state before any token."""

    def copy_slot(self, src: int, dst: int) -> None: ...

    def load_slot(self, slot: int) -> Any:
        """A private host copy of the slot's state, for the host tier."""

    def store_slot(self, slot: int, state: Any) -> None: ...

    def copy_page(self, src: int, dst: int) -> None: ...

    def load_pages(self, pages: list[int]) -> Any:
        """A private host copy of these KV pages' contents, in order, for the host tier."""

    def store_pages(self, pages: list[int], data: Any) -> None:
        """Write what `load_pages` returned into these pages (as many, in the same order)."""

    def write_row(self, row: int | None, table: list[int]) -> None:
        """Publish a block table to its row; a store without rows (the model gathers the table) ignores it."""


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


@dataclass(frozen=True)
class Replica:
    """A complete host copy of one checkpoint: its GDN state and every KV page of its block table, in table order
    (never only the pages an ancestor does not share: an ancestor may be deleted while the replica stays)."""

    state: Any  # what the store's load_slot returned
    pages: Any  # what the store's load_pages returned for the checkpoint's table
    n_pages: int
    nbytes: int


class HostTier:
    """Host replicas of inactive checkpoints (GDN state and KV pages), within a byte budget
    (`--kv-offloading-size`): entries are made per replica, never allocated up front."""

    def __init__(self, budget: int, state_bytes: int, page_bytes: int):
        self.budget, self.state_bytes, self.page_bytes = budget, state_bytes, page_bytes
        self.entries: dict[int, Replica] = {}  # checkpoint id value -> its replica

    def bytes_for(self, n_pages: int) -> int:
        return self.state_bytes + n_pages * self.page_bytes

    @property
    def used(self) -> int:
        return sum(r.nbytes for r in self.entries.values())

    def fits(self, n_pages: int) -> bool:
        return self.used + self.bytes_for(n_pages) <= self.budget
