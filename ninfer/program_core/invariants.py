"""Occupancy summary and the physical invariants both Programs keep (the fast Program adds its device checks)."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import TYPE_CHECKING

from ninfer.contracts import ResourceUsage

if TYPE_CHECKING:
    from .core import ProgramCore
    from .records import Checkpoint


def resource_usage(prog: "ProgramCore") -> ResourceUsage:
    live = list(itertools.chain(prog.seqs.values(), prog.prepared.values()))
    seq_pages = {p for s in live for p in s.table} | {p for s in live for c in s.snapshots for p in c.table}
    ck_pages = {p for c in prog.ckpts.values() for p in c.table} - seq_pages
    on_host = sum(1 for c in prog.ckpts.values() if c.slot is None)
    device = len({p for c in prog.ckpts.values() for p in c.table}) * prog.page_bytes + \
        (len(prog.ckpts) - on_host) * prog.host.state_bytes
    return ResourceUsage(active_sequences=len(prog.seqs), reserved_pages=prog.reserved(),
                         sequence_pages=len(seq_pages), checkpoint_pages=len(ck_pages),
                         free_pages=prog.alloc.available, total_pages=prog.alloc.total,
                         checkpoints=len(prog.ckpts), free_slots=len(prog.slots.free), total_slots=prog.slots.total,
                         host_checkpoints=on_host, checkpoint_device_bytes=device,
                         checkpoint_host_bytes=prog.host.used)


def _check_sequences(prog: "ProgramCore", refs: Counter, slots: list[int], rows: list[int]) -> None:
    pages_for = prog.config.pages_for
    # a round launched ahead holds the pages of the positions it fed past each row's frontier
    ahead = getattr(prog, "ahead_extents", dict)()
    for slot, seq in prog.seqs.items():
        assert seq.handle.slot == slot, f"sequence in slot {slot} has handle {seq.handle}"
    live = {seq.handle for seq in prog.seqs.values() if seq.pending is not None}
    # and a chunk riding in it: a sequence in prefill whose chunk leaves prompt tokens
    riding = {seq.handle for seq in prog.seqs.values() if seq.pending is None and seq.handle in ahead and
              seq.frontier + ahead[seq.handle] < len(seq.prompt)}
    assert len(riding) <= 1 and set(ahead) <= live | riding, \
        f"a round launched ahead holds {set(ahead) - live}, neither past their prompt nor one riding chunk"
    for seq in itertools.chain(prog.seqs.values(), prog.prepared.values()):
        refs.update(seq.table)
        slots.append(seq.handle.slot)
        slots.extend(slot for _, slot in seq.captures)
        assert [f for f, _ in seq.captures] == sorted({f for f, _ in seq.captures}), f"{seq.handle}: captures unordered"
        assert all(f > seq.frontier for f, _ in seq.captures), f"{seq.handle}: prefill passed a reserved capture"
        rows.extend([seq.row] if seq.row is not None else [])
        covered = pages_for(seq.frontier + ahead.get(seq.handle, 0))
        assert len(seq.table) == covered, f"{seq.handle}: block table does not cover the frontier"
        assert seq.reserve_left >= 0, f"{seq.handle}: negative reservation"
        assert len(seq.table) + seq.reserve_left <= pages_for(len(seq.prompt) + seq.max_new), \
            f"{seq.handle}: holds more than its full-growth commitment"
        assert seq.frontier <= len(seq.prompt) + seq.max_new, f"{seq.handle}: consumed past its budget"
        assert seq.pending is None or seq.frontier >= len(seq.prompt), f"{seq.handle}: output before prompt end"
        for ck in seq.snapshots:
            assert ck.slot is not None, f"{seq.handle}: an unpublished snapshot without a device slot"
            assert tuple(seq.tokens[:len(ck.tokens)]) == ck.tokens, f"{seq.handle}: snapshot is not a prefix"
            refs.update(ck.table)
            slots.append(ck.slot)
            assert len(ck.table) == pages_for(len(ck.tokens)), f"{seq.handle}: snapshot pages do not cover it"


def check_invariants(prog: "ProgramCore") -> None:
    """Refcounts equal the references held, no page both free and used, every slot (and row) owned once or free,
    reservations covered by free pages, block tables covering each frontier, the host tier within budget."""
    refs: Counter[int] = Counter()
    slots: list[int] = []
    rows: list[int] = []
    _check_sequences(prog, refs, slots, rows)
    host = set()
    for cid, ck in prog.ckpts.items():
        refs.update(ck.table)
        if ck.slot is None:
            host.add(cid.value)
            _check_replica(prog, cid.value, ck)
        else:
            slots.append(ck.slot)
            assert len(ck.table) == prog.config.pages_for(len(ck.tokens)), \
                f"checkpoint {cid.value}: pages do not cover it"
    alloc = prog.alloc
    assert dict(refs) == alloc.refs, "page refcounts differ from the references held"
    assert not set(refs) & set(alloc.free), "a referenced page is on the free list"
    assert len(refs) + len(alloc.free) == alloc.total, "KV pages leaked"
    assert len(slots) == len(set(slots)), "a GDN state slot is owned twice"
    assert sorted(slots + prog.slots.free) == list(range(prog.slots.total)), "GDN state slots leaked"
    if prog.rows is not None:
        assert sorted(rows + prog.rows.free) == list(range(prog.rows.total)), "block-table rows leaked or shared"
    assert prog.reserved() <= alloc.available, "reservations exceed the free pages"
    assert prog.capture_allowance_used() <= prog.config.checkpoint_slots, "capture slots beyond the allowance"
    assert host == set(prog.host.entries), "host-tier entries differ from host-resident checkpoints"
    assert prog.host.used <= prog.host.budget, "host tier over its budget (--kv-offloading-size)"


def _check_replica(prog: "ProgramCore", cid: int, ck: "Checkpoint") -> None:
    """A host-resident checkpoint holds no device page, and its replica covers its frontier with the bytes the
    host tier accounts for it."""
    replica = prog.host.entries.get(cid)
    assert replica is not None, f"checkpoint {cid}: on the host without a replica"
    assert not ck.table, f"checkpoint {cid}: a host replica still references device pages"
    assert replica.n_pages == prog.config.pages_for(len(ck.tokens)), f"checkpoint {cid}: replica pages do not cover it"
    assert replica.nbytes == prog.host.bytes_for(replica.n_pages), f"checkpoint {cid}: replica bytes misaccounted"
