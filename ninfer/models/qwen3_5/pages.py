"""The refcounted KV page allocator both Programs (and the ToyProgram) account pages with.

It lives beside the capacity queries because the two Programs must share it and may not import each other.
"""

from __future__ import annotations


class PageAllocator:
    """Page ids with refcounts; a page is free exactly when nobody references it."""

    def __init__(self, total: int):
        self.total = total
        self.free = list(range(total - 1, -1, -1))  # pop() hands out low ids first
        self.refs: dict[int, int] = {}

    @property
    def available(self) -> int:
        return len(self.free)

    def take(self) -> int:
        if not self.free:
            raise RuntimeError("KV page pool exhausted despite the reservation")
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
