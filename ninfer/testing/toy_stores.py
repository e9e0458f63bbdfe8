"""The ToyProgram's physical facts: the Programs' shared refcounted page allocator, and a slot pool."""

from __future__ import annotations

from ninfer.models.qwen3_5.pages import PageAllocator as PagePool

__all__ = ["PagePool", "SlotPool"]


class SlotPool:
    def __init__(self, total: int):
        self.total = total
        self.free = list(range(total - 1, -1, -1))

    def take(self) -> int:
        if not self.free:
            raise RuntimeError("state slot pool exhausted")
        return self.free.pop()

    def give(self, slot: int) -> None:
        assert slot not in self.free, f"slot {slot} freed twice"
        self.free.append(slot)
