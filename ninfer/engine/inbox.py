"""The submission inbox: accepted requests cross from any submitting thread to the Engine worker here.

Closing is atomic with respect to `put_all`: a submission is either refused (the inbox is closed, the caller gets a
request-level rejection) or it lies in the inbox until the worker, or the failure cleanup, takes it. Whatever the
interleaving of a submit with a failure or a shutdown, no accepted request is left without its terminal event.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Inbox(Generic[T]):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: deque[T] = deque()
        self._closed: str | None = None

    def put_all(self, items: list[T]) -> str | None:
        """Append all of them unless closed; returns None when accepted, else why the inbox is closed."""
        with self._lock:
            if self._closed is not None:
                return self._closed
            self._items.extend(items)
            return None

    def take_all(self) -> list[T]:
        with self._lock:
            items = list(self._items)
            self._items.clear()
            return items

    def close(self, reason: str) -> None:
        """Refuse every later put; what is already inside stays for `take_all` (the first reason is kept)."""
        with self._lock:
            if self._closed is None:
                self._closed = reason

    @property
    def closed(self) -> str | None:
        return self._closed

    def __len__(self) -> int:
        return len(self._items)
