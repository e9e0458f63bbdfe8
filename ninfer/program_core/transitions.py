"""The physical transitions both Programs share: the stages of each resource transaction, and their results.

MATERIALIZE from a checkpoint runs in two stages, at two worker boundaries: the claim stage makes room, takes the
slots, pages and (where the store has them) a block-table row, and copies the source's state (GDN state into the
new slot, the partial KV page into a new page; full pages are shared by reference); the activation stage makes the
sequence visible. Every other transition, and a materialization from root, completes in one stage. An abort after
the claim returns everything it took. Bytes move only through the Program's `PhysicalStore` (`prog.store`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from ninfer.contracts import (CheckpointId, CheckpointInfo, EngineFailure, ResourceChoice, ResourceResult,
                              RunningTransaction, TransitionKind)
from ninfer.sampling import params_or_greedy

from .records import ActiveSequence, Checkpoint
from .store import Replica

if TYPE_CHECKING:
    from .core import ProgramCore

SEED_MOD = 1 << 64


def advance(prog: "ProgramCore", txn: RunningTransaction, progress: dict[str, Any]) -> ResourceResult | None:
    choice = txn.plan.choice
    kind = choice.kind
    if kind is TransitionKind.MATERIALIZE:
        return _advance_materialize(prog, txn, progress)
    prog.bump_revision()
    if kind is TransitionKind.CAPTURE:
        seq = prog.sequence(choice.handle)
        snaps, seq.snapshots = seq.snapshots, []
        published = tuple(info for ck in snaps for info in publish(prog, ck))
        return ResourceResult(txn.txn_id, kind, True, prog.resource_revision, published=published)
    if kind in (TransitionKind.RETAIN, TransitionKind.RELEASE):
        return _terminal(prog, txn, choice)
    if kind is TransitionKind.PLACE:
        return _place(prog, txn, choice.source)
    released = tuple(cid for cid in choice.victims if cid in prog.ckpts)
    for cid in released:
        free_checkpoint(prog, prog.ckpts.pop(cid), cid)
    return ResourceResult(txn.txn_id, kind, True, prog.resource_revision, released=released)


def abort(prog: "ProgramCore", txn: RunningTransaction, progress: dict[str, Any]) -> ResourceResult:
    """Return what the claim stage took; victims it already released stay released and are reported."""
    seq = prog.prepared.pop(txn.txn_id, None)
    if seq is not None:
        _free_sequence(prog, seq)
        prog.bump_revision()
    return ResourceResult(txn.txn_id, txn.plan.choice.kind, False, prog.resource_revision,
                          released=progress["released"], placed=progress.get("placed", ()), detail="aborted")


def _advance_materialize(prog: "ProgramCore", txn: RunningTransaction,
                         progress: dict[str, Any]) -> ResourceResult | None:
    choice = txn.plan.choice
    if progress["stage"] == 0:
        room = Room(prog, choice)
        room.make(choice.victims, prog.need(choice), 1)
        progress["released"], progress["placed"] = room.released, room.placed
        if prog.need(choice) > prog.free_pages() or not prog.slots.free or prog.rows_short():
            prog.bump_revision()
            return room.result(txn, False, detail="pools changed under the plan")
        seq = prog.prepared[txn.txn_id] = _claim(prog, choice)
        _reserve_captures(prog, choice, seq, room)
        progress["released"], progress["placed"] = room.released, room.placed
        prog.bump_revision()
        progress["stage"] = 1
        if choice.source is not None:
            return None
    seq = prog.prepared.pop(txn.txn_id)
    prog.seqs[seq.handle.slot] = seq
    prog.bump_revision()
    return ResourceResult(txn.txn_id, choice.kind, True, prog.resource_revision, handle=seq.handle,
                          reused_tokens=seq.frontier, captures=tuple(f for f, _ in seq.captures),
                          released=progress["released"], placed=progress["placed"])


class Room:
    """Making room by the ResourceManager's victims, lowest value first: a device-resident victim it wants demoted
    becomes a host replica (GDN state and KV pages) when the host tier fits it, if need be after deleting host
    replicas ranked below it; otherwise it is deleted. The source is never displaced, and a host replica is
    skipped (it holds no slot and no page)."""

    def __init__(self, prog: "ProgramCore", choice: ResourceChoice):
        self.prog, self.choice = prog, choice
        self.released: tuple[CheckpointId, ...] = ()
        self.placed: tuple[CheckpointInfo, ...] = ()

    def make(self, victims: Sequence[CheckpointId], pages: int, slots: int) -> bool:
        prog = self.prog
        below: list[CheckpointId] = []  # host replicas ranked below the current victim
        for cid in victims:
            if prog.free_pages() >= pages and len(prog.slots.free) >= slots:
                return True
            if cid == self.choice.source or cid not in prog.ckpts:
                continue
            ck = prog.ckpts[cid]
            if ck.slot is None:
                below.append(cid)
                continue
            if cid in self.choice.demote and self._host_room(below, len(ck.table)):
                to_host(prog, cid, ck)
                self.placed += (prog.checkpoint_info(cid),)
                continue
            self._delete(cid)
        return prog.free_pages() >= pages and len(prog.slots.free) >= slots

    def _host_room(self, below: list[CheckpointId], n_pages: int) -> bool:
        """Whether a replica of n_pages fits the host tier once replicas worth less than it are deleted (they
        are, only when that makes it fit)."""
        host, ckpts = self.prog.host, self.prog.ckpts
        freeable = sum(host.entries[c.value].nbytes for c in below if c in ckpts)
        if host.used - freeable + host.bytes_for(n_pages) > host.budget:
            return False
        while below and not host.fits(n_pages):
            cid = below.pop(0)
            if cid in ckpts:
                self._delete(cid)
        return True

    def _delete(self, cid: CheckpointId) -> None:
        """Release a victim; one this room demoted earlier (a capture's later walk may make host room with it) is
        reported released only."""
        free_checkpoint(self.prog, self.prog.ckpts.pop(cid), cid)
        self.released += (cid,)
        self.placed = tuple(info for info in self.placed if info.id != cid)

    def result(self, txn: RunningTransaction, succeeded: bool, **kw: Any) -> ResourceResult:
        return ResourceResult(txn.txn_id, txn.plan.choice.kind, succeeded, self.prog.resource_revision,
                              released=self.released, placed=self.placed, **kw)


def _reserve_captures(prog: "ProgramCore", choice: ResourceChoice, seq: ActiveSequence, room: Room) -> None:
    """A state slot for each chosen capture frontier, in the ResourceManager's order, while the allowance lasts; a
    slot may come from the victims the ResourceManager let captures displace (`capture_victims`)."""
    start, wanted = seq.frontier, []
    for f in dict.fromkeys(choice.captures):
        if not start < f <= len(choice.prompt):
            raise EngineFailure(f"capture at {f} outside the prefill of {start}..{len(choice.prompt)}")
        if prog.capture_allowance_used() + (seq.capture_slots >= 1) > prog.config.checkpoint_slots:
            break
        if not room.make(choice.victims[:choice.capture_victims], 0, 1):
            break
        wanted.append((f, prog.slots.take()))
        seq.captures = sorted(wanted)


def _claim(prog: "ProgramCore", choice: ResourceChoice) -> ActiveSequence:
    slot = prog.slots.take()
    row = prog.rows.take() if prog.rows is not None else None
    seq = ActiveSequence(prog.new_handle(slot), choice.prompt, choice.max_new_tokens, params_or_greedy(choice.sampling),
                         choice.seed % SEED_MOD, row=row, media=choice.media)
    taken = 0
    if choice.source is None:
        prog.store.clear_slot(slot)
    else:
        src, ps = prog.checkpoint(choice.source), prog.config.page_size
        if src.slot is None:
            # resume from the host replica: every page and the state are copied in; the replica stays
            seq.table = _from_host(prog, prog.host.entries[choice.source.value], slot)
            taken = len(seq.table)
        else:
            full = len(src.tokens) // ps
            for p in src.table[:full]:
                prog.alloc.ref(p)  # shared by reference: positions < frontier are immutable
            seq.table = list(src.table[:full])
            if len(src.tokens) % ps:
                page = prog.alloc.take()  # the partial page is copied: this sequence writes after the frontier
                prog.store.copy_page(src.table[full], page)
                seq.table.append(page)
                taken = 1
            prog.store.copy_slot(src.slot, slot)
        seq.tokens = list(src.tokens)
        prog.store.write_row(row, seq.table)
    seq.reserve_left = prog.need(choice) - taken
    return seq


def publish(prog: "ProgramCore", ck: Checkpoint) -> tuple[CheckpointInfo, ...]:
    """Publish a complete checkpoint, unless one of the same tokens is already published (then free it)."""
    for other in prog.ckpts.values():
        if len(other.tokens) == len(ck.tokens) and other.digest == ck.digest:
            free_checkpoint(prog, ck, None)
            return ()
    cid = prog.new_checkpoint_id()
    prog.ckpts[cid] = ck
    return (prog.checkpoint_info(cid),)


def free_checkpoint(prog: "ProgramCore", ck: Checkpoint, cid: CheckpointId | None) -> None:
    for p in ck.table:
        prog.alloc.unref(p)
    if ck.slot is not None:
        prog.slots.give(ck.slot)
    elif cid is not None:
        del prog.host.entries[cid.value]


def to_host(prog: "ProgramCore", cid: CheckpointId, ck: Checkpoint) -> None:
    """Demote: a complete host replica (GDN state and every KV page) is made, then the device original is dropped:
    its slot is freed and its pages unreferenced (a page another holder shares stays on the device for it)."""
    store = prog.store
    prog.host.entries[cid.value] = Replica(store.load_slot(ck.slot), store.load_pages(ck.table), len(ck.table),
                                           prog.host.bytes_for(len(ck.table)))
    prog.slots.give(ck.slot)
    for p in ck.table:
        prog.alloc.unref(p)
    ck.slot, ck.table = None, []


def to_device(prog: "ProgramCore", cid: CheckpointId, ck: Checkpoint) -> None:
    """Promote: fresh pages and a slot are taken, the replica is copied in, and the replica is dropped."""
    ck.slot = prog.slots.take()
    ck.table = _from_host(prog, prog.host.entries.pop(cid.value), ck.slot)


def _from_host(prog: "ProgramCore", replica: Replica, slot: int) -> list[int]:
    """Copy a replica into `slot` and into fresh pages; the block table of those pages."""
    table = [prog.alloc.take() for _ in range(replica.n_pages)]
    prog.store.store_pages(table, replica.pages)
    prog.store.store_slot(slot, replica.state)
    return table


def _place(prog: "ProgramCore", txn: RunningTransaction, cid: CheckpointId | None) -> ResourceResult:
    """Move one inactive checkpoint to the other tier: demote it to a host replica, or promote its replica back."""
    ck = prog.checkpoint(cid)
    if ck.slot is not None and prog.host.fits(len(ck.table)):
        to_host(prog, cid, ck)
    elif ck.slot is None and prog.slots.free and prog.free_pages() >= prog.host.entries[cid.value].n_pages:
        to_device(prog, cid, ck)
    else:
        return ResourceResult(txn.txn_id, TransitionKind.PLACE, False, prog.resource_revision,
                              detail="the target tier has no room")
    return ResourceResult(txn.txn_id, TransitionKind.PLACE, True, prog.resource_revision,
                          placed=(prog.checkpoint_info(cid),), detail="to host" if ck.slot is None else "to device")


def _terminal(prog: "ProgramCore", txn: RunningTransaction, choice: ResourceChoice) -> ResourceResult:
    seq = prog.sequence(choice.handle)
    retain = choice.kind is TransitionKind.RETAIN and seq.frontier > 0
    if retain and choice.capture_at is not None and choice.capture_at != seq.frontier:
        raise EngineFailure(f"retain at {choice.capture_at} but sequence {seq.handle} is at {seq.frontier}")
    del prog.seqs[seq.handle.slot]
    _free_captures(prog, seq)
    seq.reserve_left = 0
    _give_row(prog, seq)
    published: tuple[CheckpointInfo, ...] = ()
    if retain:
        # The live state itself becomes the checkpoint: its slot and pages change owner, nothing is copied.
        published = publish(prog, Checkpoint(tuple(seq.tokens), seq.table, seq.handle.slot))
    else:
        for p in seq.table:
            prog.alloc.unref(p)
        prog.slots.give(seq.handle.slot)
    return ResourceResult(txn.txn_id, choice.kind, True, prog.resource_revision, published=published)


def _free_captures(prog: "ProgramCore", seq: ActiveSequence) -> None:
    """Unpublished snapshots and the slots of captures prefill never reached."""
    for ck in seq.snapshots:
        free_checkpoint(prog, ck, None)
    for _, slot in seq.captures:
        prog.slots.give(slot)
    seq.snapshots, seq.captures = [], []


def _free_sequence(prog: "ProgramCore", seq: ActiveSequence) -> None:
    _free_captures(prog, seq)
    for p in seq.table:
        prog.alloc.unref(p)
    prog.slots.give(seq.handle.slot)
    _give_row(prog, seq)


def _give_row(prog: "ProgramCore", seq: ActiveSequence) -> None:
    if seq.row is not None:
        prog.rows.give(seq.row)
