"""ProgramWatch: the harness's independent view of what the Engine asked of the Program, boundary by boundary.

FaultyProgram reports every call here; the harness opens each worker boundary with `begin_boundary` (which
requests it cancelled, and which passed their deadline or queue timeout, before that boundary). From the calls
alone, never from the Engine's own tables, it checks seed rules and records each broken one in `violations`:

- the worker-boundary order: per boundary the phases advance-open-transition -> settle (capture, retain, release,
  delete) -> admit (materialize, backfill proofs) -> run one unit -> commit it, never backwards; at most one model
  unit and one batch consumption per boundary; never a transition started while another is open;
- the cancellation snapshot: no request cancelled or expired before a boundary takes part in its unit, and no
  waiting request cancelled or expired before a boundary starts materializing in it;
- a cancellation while materializing aborts the transaction (it is never advanced again);
- a decode round holds exactly the decode-ready sequences (exact B), and decode is not starved: never two prefill
  units in a row while a sequence is decode-ready;
- the FIFO head: a request starts materializing only as the earliest still-waiting request, or as a borrower the
  Program proved harmless to that head in the same boundary.

It also keeps what the harness needs for its end-of-request checks: which requests were retained, which were
settled (their retain or release came back), which checkpoint each retain published.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ninfer.contracts import PendingBatch, ResourceResult, RunningTransaction, TransitionKind

_PHASE = {"advance": 2, "settle": 3, "admit": 5, "run": 7, "commit": 8}
_SETTLE = (TransitionKind.CAPTURE, TransitionKind.RETAIN, TransitionKind.RELEASE, TransitionKind.DELETE,
           TransitionKind.PLACE)


@dataclass
class _Txn:
    kind: TransitionKind
    rid: int | None
    phase: str
    boundary: int
    handle: Any = None


@dataclass
class ProgramWatch:
    # harness callbacks: the earliest accepted requests still waiting before `rid` (in submit order), and whether
    # a sequence's request is excused from the next decode round (it needs forced control, or was cancelled)
    waiting_before: Callable[[int], list[int]] = lambda rid: []
    excused: Callable[[int], bool] = lambda rid: False
    engine_ok: Callable[[], bool] = lambda: True  # False once the Engine failed: its cleanup follows no order
    violations: list[str] = field(default_factory=list)
    boundary: int = 0
    retained: set[int] = field(default_factory=set)
    settled: set[int] = field(default_factory=set)
    started: set[int] = field(default_factory=set)  # requests whose materialization started
    published_by: dict[Any, int] = field(default_factory=dict)  # checkpoint id -> request that retained it
    _phases: list[str] = field(default_factory=list)
    _open: dict[int, _Txn] = field(default_factory=dict)
    _rid_of: dict[Any, int] = field(default_factory=dict)  # sequence handle -> request
    _ready: set[Any] = field(default_factory=set)  # handles whose last committed row was not terminal
    _proven: set[int] = field(default_factory=set)  # borrowers proven this boundary
    _heads: dict[int, int] = field(default_factory=dict)  # borrower -> the head its proof protected
    _last_unit: tuple[str, bool] = ("", False)  # (kind, some sequence was decode-ready then)
    _cancelled: frozenset[int] = frozenset()
    _ended: frozenset[int] = frozenset()
    _must_abort: set[int] = field(default_factory=set)
    _live = True

    def begin_boundary(self, cancelled: frozenset[int], expired: frozenset[int]) -> None:
        self.boundary += 1
        self._phases, self._proven, self._heads = [], set(), {}
        self._cancelled, self._ended = cancelled, cancelled | expired
        for txn_id, t in self._open.items():
            if t.kind is TransitionKind.MATERIALIZE and t.rid in cancelled:
                self._must_abort.add(txn_id)

    def stop_checking(self) -> None:
        """The Engine failed: its cleanup calls follow no boundary order."""
        self._live = False

    def violate(self, what: str) -> None:
        self.violations.append(f"boundary {self.boundary}: {what}")

    def before(self, name: str, args: tuple) -> None:
        self._live = self._live and self.engine_ok()
        if not self._live:
            return
        if name == "plan":
            self._phase("admit" if args[0].kind is TransitionKind.MATERIALIZE else "settle")
        elif name == "start":
            self._phase("admit" if args[0].choice.kind is TransitionKind.MATERIALIZE else "settle")
            if self._open:
                self.violate(f"a {args[0].choice.kind.value} transition started while one is open")
        elif name in ("advance", "abort"):
            self._before_advance(name, args[0])
        elif name == "backfill_feasible":
            self._phase("admit")
        elif name in ("prefill", "decode", "control"):
            self._before_unit(name, args[0], args[2] if name == "decode" and len(args) > 2 else None)
        elif name in ("commit", "abort_pending"):
            self._phase("commit")
            if self._phases.count("commit") > 1:
                self.violate("two batches consumed in one boundary")
            if name == "commit":
                self._check_accepted(args[0], args[1])

    def after(self, name: str, args: tuple, out: Any) -> None:
        if name == "start" and isinstance(out, RunningTransaction):
            choice = args[0].choice
            self._open[out.txn_id] = _Txn(choice.kind, choice.request_id, self._phases[-1] if self._phases
                                          else "admit", self.boundary, choice.handle)
            if choice.kind is TransitionKind.MATERIALIZE and self._live:
                self._check_fifo(choice.request_id)
                self.started.add(choice.request_id)
        elif name == "backfill_feasible" and out:
            self._proven.add(args[2].request_id)
            self._heads[args[2].request_id] = args[0].request_id
        elif name in ("advance", "abort") and isinstance(out, ResourceResult):
            self._result(self._open.pop(args[0].txn_id, None), out)
        elif name == "commit":
            self._commit(args[0], args[1])

    def _phase(self, phase: str) -> None:
        if self._phases and _PHASE[phase] < _PHASE[self._phases[-1]]:
            self.violate(f"phase {phase} after {self._phases[-1]} (order {self._phases + [phase]})")
        self._phases.append(phase)

    def _before_advance(self, name: str, txn: RunningTransaction) -> None:
        t = self._open.get(txn.txn_id)
        started_here = t is not None and t.boundary == self.boundary
        self._phase(t.phase if started_here else "advance")
        if name == "advance" and txn.txn_id in self._must_abort:
            self.violate(f"the materialization of cancelled request {t.rid if t else '?'} advanced, not aborted")

    def _before_unit(self, name: str, target: Any, chunk: Any = None) -> None:
        """`chunk`: the PrefillChunk a decode round carries (a mixed unit), else None."""
        self._phase("run")
        if self._phases.count("run") > 1:
            self.violate("two model units in one boundary")
        handles = list(target) if name == "decode" else [target]
        if chunk is not None:
            if chunk.handle in self._ready or chunk.handle in handles:
                self.violate(f"a decode round carries the prefill of {chunk.handle}, which is decode-ready")
            handles = handles + [chunk.handle]
        for h in handles:
            if self._rid_of.get(h) in self._ended:
                self.violate(f"request {self._rid_of[h]} ran in a unit after it was cancelled or expired")
        live_ready = {h for h in self._ready if not self.excused(self._rid_of.get(h, -1))}
        if name == "decode":
            rows = set(handles) - ({chunk.handle} if chunk is not None else set())
            if not rows <= self._ready:
                self.violate(f"decode round holds sequences that are not decode-ready: {rows - self._ready}")
            if not live_ready <= set(handles):
                self.violate(f"decode round left out decode-ready sequences {live_ready - set(handles)}")
            if len(handles) != len(set(handles)):
                self.violate(f"decode round names a sequence more than once: {handles}")
        if name == "prefill" and live_ready and self._last_unit == ("prefill", True):
            self.violate("two prefill units in a row while decode work was ready: decode starved")
        self._last_unit = (name, bool(live_ready))

    def _check_fifo(self, rid: int) -> None:
        earlier = self.waiting_before(rid)
        if rid in self._ended:
            self.violate(f"request {rid} started materializing after it was cancelled or expired")
        if not earlier:
            return
        if rid not in self._proven:
            self.violate(f"request {rid} admitted ahead of the FIFO head {earlier[0]} without a backfill proof")
        elif self._heads[rid] != earlier[0]:
            self.violate(f"backfill of {rid} proved for head {self._heads[rid]}, but the head is {earlier[0]}")

    def _result(self, t: _Txn | None, result: ResourceResult) -> None:
        if t is None:
            return
        if t.kind is TransitionKind.MATERIALIZE and result.succeeded and result.handle is not None:
            self._rid_of[result.handle] = t.rid
        elif t.kind in (TransitionKind.RETAIN, TransitionKind.RELEASE) and t.handle is not None:
            rid = self._rid_of.get(t.handle)
            self._ready.discard(t.handle)
            if rid is not None:
                self.settled.add(rid)
                for info in result.published:
                    self.published_by[info.id] = rid
                if t.kind is TransitionKind.RETAIN and result.published and self._live:
                    self.retained.add(rid)

    def _check_accepted(self, batch: PendingBatch, decisions) -> None:
        """Checked before the Program sees the decisions: a Program may index a row by them and crash."""
        for row, d in zip(batch.rows, decisions):
            if d.accepted > row.produced:
                self.violate(f"request {self._rid_of.get(row.handle)} committed {d.accepted} tokens of a row that "
                             f"produced {row.produced}")

    def _commit(self, batch: PendingBatch, decisions) -> None:
        for row, d in zip(batch.rows, decisions):
            if d.terminal or d.cancelled:
                self._ready.discard(row.handle)
            else:
                self._ready.add(row.handle)

    def materializing(self) -> list[int]:
        """Requests whose materialization is open now (the harness cancels them at this moment on purpose)."""
        return [t.rid for t in self._open.values() if t.kind is TransitionKind.MATERIALIZE and t.rid is not None]

    def rid_of(self, handle: Any) -> int | None:
        return self._rid_of.get(handle)
