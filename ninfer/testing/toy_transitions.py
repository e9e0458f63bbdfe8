"""The ToyProgram's physical transitions (the final stage of each resource transaction) and its invariants."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ninfer.contracts import (CheckpointId, ResourceChoice, ResourceResult, RunningTransaction, SequenceHandle,
                              TransitionKind, token_digest)

if TYPE_CHECKING:
    from .toy_program import ToyCheckpoint, ToyProgram


def apply_transition(prog: "ToyProgram", txn: RunningTransaction, choice: ResourceChoice) -> ResourceResult:
    kind = choice.kind
    if kind is TransitionKind.MATERIALIZE:
        return _materialize(prog, txn, choice)
    if kind is TransitionKind.CAPTURE:
        seq = prog._seq(choice.handle)
        snaps, seq.snapshots = seq.snapshots, []
        published = tuple(info for snap in snaps for info in _publish(prog, snap))
        return ResourceResult(txn.txn_id, kind, True, prog._revision, published=published)
    if kind in (TransitionKind.RETAIN, TransitionKind.RELEASE):
        return _terminal(prog, txn, choice)
    released = _release_victims(prog, choice.victims, need_pages=None, need_slots=None)
    return ResourceResult(txn.txn_id, kind, True, prog._revision, released=released)


def _free_checkpoint(prog: "ToyProgram", ck: "ToyCheckpoint") -> None:
    for p in ck.pages:
        prog.pages.unref(p)
    prog.slots.give(ck.slot)


def _release_victims(prog: "ToyProgram", victims, need_pages: int | None, need_slots: int | None,
                     keep: CheckpointId | None = None) -> tuple[CheckpointId, ...]:
    """Release victims in the given order until the need is met (or all of them when no need is given)."""
    released = []
    for cid in victims:
        if need_pages is not None and prog.pages.available - prog._reserved() >= need_pages \
                and len(prog.slots.free) >= need_slots:
            break
        if cid == keep or cid not in prog.ckpts:
            continue
        _free_checkpoint(prog, prog.ckpts.pop(cid))
        released.append(cid)
    return tuple(released)


def _materialize(prog: "ToyProgram", txn: RunningTransaction, choice: ResourceChoice) -> ResourceResult:
    need_pages, need_slots = prog._need(choice)
    released = _release_victims(prog, choice.victims, need_pages, need_slots, keep=choice.source)
    if prog.pages.available - prog._reserved() < need_pages or len(prog.slots.free) < need_slots:
        return ResourceResult(txn.txn_id, choice.kind, False, prog._revision, released=released,
                              detail="pools changed under the plan")
    from .toy_program import ToySequence

    slot = prog.slots.take()
    greedy = choice.sampling is None or getattr(choice.sampling, "temperature", 0.0) == 0.0
    seq = ToySequence(SequenceHandle(slot, next(prog._generation)), choice.prompt, choice.max_new_tokens,
                      choice.seed, greedy)
    reused = 0
    if choice.source is not None:
        src = prog.ckpts[choice.source]
        reused = len(src.tokens)
        full = reused // prog.page_size
        for p in src.pages[:full]:
            prog.pages.ref(p)  # shared by reference: immutable positions < frontier
        seq.pages = list(src.pages[:full])
        if reused % prog.page_size:
            seq.pages.append(prog.pages.take())  # the partial page is copied, later writes go to the copy
        seq.history, seq.rolling = list(src.tokens), src.rolling
    seq.reserve_left = need_pages - (len(seq.pages) - reused // prog.page_size)
    prog.seqs[slot] = seq
    released += _reserve_captures(prog, choice, seq, reused)
    return ResourceResult(txn.txn_id, choice.kind, True, prog._revision, handle=seq.handle, reused_tokens=reused,
                          captures=tuple(f for f, _ in seq.captures), released=released)


def _reserve_captures(prog: "ToyProgram", choice: ResourceChoice, seq, reused: int) -> tuple[CheckpointId, ...]:
    """A slot per chosen capture frontier while the allowance lasts, displacing the allowed victims for it."""
    released: tuple[CheckpointId, ...] = ()
    for f in dict.fromkeys(choice.captures):
        assert reused < f <= len(choice.prompt), f"capture at {f} outside the prefill"
        if prog.capture_allowance_used() + (seq.capture_slots >= 1) > prog.checkpoint_slots:
            break
        if not prog.slots.free:
            released += _release_victims(prog, choice.victims[:choice.capture_victims], need_pages=0, need_slots=1,
                                         keep=choice.source)
        if not prog.slots.free:
            break
        seq.captures = sorted(seq.captures + [(f, prog.slots.take())])
    return released


def _publish(prog: "ToyProgram", ck: "ToyCheckpoint") -> tuple:
    """Publish a complete checkpoint, unless an identical one is already published (then it is freed)."""
    digest = token_digest(ck.tokens)
    for other_id, other in prog.ckpts.items():
        if len(other.tokens) == len(ck.tokens) and token_digest(other.tokens) == digest:
            _free_checkpoint(prog, ck)
            return ()
    cid = CheckpointId(next(prog._ids))
    prog.ckpts[cid] = ck
    return (prog.checkpoint_info(cid),)


def _terminal(prog: "ToyProgram", txn: RunningTransaction, choice: ResourceChoice) -> ResourceResult:
    seq = prog._seq(choice.handle)
    del prog.seqs[seq.handle.slot]
    seq.reserve_left = 0
    for snap in seq.snapshots:
        _free_checkpoint(prog, snap)
    for _, slot in seq.captures:
        prog.slots.give(slot)
    published: tuple = ()
    if choice.kind is TransitionKind.RETAIN and seq.history:
        from .toy_program import ToyCheckpoint

        # The active state itself becomes the checkpoint: its slot and pages change owner, nothing is copied.
        published = _publish(prog, ToyCheckpoint(tuple(seq.history), seq.rolling, seq.pages, seq.handle.slot))
    else:
        for p in seq.pages:
            prog.pages.unref(p)
        prog.slots.give(seq.handle.slot)
    return ResourceResult(txn.txn_id, choice.kind, True, prog._revision, published=published)


def check_toy_invariants(prog: "ToyProgram") -> None:
    refs: dict[int, int] = {}
    used_slots: list[int] = []

    def hold(pages, slot):
        for p in pages:
            refs[p] = refs.get(p, 0) + 1
        if slot is not None:
            used_slots.append(slot)

    for slot, seq in prog.seqs.items():
        assert seq.handle.slot == slot, f"sequence in slot {slot} has handle {seq.handle}"
        hold(seq.pages, slot)
        for _, reserved in seq.captures:
            hold((), reserved)
        for snap in seq.snapshots:
            hold(snap.pages, snap.slot)
        assert len(seq.pages) == prog._pages_for(len(seq.history)), f"{seq.handle}: pages do not cover history"
        assert seq.reserve_left >= 0
    for ck in prog.ckpts.values():
        hold(ck.pages, ck.slot)
    assert refs == prog.pages.refs, "page refcounts differ from the references held"
    assert not set(refs) & set(prog.pages.free), "a referenced page is on the free list"
    assert len(refs) + len(prog.pages.free) == prog.pages.total, "pages leaked"
    assert len(used_slots) == len(set(used_slots)), "a state slot is owned twice"
    assert sorted(used_slots + prog.slots.free) == list(range(prog.slots.total)), "state slots leaked"
    assert prog._reserved() <= prog.pages.available, "reservations exceed free pages"
    assert prog.capture_allowance_used() <= prog.checkpoint_slots, "capture slots beyond the allowance"
