"""ProgramCore: the resource side of the Program protocol that both Programs share.

Sizing, plan verdicts, start/advance/abort, the backfill proof and the lookups run here over pure-Python
accounting (page refcounts, slot and row pools, the host tier); the physical stages are in `transitions.py` and
move bytes only through the Program's `PhysicalStore`. A Program subclasses this and adds its model transactions.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any, Sequence

from ninfer.contracts import (CheckpointId, CheckpointInfo, EngineFailure, Infeasible, ResourceChoice, ResourcePlan,
                              ResourceResult, ResourceUsage, RunningTransaction, SequenceHandle, StalePlan,
                              TransitionKind, token_digest)
from ninfer.models.qwen3_5.pages import PageAllocator

from . import invariants, transitions
from .draft_policy import DraftPolicy
from .records import ActiveSequence, Checkpoint
from .store import HostTier, IdPool, PhysicalStore

# A sequence needs its live state slot; it may hold one capture slot beyond it, and further capture slots only from
# the `checkpoint_slots` allowance shared by all sequences, so an admission from root never lacks a slot.
SLOTS_PER_SEQUENCE = 2


class ProgramCore:
    """`config` needs page_size, max_context, checkpoint_slots, draft_tokens and pages_for(tokens). `slots` is any
    pool with take/give/free/total; `rows`, when given, is one block-table row per lane, taken at the claim. A
    Program with a vision tower sets `vision` to its VisionConfig: image prompts are then checked against it at the
    plan."""

    vision: Any = None  # the vision tower's VisionConfig (None: no tower; the Engine refuses image prompts)
    max_patches = 0  # the most patches an image may have (0: any; the fast Program plans its encode for a size)

    def __init__(self, config: Any, alloc: PageAllocator, slots: IdPool, host: HostTier, store: PhysicalStore,
                 page_bytes: int, rows: IdPool | None = None):
        self.config = config
        self.alloc, self.slots, self.rows, self.host, self.store = alloc, slots, rows, host, store
        self.page_bytes = page_bytes
        self.seqs: dict[int, ActiveSequence] = {}  # live state slot -> sequence
        self.ckpts: dict[CheckpointId, Checkpoint] = {}  # published, inactive
        self.prepared: dict[int, ActiveSequence] = {}  # txn id -> materialization past its claim stage
        self._open: dict[int, dict[str, Any]] = {}  # txn id -> progress of a started transition
        self._revision = 0
        self._generation = itertools.count(1)
        self._ids = itertools.count(1)
        # each speculative round's width (the full block until a Program with measured round costs replaces it)
        self.draft_policy = DraftPolicy(config.draft_tokens)

    @property
    def resource_revision(self) -> int:
        return self._revision

    def backup_slot(self, row: int, bank: int = 0) -> int:
        """Where a step backed block-table row `row`'s state up: bank 0 its backup slot; bank 1 (a chained step,
        `Program`) exists only where the executor keeps one."""
        if bank:
            raise EngineFailure(f"no chained backup bank in this Program (row {row})")
        return self.config.backup_slot(row)

    def bump_revision(self) -> None:
        self._revision += 1

    def root_pages(self, choice: ResourceChoice) -> int:
        """The full-growth reservation: prompt plus every new token (the last one is never consumed, but the
        margin keeps one formula for both Programs)."""
        return self.config.pages_for(len(choice.prompt) + choice.max_new_tokens)

    def need(self, choice: ResourceChoice) -> int:
        """Pages a materialization takes from the pool: all but the source's full pages, which are shared."""
        shared = 0
        if choice.source is not None:
            src = self.checkpoint(choice.source)
            # a host replica's pages are all copied in; a device checkpoint's full pages are shared
            shared = len(src.tokens) // self.config.page_size if src.slot is not None else 0
        return self.root_pages(choice) - shared

    def reserved(self) -> int:
        return sum(s.reserve_left for s in itertools.chain(self.seqs.values(), self.prepared.values()))

    def free_pages(self) -> int:
        """Pages neither referenced nor promised to an active sequence's growth."""
        return self.alloc.available - self.reserved()

    def rows_short(self) -> bool:
        """No block-table row for another sequence (never, for a store without rows)."""
        return self.rows is not None and not self.rows.free

    def releasable(self, victims: Sequence[CheckpointId], keep: CheckpointId | None) -> tuple[int, int]:
        """(pages, device slots) that releasing every listed checkpoint (but `keep`) would return, exactly:
        a page comes back when the victims hold all of its references."""
        held: Counter[int] = Counter()
        slots = 0
        for cid in victims:
            if cid in self.ckpts and cid != keep:
                held.update(self.ckpts[cid].table)
                slots += self.ckpts[cid].slot is not None
        return sum(1 for p, n in held.items() if self.alloc.refs[p] == n), slots

    def capture_allowance_used(self) -> int:
        """Capture slots held beyond one per sequence: bounded by checkpoint_slots, so they never take a slot that
        an admission from root would need (see docs/reference-program.md)."""
        live = itertools.chain(self.seqs.values(), self.prepared.values())
        return sum(max(0, s.capture_slots - 1) for s in live)

    def plan(self, choice: ResourceChoice) -> ResourcePlan | Infeasible:
        kind = choice.kind
        verdict = None
        if kind is TransitionKind.MATERIALIZE:
            verdict = self._materialize_verdict(choice)
        elif kind is TransitionKind.CAPTURE:
            if not self.sequence(choice.handle).snapshots:
                verdict = Infeasible("no captured snapshot to publish", permanent=False)
        elif kind in (TransitionKind.RETAIN, TransitionKind.RELEASE):
            self.sequence(choice.handle)
        elif kind is TransitionKind.PLACE:
            verdict = self._place_verdict(choice)
        return verdict or ResourcePlan(choice, self._revision, next(self._ids))

    def _materialize_verdict(self, choice: ResourceChoice) -> Infeasible | None:
        if choice.media is not None and self.vision is not None:
            why = self.vision.media_mismatch(choice.media, self.max_patches)
            if why is not None:
                return Infeasible(f"the prompt's images do not fit this model's vision tower: {why}", permanent=True)
        root, total, ctx = self.root_pages(choice), self.alloc.total, len(choice.prompt) + choice.max_new_tokens
        if root > total or ctx > self.config.max_context:
            return Infeasible(f"needs {root} KV pages of {total} and {ctx} of {self.config.max_context} context "
                              "positions even from root", permanent=True)
        if choice.source is not None and len(self.checkpoint(choice.source).tokens) >= len(choice.prompt):
            raise EngineFailure(f"source checkpoint {choice.source.value} is not a strict prefix of the prompt")
        rel_pages, rel_slots = self.releasable(choice.victims, choice.source)
        if self.need(choice) > self.free_pages() + rel_pages or \
                1 > len(self.slots.free) + rel_slots or self.rows_short():
            what = "KV pages or state slots" if self.rows is None else "KV pages, state slots or block-table rows"
            return Infeasible(f"not enough free {what} now", permanent=False)
        return None

    def _place_verdict(self, choice: ResourceChoice) -> Infeasible | None:
        if choice.source is None:
            raise EngineFailure("PLACE names the checkpoint to move in `source`")
        ck = self.checkpoint(choice.source)
        if ck.slot is not None and not self.host.fits(len(ck.table)):
            return Infeasible("host tier budget is full", permanent=False)
        if ck.slot is None and (not self.slots.free or
                                self.free_pages() < self.host.entries[choice.source.value].n_pages):
            return Infeasible("no free device state slot or KV pages to bring the checkpoint back", permanent=False)
        return None

    def start(self, plan: ResourcePlan) -> RunningTransaction:
        if plan.resource_revision != self._revision:
            raise StalePlan(f"plan sealed at revision {plan.resource_revision}, now {self._revision}")
        txn = RunningTransaction(plan, next(self._ids))
        self._open[txn.txn_id] = {"stage": 0, "released": (), "placed": ()}
        return txn

    def advance(self, txn: RunningTransaction) -> ResourceResult | None:
        progress = self._open.get(txn.txn_id)
        if progress is None:
            raise EngineFailure(f"advance of unknown transaction {txn.txn_id}")
        result = transitions.advance(self, txn, progress)
        if result is not None:
            del self._open[txn.txn_id]
        return result

    def abort(self, txn: RunningTransaction) -> ResourceResult:
        progress = self._open.pop(txn.txn_id, None)
        if progress is None:
            raise EngineFailure(f"abort of unknown transaction {txn.txn_id}")
        return transitions.abort(self, txn, progress)

    def backfill_feasible(self, head: ResourceChoice, donors: Sequence[SequenceHandle],
                          borrower: ResourceChoice) -> bool:
        """Once the donors end and every inactive checkpoint is released, the sequences that stay hold at most
        their commitments, and unpublished boundary snapshots at most the checkpoint allowance; rows (where the
        store has them) are one per lane, so the Engine's lane bound covers them."""
        donor_slots = {d.slot for d in donors}
        kept = [s for slot, s in self.seqs.items() if slot not in donor_slots]
        held_pages = sum(len(s.table) + s.reserve_left for s in kept)
        held_slots = SLOTS_PER_SEQUENCE * (len(kept) + 2) + self.config.checkpoint_slots
        return (held_pages + self.root_pages(borrower) + self.root_pages(head) <= self.alloc.total
                and held_slots <= self.slots.total)

    def sequence(self, handle: SequenceHandle | None) -> ActiveSequence:
        seq = self.seqs.get(handle.slot) if handle is not None else None
        if seq is None or seq.handle != handle:
            raise EngineFailure(f"stale or unknown sequence handle {handle}")
        return seq

    def checkpoint(self, cid: CheckpointId) -> Checkpoint:
        ck = self.ckpts.get(cid)
        if ck is None:
            raise EngineFailure(f"unknown checkpoint {cid.value}")
        return ck

    def new_handle(self, slot: int) -> SequenceHandle:
        return SequenceHandle(slot, next(self._generation))

    def new_checkpoint_id(self) -> CheckpointId:
        return CheckpointId(next(self._ids))

    def checkpoint_info(self, cid: CheckpointId) -> CheckpointInfo:
        ck = self.checkpoint(cid)
        if ck.slot is None:
            return CheckpointInfo(cid, len(ck.tokens), ck.digest, 0, self.host.entries[cid.value].nbytes)
        return CheckpointInfo(cid, len(ck.tokens), ck.digest, len(ck.table) * self.page_bytes + self.host.state_bytes,
                              0)

    def prompt_remaining(self, handle: SequenceHandle) -> int:
        seq = self.sequence(handle)
        return len(seq.prompt) - seq.prompt_pos

    def resource_usage(self) -> ResourceUsage:
        return invariants.resource_usage(self)

    def check_invariants(self) -> None:
        invariants.check_invariants(self)
