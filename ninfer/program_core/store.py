"""The physical-store interface the core drives, and the id pools and host tier that both Programs account with.

The core decides which slot, page or row moves; a `PhysicalStore` moves the bytes (CPU tensors in the reference
Program, the planned device pools in the fast one). Slot states are opaque to the core: it only carries what
`load_slot` returns to the host tier and hands it back to `store_slot`.
"""

from __future__ import annotations

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


class HostTier:
    """Host copies of inactive checkpoints' GDN state, within a byte budget (KV pages stay in the pool)."""

    def __init__(self, budget: int, state_bytes: int):
        self.budget, self.state_bytes = budget, state_bytes
        self.entries: dict[int, Any] = {}  # checkpoint id value -> what the store's load_slot returned

    @property
    def used(self) -> int:
        return len(self.entries) * self.state_bytes

    def fits(self) -> bool:
        return self.used + self.state_bytes <= self.budget
