"""ToyProgram: a complete Program whose "model" is a rolling hash of the token history.

Next-token choice depends only on (history, seed, position), so a greedy request's output is schedule-invariant by
construction, yet every Engine path runs for real: page reservations, shared checkpoint pages, state slots,
pressure with victims, multi-stage transitions, backfill proofs, speculative multi-token rows. It costs
microseconds per call, which also makes it the no-op Program of the host-overhead benchmark.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Sequence

from ninfer.contracts import (BatchKind, CheckpointId, CheckpointInfo, EngineFailure, Infeasible, PendingBatch,
                              PendingRow, PrefillChunk, ProgramLimits, ResourceChoice, ResourceUsage, ResourcePlan, ResourceResult, RowDecision,
                              RowFailure, RunningTransaction, SequenceHandle, StalePlan, TransitionKind, token_digest)

from .toy_stores import PagePool, SlotPool

_MOD = (1 << 61) - 1


def _roll(h: int, token: int) -> int:
    return (h * 1_000_003 + token + 1) % _MOD


@dataclass
class ToySequence:
    handle: SequenceHandle
    prompt: tuple[int, ...]
    max_new: int
    seed: int
    greedy: bool
    history: list[int] = field(default_factory=list)  # tokens the state has consumed
    rolling: int = 0  # rolling hash of history
    pending: int | None = None  # last committed output token, not yet consumed
    pages: list[int] = field(default_factory=list)
    reserve_left: int = 0  # pages reserved for growth, not yet taken from the pool
    captures: list[tuple[int, int]] = field(default_factory=list)  # (frontier, reserved slot), ascending
    snapshots: list["ToyCheckpoint"] = field(default_factory=list)  # captured, owned until published or released

    @property
    def prompt_pos(self) -> int:
        return min(len(self.history), len(self.prompt))

    @property
    def capture_slots(self) -> int:
        return len(self.captures) + len(self.snapshots)


@dataclass
class ToyCheckpoint:
    tokens: tuple[int, ...]
    rolling: int
    pages: list[int]
    slot: int


class ToyProgram:
    def __init__(self, *, max_concurrency: int = 4, max_context: int = 256, vocab: int = 97, page_size: int = 4,
                 total_pages: int = 128, checkpoint_slots: int = 8, draft_tokens: int = 1, source_stages: int = 2,
                 root_stages: int = 1,
                 eos: tuple[int, ...] = (0,), mixed_steps: bool = True):
        self.limits = ProgramLimits(max_concurrency, max_context, vocab, eos, mixed_steps=mixed_steps)
        self.page_size, self.draft_tokens, self.source_stages = page_size, draft_tokens, source_stages
        self.root_stages = root_stages
        self.checkpoint_slots = checkpoint_slots
        self.pages = PagePool(total_pages)
        self.slots = SlotPool(2 * max_concurrency + checkpoint_slots)
        self.seqs: dict[int, ToySequence] = {}  # state slot -> sequence
        self.ckpts: dict[CheckpointId, ToyCheckpoint] = {}
        self._revision = 0
        self._generation = itertools.count(1)
        self._ids = itertools.count(1)
        self._open: dict[int, dict[str, Any]] = {}  # txn id -> progress of a started transition
        self.calls = 0  # model calls, for tests

    @property
    def resource_revision(self) -> int:
        return self._revision

    def _pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    def _need(self, choice: ResourceChoice) -> tuple[int, int]:
        """(pages, slots) a materialization needs from the pools, given its source's shared full pages."""
        total = self._pages_for(len(choice.prompt) + choice.max_new_tokens)
        shared = 0
        if choice.source is not None:
            shared = len(self.ckpts[choice.source].tokens) // self.page_size
        return total - shared, 1

    def _commitment(self, seq: ToySequence) -> int:
        return len(seq.pages) + seq.reserve_left

    def _releasable(self, victims: Sequence[CheckpointId], keep: CheckpointId | None) -> tuple[int, int]:
        """Pages and slots freed by releasing every victim: a page shared by two victims is freed too."""
        drops: dict[int, int] = {}
        slots = 0
        for cid in victims:
            if cid in self.ckpts and cid != keep:
                for p in self.ckpts[cid].pages:
                    drops[p] = drops.get(p, 0) + 1
                slots += 1
        return sum(1 for p, d in drops.items() if self.pages.refs[p] == d), slots

    def plan(self, choice: ResourceChoice) -> ResourcePlan | Infeasible:
        if choice.kind is TransitionKind.MATERIALIZE:
            need_pages, need_slots = self._need(choice)
            root_pages = self._pages_for(len(choice.prompt) + choice.max_new_tokens)
            if root_pages > self.pages.total or need_slots > self.slots.total:
                return Infeasible(f"needs {root_pages} pages of {self.pages.total} even from root", permanent=True)
            rel_pages, rel_slots = self._releasable(choice.victims, choice.source)
            if need_pages > self.pages.available - self._reserved() + rel_pages or \
                    need_slots > len(self.slots.free) + rel_slots:
                return Infeasible("not enough free pages or slots now", permanent=False)
        elif choice.kind is TransitionKind.CAPTURE:
            seq = self._seq(choice.handle)
            if not seq.snapshots:
                return Infeasible("no captured snapshot to publish", permanent=False)
        elif choice.kind is TransitionKind.PLACE:
            return Infeasible("the ToyProgram has no host tier", permanent=False)
        elif choice.kind in (TransitionKind.RETAIN, TransitionKind.RELEASE):
            self._seq(choice.handle)
        return ResourcePlan(choice, self._revision, next(self._ids))

    def _reserved(self) -> int:
        return sum(s.reserve_left for s in self.seqs.values())

    def start(self, plan: ResourcePlan) -> RunningTransaction:
        if plan.resource_revision != self._revision:
            raise StalePlan(f"plan sealed at revision {plan.resource_revision}, now {self._revision}")
        txn = RunningTransaction(plan, next(self._ids))
        self._open[txn.txn_id] = {"stage": 0}
        return txn

    def advance(self, txn: RunningTransaction) -> ResourceResult | None:
        progress = self._open.get(txn.txn_id)
        if progress is None:
            raise EngineFailure(f"advance of unknown transaction {txn.txn_id}")
        choice = txn.plan.choice
        # A materialization from a checkpoint takes `source_stages` stages (state copy, then activation), one from
        # root `root_stages`, to exercise transitions that stay open across worker boundaries (3 keeps one open
        # through a whole boundary).
        stages = self.source_stages if choice.source is not None else self.root_stages
        if choice.kind is TransitionKind.MATERIALIZE and progress["stage"] < stages - 1:
            progress["stage"] += 1
            return None
        del self._open[txn.txn_id]
        self._revision += 1
        from .toy_transitions import apply_transition

        return apply_transition(self, txn, choice)

    def abort(self, txn: RunningTransaction) -> ResourceResult:
        if self._open.pop(txn.txn_id, None) is None:
            raise EngineFailure(f"abort of unknown transaction {txn.txn_id}")
        # Nothing physical happens before the final stage, so an abort leaves every pool as it was.
        return ResourceResult(txn.txn_id, txn.plan.choice.kind, False, self._revision, detail="aborted")

    def backfill_feasible(self, head: ResourceChoice, donors: Sequence[SequenceHandle],
                          borrower: ResourceChoice) -> bool:
        donor_slots = {d.slot for d in donors}
        held = sum(self._commitment(s) for slot, s in self.seqs.items() if slot not in donor_slots)
        # each sequence holds its live slot and one capture slot; further capture slots come from the allowance
        held_slots = 2 * sum(1 for slot in self.seqs if slot not in donor_slots) + self.checkpoint_slots
        b_pages = self._pages_for(len(borrower.prompt) + borrower.max_new_tokens)
        h_pages = self._pages_for(len(head.prompt) + head.max_new_tokens)
        return (held + b_pages + h_pages <= self.pages.total
                and held_slots + 4 <= self.slots.total)

    def capture_allowance_used(self) -> int:
        return sum(max(0, s.capture_slots - 1) for s in self.seqs.values())

    def _seq(self, handle: SequenceHandle | None) -> ToySequence:
        seq = self.seqs.get(handle.slot) if handle is not None else None
        if seq is None or seq.handle != handle:
            raise EngineFailure(f"stale or unknown sequence handle {handle}")
        return seq

    def _consume(self, seq: ToySequence, tokens: Sequence[int]) -> None:
        for t in tokens:
            if len(seq.history) % self.page_size == 0:
                if seq.reserve_left <= 0:
                    raise EngineFailure(f"sequence {seq.handle} grew past its reservation")
                seq.reserve_left -= 1
                seq.pages.append(self.pages.take())
            seq.history.append(t)
            seq.rolling = _roll(seq.rolling, t)
            if seq.captures and seq.captures[0][0] == len(seq.history):
                self._capture(seq, seq.captures.pop(0)[1])

    def _draw(self, seq: ToySequence, rolling: int, position: int, mask: Any | None = None) -> int | RowFailure:
        """The hashed token; under a mask (V truth values) the first allowed id from it on, cyclically, and
        NOTHING_ALLOWED when the mask allows none (as the real samplers report it)."""
        self.calls += 1
        key = rolling if seq.greedy else _roll(rolling, seq.seed % _MOD + position)
        vocab = self.limits.vocab_size
        token = key % vocab
        if mask is None:
            return token
        allowed = [t for t in range(vocab) if mask[t]]
        if not allowed:
            return RowFailure.NOTHING_ALLOWED
        return next((t for t in allowed if t >= token), allowed[0])

    def prompt_remaining(self, handle: SequenceHandle) -> int:
        seq = self._seq(handle)
        return len(seq.prompt) - seq.prompt_pos

    def prefill(self, handle: SequenceHandle, max_tokens: int, mask: Any | None = None) -> PendingBatch | None:
        seq = self._seq(handle)
        start = seq.prompt_pos
        self._consume(seq, seq.prompt[start:start + max_tokens])
        if seq.prompt_pos < len(seq.prompt):
            return None
        row = self._row(handle, [self._draw(seq, seq.rolling, len(seq.history), mask)], len(seq.history))
        return PendingBatch(BatchKind.PREFILL, (row,), self._revision)

    @staticmethod
    def _row(handle: SequenceHandle, drawn: list, base_frontier: int) -> PendingRow:
        if isinstance(drawn[0], RowFailure):
            return PendingRow.failed(handle, base_frontier, drawn[0])
        return PendingRow(handle, tuple(drawn), base_frontier)

    def decode(self, handles: Sequence[SequenceHandle], masks: Sequence[Any | None] | None = None,
               prefill: PrefillChunk | None = None) -> PendingBatch:
        rows = self._decode_rows(handles, masks)
        if prefill is None:
            return PendingBatch(BatchKind.DECODE, tuple(rows), self._revision)
        seq = self._seq(prefill.handle)
        if prefill.handle in handles or seq.prompt_pos >= len(seq.prompt):
            raise EngineFailure(f"a decode round carrying {prefill.handle}'s prefill, whose prompt is consumed")
        first = self.prefill(prefill.handle, prefill.max_tokens, prefill.mask)
        return PendingBatch(BatchKind.MIXED, tuple(rows) + (() if first is None else first.rows), self._revision)

    def _decode_rows(self, handles: Sequence[SequenceHandle], masks: Sequence[Any | None] | None
                     ) -> list[PendingRow]:
        rows = []
        for j, handle in enumerate(handles):
            seq = self._seq(handle)
            if seq.pending is None:
                raise EngineFailure(f"decode of {handle} before its prompt finished")
            rolling = _roll(seq.rolling, seq.pending)
            tokens = [self._draw(seq, rolling, len(seq.history) + 1, None if masks is None else masks[j])]
            room = seq.max_new - self._outputs(seq)
            for i in range(1, min(self.draft_tokens, room) if not isinstance(tokens[0], RowFailure) else 1):
                rolling = _roll(rolling, tokens[-1])  # drafts past the first token are unconstrained
                tokens.append(self._draw(seq, rolling, len(seq.history) + 1 + i))
            rows.append(self._row(handle, tokens, len(seq.history) + 1))
        return rows

    def _outputs(self, seq: ToySequence) -> int:
        return len(seq.history) - len(seq.prompt) + (seq.pending is not None)

    def control(self, handle: SequenceHandle, tokens: Sequence[int]) -> PendingBatch:
        seq = self._seq(handle)
        row = PendingRow(handle, tuple(tokens), base_frontier=len(seq.history) + 1)
        return PendingBatch(BatchKind.CONTROL, (row,), self._revision)

    def commit(self, batch: PendingBatch, decisions: Sequence[RowDecision]) -> None:
        batch.check_decisions(decisions)
        for row, d in zip(batch.rows, decisions):
            seq = self._seq(row.handle)
            if d.accepted == 0:
                continue
            feed = ([seq.pending] if seq.pending is not None else []) + list(row.tokens[:d.accepted - 1])
            self._consume(seq, feed)
            seq.pending = row.tokens[d.accepted - 1]

    def _capture(self, seq: ToySequence, slot: int) -> None:
        """Capture the frontier into the slot reserved for it at activation (KV pages by reference)."""
        pages = list(seq.pages)
        for p in pages:
            self.pages.ref(p)
        seq.snapshots.append(ToyCheckpoint(tuple(seq.history), seq.rolling, pages, slot))

    def abort_pending(self, batch: PendingBatch) -> None:
        """Provisional tokens live only in the batch, so dropping it restores every row."""

    def checkpoint_info(self, cid: CheckpointId) -> CheckpointInfo:
        ck = self.ckpts[cid]
        return CheckpointInfo(cid, len(ck.tokens), token_digest(ck.tokens), len(ck.pages), 0)

    def resource_usage(self) -> ResourceUsage:
        seq_pages = {p for s in self.seqs.values() for p in s.pages}
        snap_pages = {p for s in self.seqs.values() for c in s.snapshots for p in c.pages}
        ck_pages = {p for c in self.ckpts.values() for p in c.pages} - seq_pages - snap_pages
        return ResourceUsage(len(self.seqs), self._reserved(), len(seq_pages | snap_pages), len(ck_pages),
                             self.pages.available, self.pages.total, len(self.ckpts), len(self.slots.free),
                             self.slots.total)

    def check_invariants(self) -> None:
        from .toy_transitions import check_toy_invariants

        check_toy_invariants(self)
