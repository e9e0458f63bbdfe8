"""Refcounted page pool and slot pool: the physical facts of the ToyProgram (pure Python)."""

from __future__ import annotations


class PagePool:
    def __init__(self, total: int):
        self.total = total
        self.free = list(range(total - 1, -1, -1))  # pop() hands out low ids first
        self.refs: dict[int, int] = {}

    @property
    def available(self) -> int:
        return len(self.free)

    def take(self) -> int:
        if not self.free:
            raise RuntimeError("page pool exhausted despite reservation")
        page = self.free.pop()
        self.refs[page] = 1
        return page

    def ref(self, page: int) -> None:
        assert self.refs.get(page, 0) > 0, f"ref of free page {page}"
        self.refs[page] += 1

    def unref(self, page: int) -> None:
        n = self.refs[page] - 1
        if n:
            self.refs[page] = n
        else:
            del self.refs[page]
            self.free.append(page)


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
