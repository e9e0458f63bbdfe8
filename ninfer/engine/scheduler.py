"""Scheduler: FIFO head, staged prefill, fair gates, exact-B decode rounds, protected head with backfill.

Pure Python over ints and sets; it never reads checkpoint payloads, victim lists or allocator state. It decides
*which* request may be tried and *which* execution unit runs next; the ResourceManager chooses resources and the
Program proves feasibility.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Unit:
    """One model execution unit per worker boundary."""

    kind: str  # "control" | "prefill" | "decode"
    requests: tuple[int, ...]  # control/prefill: one request; decode: every decode-ready request, lane order
    riding: int | None = None  # decode: the staged-prefill request whose next chunk rides in the round's pass


class Scheduler:
    def __init__(self, *, concurrent_prefill: bool = False, mixed: bool = False):
        self.concurrent_prefill = concurrent_prefill
        self.mixed = mixed  # staged prefill chunks ride on decode rounds instead of alternating with them
        self.waiting: deque[int] = deque()
        self.staged_prefill: deque[int] = deque()  # round-robin order of requests in Prefill
        self.decode_ready: dict[int, int] = {}  # request -> lane (decode rows follow lane order)
        self.control_ready: deque[int] = deque()
        self.protected_head: int | None = None
        self.donors: frozenset[int] = frozenset()
        self.admission_dirty = True
        self._last_kind = ""

    def enqueue(self, rid: int) -> None:
        self.waiting.append(rid)
        self.admission_dirty = True

    def remove_waiting(self, rid: int) -> None:
        """Cancellation, queue timeout, rejection or admission of a waiting request."""
        was_head = bool(self.waiting) and self.waiting[0] == rid
        self.waiting.remove(rid)
        if self.protected_head == rid:
            self.clear_protection()
        if was_head:
            self.admission_dirty = True

    def head(self) -> int | None:
        return self.waiting[0] if self.waiting else None

    def note_trigger(self) -> None:
        """A fact that can change the admission verdict: lane released, transition settled, revision changed."""
        self.admission_dirty = True

    def admission_allowed(self, topology_open: bool) -> bool:
        if not self.waiting or not self.admission_dirty or topology_open:
            return False
        return self.concurrent_prefill or not self.staged_prefill

    def admission_settled(self) -> None:
        """The last attempt reached a verdict; wait for the next trigger before trying again."""
        self.admission_dirty = False

    def protect_head(self, rid: int, donors: frozenset[int]) -> None:
        """Record the blocked head and the incumbents that must end for it. The donor set is fixed when the head
        is first blocked: requests admitted later are borrowers, proven never to be needed as donors."""
        assert self.waiting and self.waiting[0] == rid, "only the FIFO head can be protected"
        if self.protected_head != rid:
            self.protected_head, self.donors = rid, donors

    def clear_protection(self) -> None:
        self.protected_head, self.donors = None, frozenset()

    def start_prefill(self, rid: int) -> None:
        self.staged_prefill.append(rid)

    def set_decode_ready(self, rid: int, lane: int) -> None:
        self._drop_staged(rid)
        if rid in self.control_ready:
            self.control_ready.remove(rid)
        self.decode_ready[rid] = lane

    def set_control_ready(self, rid: int) -> None:
        self._drop_staged(rid)
        self.decode_ready.pop(rid, None)
        if rid not in self.control_ready:
            self.control_ready.append(rid)

    def leave_active(self, rid: int) -> None:
        """The request reached TerminalPending: it takes part in no further unit."""
        self._drop_staged(rid)
        self.decode_ready.pop(rid, None)
        if rid in self.control_ready:
            self.control_ready.remove(rid)
        if rid in self.donors:
            self.donors = self.donors - {rid}

    def _drop_staged(self, rid: int) -> None:
        if rid in self.staged_prefill:
            self.staged_prefill.remove(rid)
            self.admission_dirty = True  # the staged-prefill set changed

    def next_unit(self) -> Unit | None:
        """Control first (it is short and blocks its request). When both have work, a staged prefill's chunk rides
        on each decode round (`mixed`), or prefill and decode alternate, so consecutive prefill never starves
        decode and a long decode phase never starves a staged prefill."""
        if self.control_ready:
            self._last_kind = "control"
            return Unit("control", (self.control_ready[0],))
        if self.mixed and self.staged_prefill and self.decode_ready:
            self._last_kind = "decode"
            return Unit("decode", self._rows(), riding=self._next_staged())
        want_prefill = bool(self.staged_prefill) and (not self.decode_ready or self._last_kind != "prefill")
        if want_prefill:
            self._last_kind = "prefill"
            return Unit("prefill", (self._next_staged(),))
        if self.decode_ready:
            self._last_kind = "decode"
            return Unit("decode", self._rows())
        return None

    def _rows(self) -> tuple[int, ...]:
        """Every decode-ready request, in lane order."""
        return tuple(sorted(self.decode_ready, key=self.decode_ready.__getitem__))

    def _next_staged(self) -> int:
        """The staged prefill whose chunk runs next: one lane's chunk per boundary, round robin."""
        rid = self.staged_prefill[0]
        self.staged_prefill.rotate(-1)
        return rid

    def check_invariants(self) -> None:
        staged, ready, control = set(self.staged_prefill), set(self.decode_ready), set(self.control_ready)
        waiting = set(self.waiting)
        assert len(waiting) == len(self.waiting), "a request waits twice"
        assert len(staged) == len(self.staged_prefill), "a request is staged twice"
        assert not (staged & ready) and not (staged & control) and not (ready & control), "overlapping unit sets"
        assert not (waiting & (staged | ready | control)), "a waiting request is also active"
        assert len(set(self.decode_ready.values())) == len(self.decode_ready), "two decode rows share a lane"
        if not self.concurrent_prefill:
            assert len(staged) <= 1, "more than one staged prefill without concurrent_prefill"
        if self.protected_head is not None:
            assert self.waiting and self.waiting[0] == self.protected_head, "protected head is not the FIFO head"
        else:
            assert not self.donors, "donors without a protected head"
