"""The cost model's verdicts on the Program's physical facts (pure Python): a host replica is copied in when that
beats prefilling from the deepest device checkpoint below it (or root), a checkpoint leaving the device is demoted
only when copying it out and back beats recomputing it, and a promotion follows the same verdict and waits for the
Program's resources to change after it did not fit."""

from __future__ import annotations

import pytest

from ninfer.contracts import CheckpointId, CheckpointInfo, CostFacts, ResourceResult, TransitionKind, token_digest
from ninfer.engine.cost_model import CostModel, Verdict
from ninfer.engine.resource_manager import ResourceManager

PROMPT = tuple(range(1, 400))
FAST_COPY = CostFacts(copy_bytes_per_s=1e10, copy_latency_s=1e-5, prefill_tokens_per_s=1e4)
SLOW_COPY = CostFacts(copy_bytes_per_s=1e6, copy_latency_s=1e-5, prefill_tokens_per_s=1e4)


def info(cid: int, tokens: int, device: int = 0, host: int = 0) -> CheckpointInfo:
    return CheckpointInfo(CheckpointId(cid), tokens, token_digest(PROMPT[:tokens]), device, host)


def manager(facts: CostFacts, *infos: CheckpointInfo, key: str | None = None) -> ResourceManager:
    rm = ResourceManager(1, costs=facts)
    for i, ck in enumerate(infos):
        rm.adopt(ResourceResult(i, TransitionKind.RETAIN, True, 0, published=(ck,)), rid=100 + i, lane=None,
                 session_key=key, publication_order=i)
    return rm


def test_prefill_and_copy_times_follow_the_facts():
    m = CostModel(FAST_COPY)
    assert m.copy_s(10**10) == pytest.approx(1.0 + 1e-5)
    assert m.prefill_s(0, 100) == pytest.approx(100 * (1 + 100 / 8192) / 1e4)
    assert m.prefill_s(8000, 8100) > m.prefill_s(0, 100)  # deeper tokens cost more (attention)


def test_resume_copies_a_replica_only_when_that_beats_the_prefill_of_the_gap():
    replica = info(1, 300, host=4 << 20)  # 4 MiB: 0.4 ms at 10 GB/s, 4 s at 1 MB/s
    assert CostModel(FAST_COPY).resume(replica, 0) is Verdict.PROMOTE  # 30 ms of prefill saved
    assert CostModel(SLOW_COPY).resume(replica, 0) is Verdict.RECOMPUTE
    assert CostModel(FAST_COPY).resume(replica, 298) is Verdict.RECOMPUTE  # 2 tokens (0.2 ms) from a device one


def test_leave_device_demotes_only_what_is_cheaper_to_copy_out_and_back():
    assert CostModel(FAST_COPY).leave_device(info(1, 300, device=4 << 20)) is Verdict.DEMOTE
    assert CostModel(SLOW_COPY).leave_device(info(1, 300, device=4 << 20)) is Verdict.DELETE
    # a short checkpoint whose bytes are its fixed GDN state: recomputing 3 tokens is cheaper than 2 copies
    assert CostModel(FAST_COPY).leave_device(info(1, 3, device=4 << 20)) is Verdict.DELETE


def test_find_source_weighs_a_deeper_replica_against_the_device_checkpoint_below():
    shallow, deep = info(1, 100, device=1 << 20), info(2, 300, host=4 << 20)
    assert manager(FAST_COPY, shallow, deep).find_source(PROMPT, None).info.id == deep.id
    assert manager(SLOW_COPY, shallow, deep).find_source(PROMPT, None).info.id == shallow.id
    assert manager(SLOW_COPY, deep).find_source(PROMPT, None) is None  # recomputing from root beats the copy
    # the session binding (a replica) is weighed the same way against the device checkpoint below it
    rm = manager(SLOW_COPY, shallow)
    rm.adopt(ResourceResult(9, TransitionKind.RETAIN, True, 0, published=(deep,)), rid=9, lane=None,
             session_key="s", publication_order=9)
    assert rm.find_source(PROMPT, "s").info.id == shallow.id
    assert manager(FAST_COPY, shallow, deep, key="s").find_source(PROMPT, "s").info.id == deep.id
    # a device checkpoint deeper than every replica is taken without weighing
    assert manager(SLOW_COPY, deep, info(3, 350, device=1 << 20)).find_source(PROMPT, None).info.id == CheckpointId(3)


def test_demotion_follows_the_verdict():
    victim = info(1, 300, device=4 << 20)  # a session's binding: protected
    for facts, demoted in ((FAST_COPY, True), (SLOW_COPY, False)):
        choice = manager(facts, victim, key="s").materialize_choice(5, (7,) * 20, 2, None, None, 0)
        assert choice.victims == (victim.id,) and (victim.id in choice.demote) == demoted


def test_promotion_follows_the_verdict_and_waits_after_a_refusal():
    for facts, promoted in ((FAST_COPY, True), (SLOW_COPY, False)):
        rm = manager(facts, info(1, 300, host=4 << 20))
        rm.placement.earned(CheckpointId(1))  # a hit from the host queued it
        choice = rm.placement_choice(revision=3)
        assert (choice is not None) == promoted
        if promoted:
            assert choice.kind is TransitionKind.PLACE and choice.source == CheckpointId(1)
            rm.defer_placement(3)  # the Program had no room
            assert rm.placement_choice(revision=3) is None
            assert rm.placement_choice(revision=4) == choice


def test_cost_facts_are_checked():
    with pytest.raises(ValueError, match="positive rates"):
        CostFacts(copy_bytes_per_s=0)


def test_placement_queues_each_earned_replica_once_oldest_first():
    """The placement verdicts on their own: a replica that earns two hits queues once; a promoted one leaves the
    queue; one no longer worth the copy (here: back on the device already) is dropped on the way."""
    rm = manager(FAST_COPY, info(1, 300, host=4 << 20), info(2, 200, host=4 << 20), info(3, 100, device=4 << 20))
    placement = rm.placement
    for cid in (2, 1, 2, 3):
        placement.earned(CheckpointId(cid))
    assert placement.queue == [CheckpointId(2), CheckpointId(1), CheckpointId(3)]
    assert placement.choice(0, rm.catalog).source == CheckpointId(2)
    placement.placed(CheckpointId(2))
    assert placement.choice(0, rm.catalog).source == CheckpointId(1)
    placement.placed(CheckpointId(1))
    assert placement.choice(0, rm.catalog) is None and placement.queue == []
