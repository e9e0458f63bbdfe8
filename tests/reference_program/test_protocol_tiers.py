"""The Program protocol's host tier and victims: PLACE both ways, resuming from a replica, and victims
released or demoted under slot, page and host-budget pressure."""

from __future__ import annotations

from ninfer.contracts import ResourceChoice, TransitionKind
from ninfer.testing.protocol_driving import (assert_baseline, assert_same, cold, finish, generate, materialize,
                                             published, run)


def test_host_tier_place_and_resume(make_program, prompt_of, model32):
    prog, base = make_program(), prompt_of(11)
    info = published(prog, base)
    free, pages = len(prog.slots.free), prog.alloc.available
    run(prog, ResourceChoice(TransitionKind.PLACE, source=info.id))
    # the replica holds the GDN state and all 3 KV pages; the device original is dropped
    assert prog.ckpts[info.id].slot is None and len(prog.slots.free) == free + 1
    assert prog.alloc.available == pages + 3 and prog.ckpts[info.id].table == []
    assert prog.checkpoint_info(info.id).host_bytes == info.device_bytes == prog.host.bytes_for(3)
    prompt = base + (3, 4, 5)
    r = materialize(prog, prompt, source=info.id)  # two stages: copy back from the host replica, then activate
    assert_same(generate(prog, r.handle, 3), cold(model32, prompt, 3))
    finish(prog, r.handle)
    run(prog, ResourceChoice(TransitionKind.PLACE, source=info.id))
    assert prog.ckpts[info.id].slot is not None and not prog.host.entries


def test_victims_released_or_demoted_under_pressure(make_program, prompt_of):
    prog = make_program(max_concurrency=1, checkpoint_slots=0, kv_pages=12, page_size=4, max_context=48)
    info = published(prog, prompt_of(16), max_new=4)
    # Slots short (2 total, the checkpoint holds one, the request wants a capture too), pages fine: the victim the
    # ResourceManager wants demoted moves to the host tier.
    r = materialize(prog, prompt_of(8, seed=1), max_new=4, victims=(info.id,), capture_victims=1,
                    demote=frozenset({info.id}))
    assert r.released == () and prog.ckpts[info.id].slot is None and r.captures == (8,)
    assert [p.id for p in r.placed] == [info.id] and r.placed[0].host_bytes == prog.host.bytes_for(4)
    finish(prog, r.handle)
    # A host replica holds no page: pages short, it is neither needed nor touched.
    r = materialize(prog, prompt_of(30, seed=2), max_new=10, victims=(info.id,))
    assert r.released == () and prog.ckpts[info.id].slot is None
    finish(prog, r.handle)
    run(prog, ResourceChoice(TransitionKind.DELETE, victims=(info.id,)))
    # Pages short and the victim not listed for demotion: it is released.
    info = published(prog, prompt_of(16), max_new=4)
    r = materialize(prog, prompt_of(30, seed=2), max_new=10, victims=(info.id,))
    assert r.released == (info.id,) and not prog.ckpts and not prog.host.entries
    finish(prog, r.handle)
    assert_baseline(prog)


def test_pages_short_a_demoted_victim_frees_its_kv_pages(make_program, prompt_of):
    prog = make_program(max_concurrency=1, checkpoint_slots=0, kv_pages=12, page_size=4, max_context=48)
    info = published(prog, prompt_of(16), max_new=4)
    r = materialize(prog, prompt_of(30, seed=2), max_new=10, victims=(info.id,), demote=frozenset({info.id}))
    assert r.released == () and [p.id for p in r.placed] == [info.id] and prog.ckpts[info.id].table == []
    finish(prog, r.handle)
    assert_baseline(prog)


def test_a_full_host_tier_makes_room_by_the_replicas_below(make_program, prompt_of):
    """A demotion that does not fit the host tier deletes host replicas ranked below it; one ranked above it stays,
    and the victim is deleted instead."""
    prog = make_program(max_concurrency=1, checkpoint_slots=2, kv_pages=40, page_size=4, max_context=48)
    infos = []
    for seed in range(3):  # 3 checkpoints hold 3 of the 4 allocatable slots
        infos.append(published(prog, prompt_of(16, seed=seed), max_new=4))
    a, b, c = (i.id for i in infos)
    prog.host.budget = prog.host.bytes_for(4)  # room for one replica of 4 pages
    run(prog, ResourceChoice(TransitionKind.PLACE, source=a))
    # the live slot and two captures need one slot more than the 2 free: b gives way, and its demotion deletes the
    # replica of a (ranked below it) to fit
    r = materialize(prog, prompt_of(12, seed=9), max_new=4, victims=(a, b), capture_victims=2, captures=(4, 8),
                    demote=frozenset({b}))
    assert r.released == (a,) and [p.id for p in r.placed] == [b] and prog.ckpts[b].slot is None
    finish(prog, r.handle)
    # three captures need one slot more than the 3 free: c gives way, but the replica of b ranks above it, so c
    # is deleted and b stays
    r = materialize(prog, prompt_of(16, seed=8), max_new=4, victims=(c, b), capture_victims=2, captures=(4, 8, 12),
                    demote=frozenset({c}))
    assert r.released == (c,) and r.placed == () and prog.ckpts[b].slot is None and r.captures == (4, 8, 12)
    finish(prog, r.handle)
    assert_baseline(prog)


def test_a_victim_demoted_then_deleted_in_one_room_is_reported_released_only(make_program, prompt_of):
    """The first capture's slot demotes b; the second's demotes c, which needs b's host room: b is released, and the
    result does not also report it placed (the ResourceManager would adopt a placement of a released checkpoint)."""
    prog = make_program(max_concurrency=1, checkpoint_slots=2, kv_pages=40, page_size=4, max_context=48)
    ids = []
    for seed in range(3):
        ids.append(published(prog, prompt_of(16, seed=seed), max_new=4).id)
    _, b, c = ids
    prog.host.budget = prog.host.bytes_for(4)
    r = materialize(prog, prompt_of(12, seed=9), max_new=4, victims=(b, c), capture_victims=2, captures=(4, 8),
                    demote=frozenset({b, c}))
    assert r.captures == (4, 8) and r.released == (b,) and [p.id for p in r.placed] == [c]
    finish(prog, r.handle)
    assert_baseline(prog)


def test_room_already_made_releases_no_victim(make_program, prompt_of):
    """A materialization whose pages are free exactly (free == need) displaces none of its victims: a victim goes
    only while the pool is short, so an exact fit keeps the cached checkpoint."""
    prog = make_program(kv_pages=24, host_bytes=0)
    info = published(prog, prompt_of(12, seed=1))
    free = prog.free_pages()
    assert free > 3
    result = materialize(prog, prompt_of(free * 4 - 8, seed=2), max_new=8, victims=(info.id,), captures=())
    assert result.succeeded and result.released == () and info.id in prog.ckpts, result
    assert prog.free_pages() == 0
    prog.check_invariants()


def test_a_replica_that_fits_the_free_pages_exactly_is_promoted(make_program, prompt_of):
    """Promotion needs as many free pages as the replica holds: with exactly that many free (an active sequence
    reserves the rest) the replica comes back to the device."""
    prog = make_program(kv_pages=24)
    info = published(prog, prompt_of(11))
    run(prog, ResourceChoice(TransitionKind.PLACE, source=info.id))
    n = prog.host.entries[info.id.value].n_pages
    materialize(prog, prompt_of((prog.free_pages() - n) * 4 - 8, seed=2), max_new=8, captures=())
    assert prog.free_pages() == n
    result = run(prog, ResourceChoice(TransitionKind.PLACE, source=info.id))
    assert result.succeeded and prog.ckpts[info.id].slot is not None and not prog.host.entries, result
    prog.check_invariants()
