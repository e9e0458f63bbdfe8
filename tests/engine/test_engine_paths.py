"""Directed Engine paths: lifecycle, exact-B rounds, prefix reuse, cancellation, overload, failure, control."""

import threading

import pytest

from ninfer.contracts import (FinishReason, GenerationResult, GenerationStart, OutputDelta, RejectReason,
                              RequestRejected)
from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.testing.faults import FaultyProgram
from ninfer.testing.toy_program import ToyProgram

from ninfer.testing.sessions import token_request as request


def _solo(prompt, max_tokens=6, **kw):
    eng = Engine(ToyProgram(), EngineConfig(max_concurrency=1, prefix_caching=False), threaded=False)
    h = eng.submit(request(prompt, max_tokens, **kw))
    eng.run_until_idle()
    return h.result(timeout=0)


def test_events_are_ordered_and_capacity_returns(make_engine):
    eng, prog = make_engine(max_concurrency=2, prefill_chunk=3)
    handles = [eng.submit(request(range(1, 10 + i), 5)) for i in range(5)]
    assert eng.outstanding == 5
    eng.run_until_idle()
    for h in handles:
        events = list(h.events(timeout=0))
        assert isinstance(events[0], GenerationStart) and isinstance(events[-1], GenerationResult)
        assert sum(isinstance(e, GenerationResult) for e in events) == 1
        streamed = tuple(t for e in events if isinstance(e, OutputDelta) for t in e.token_ids)
        assert streamed == events[-1].token_ids and len(streamed) <= 5
    assert eng.outstanding == 0
    usage = prog.resource_usage()
    assert usage.active_sequences == 0 and usage.reserved_pages == 0
    assert usage.free_pages + usage.checkpoint_pages == usage.total_pages


def test_decode_rounds_hold_exactly_the_decode_ready_requests(make_engine):
    eng, prog = make_engine(max_concurrency=4, prefill_chunk=64)
    sizes = []
    decode = prog.decode
    prog.decode = lambda handles, masks=None, *chunk: sizes.append(len(handles)) or decode(handles, masks, *chunk)
    for i in range(3):
        eng.submit(request(range(1, 5 + i), 8))
        eng.step()
    eng.run_until_idle()
    assert max(sizes) == 3 and {1, 2} <= set(sizes)  # each round holds every ready request: 1, 2, then all 3
    for b in sizes:
        assert 1 <= b <= 3  # exact B, never padded to max_concurrency=4


def test_prefix_hit_equals_cold_run_and_reports_reused_tokens(make_engine):
    eng, _ = make_engine(prefill_chunk=4)
    first = eng.submit(request(range(1, 30), 6))
    eng.run_until_idle()
    first_result = first.result(timeout=0)
    follow = tuple(range(1, 30)) + first_result.token_ids + (7, 8, 9)
    h = eng.submit(request(follow, 6))
    eng.run_until_idle()
    events = list(h.events(timeout=0))
    assert events[0].reused_prefix_tokens == 29  # the prompt-end checkpoint of the first request
    assert events[-1].usage.cached_prompt_tokens == 29
    assert events[-1].token_ids == _solo(follow).token_ids


def test_session_retention_resumes_the_whole_conversation(make_engine):
    eng, prog = make_engine(prefill_chunk=8)
    h = eng.submit(request(range(1, 12), 6, session_key="chat"))
    eng.run_until_idle()
    out = h.result(timeout=0).token_ids
    assert eng.core.resources.sessions["chat"]
    follow = tuple(range(1, 12)) + out + (40, 41)
    h2 = eng.submit(request(follow, 4, session_key="chat"))
    eng.run_until_idle()
    r2 = h2.result(timeout=0)
    assert r2.usage.cached_prompt_tokens == 11 + len(out) - 1  # everything the retained state consumed
    assert r2.token_ids == _solo(follow, 4).token_ids


def test_cancel_in_every_state(make_engine):
    eng, prog = make_engine(max_concurrency=1, prefill_chunk=2)
    active = eng.submit(request(range(1, 9), 20))
    waiting = eng.submit(request(range(1, 5), 3))
    eng.step()
    eng.step()
    waiting.cancel()
    active.cancel()
    eng.run_until_idle()
    assert waiting.result(timeout=0).finish_reason is FinishReason.CANCELLED
    r = active.result(timeout=0)
    assert r.finish_reason is FinishReason.CANCELLED
    assert eng.outstanding == 0 and prog.resource_usage().active_sequences == 0


def test_cancel_while_materializing_aborts_the_transition(make_engine):
    eng, prog = make_engine(max_concurrency=1, prefill_chunk=64)
    first = eng.submit(request(range(1, 20), 2))
    eng.run_until_idle()
    first.result(timeout=0)
    h = eng.submit(request(tuple(range(1, 20)) + (5, 5), 2))
    for _ in range(3):  # ingest, then stage 1 of the two-stage materialization from the checkpoint
        eng.step()
        if eng.core.txn is not None:
            break
    assert eng.core.txn is not None, "expected an open multi-stage materialization"
    h.cancel()
    eng.run_until_idle()
    assert h.result(timeout=0).finish_reason is FinishReason.CANCELLED
    assert eng.core.resources.lanes[0].value == "free"


def test_abandoned_handle_releases_capacity_without_calling_the_program(make_engine):
    eng, prog = make_engine(max_concurrency=1)
    h = eng.submit(request(range(1, 6), 50))
    eng.step()
    calls = prog.calls
    h.close()
    assert prog.calls == calls  # abandoning ran nothing on the consumer's side
    assert eng.outstanding == 1  # released only once the worker formed the final result
    eng.run_until_idle()
    assert eng.outstanding == 0


def test_overload_and_context_limits_are_request_level(make_engine):
    eng, _ = make_engine(max_concurrency=1, queue_bound=1)
    eng.submit(request([1, 2], 3))
    eng.submit(request([1, 2], 3))
    with pytest.raises(RequestRejected) as e:
        eng.submit(request([1, 2], 3))
    assert e.value.reason is RejectReason.OVERLOADED
    with pytest.raises(RequestRejected) as e:
        eng.submit(request([1] * 250, 10))
    assert e.value.reason is RejectReason.CONTEXT_TOO_LONG
    with pytest.raises(RequestRejected) as e:
        eng.submit(request([], 3))
    assert e.value.reason is RejectReason.UNREPRESENTABLE
    eng.run_until_idle()
    assert eng.available


def test_queue_timeout_and_deadline(make_engine, clock):
    eng, _ = make_engine(max_concurrency=1)
    long = eng.submit(request(range(1, 5), 30, deadline=clock.now + 5))
    queued = eng.submit(request(range(1, 5), 3, queue_timeout=1.0))
    eng.step()
    eng.step()
    clock.now += 2
    eng.step()
    assert queued.result(timeout=0).finish_reason is FinishReason.REJECTED
    clock.now += 10
    eng.run_until_idle()
    assert long.result(timeout=0).finish_reason in (FinishReason.DEADLINE, FinishReason.STOP)


def test_infeasible_request_is_rejected_and_others_continue(make_engine):
    prog = ToyProgram(max_concurrency=2, total_pages=8, page_size=4, max_context=256)
    eng, _ = make_engine(program=prog, max_concurrency=2)
    big = eng.submit(request(range(1, 60), 10))
    small = eng.submit(request(range(1, 6), 3))
    eng.run_until_idle()
    assert big.result(timeout=0).finish_reason is FinishReason.REJECTED
    assert small.result(timeout=0).finish_reason in (FinishReason.STOP, FinishReason.LENGTH)


def test_protected_head_and_proven_backfill(make_engine):
    # 16 pages. A holds 8 and is the donor; the head needs 14, so it waits. B (2 pages) may borrow: once A ends,
    # 16 - 2 >= 14. C (3 pages) fits right now but 2 + 3 + 14 > 16 would starve the head, so it must wait.
    prog = ToyProgram(max_concurrency=3, total_pages=16, page_size=4, checkpoint_slots=0)
    eng, _ = make_engine(program=prog, max_concurrency=3, prefix_caching=False)
    a = eng.submit(request(range(1, 21), 12))
    eng.step()
    eng.step()
    head = eng.submit(request(range(1, 51), 6))
    borrower = eng.submit(request([1, 2, 3], 4))
    late = eng.submit(request(range(1, 9), 4))
    for _ in range(3):
        eng.step()
    holding = {r.rid for r in eng.core.records.values() if r.lane is not None}
    assert eng.core.scheduler.protected_head == head.request_id
    assert eng.core.scheduler.donors == {a.request_id}
    assert borrower.request_id in holding and late.request_id not in holding
    eng.run_until_idle()
    for h in (a, head, borrower, late):
        assert h.result(timeout=0).finish_reason in (FinishReason.STOP, FinishReason.LENGTH)


def test_forced_control_goes_through_the_commit_order(make_engine):
    eng, _ = make_engine()
    h = eng.submit(request(range(1, 7), 8, think_budget=2))
    eng.run_until_idle()
    r = h.result(timeout=0)
    assert r.output["forced"] == ((1,),) or r.finish_reason is FinishReason.STOP
    assert r.token_ids == _solo(range(1, 7), 8, think_budget=2).token_ids


def test_program_fault_fails_the_engine_for_everyone(make_engine):
    prog = FaultyProgram(ToyProgram())
    eng, _ = make_engine(program=prog, max_concurrency=2)
    hs = [eng.submit(request(range(1, 9), 10)) for _ in range(3)]
    prog.arm("decode", 1)
    eng.run_until_idle()
    assert not eng.available and "injected fault" in eng.failure
    for h in hs:
        r = h.result(timeout=0)
        assert r.finish_reason is FinishReason.ERROR and "engine failed" in r.error
    with pytest.raises(RequestRejected) as e:
        eng.submit(request([1, 2], 2))
    assert e.value.reason is RejectReason.ENGINE_UNAVAILABLE
    assert eng.outstanding == 0


def test_threaded_engine_serves_concurrent_consumers():
    eng = Engine(ToyProgram(max_concurrency=4), EngineConfig(max_concurrency=4, check_invariants=True))
    results = {}

    def consume(i):
        results[i] = eng.submit(request(range(1, 6 + i), 6)).result(timeout=10)

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    eng.shutdown()
    assert len(results) == 8 and all(r.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
                                      for r in results.values())
    for i, r in results.items():
        assert r.token_ids == _solo(range(1, 6 + i)).token_ids
    assert eng.outstanding == 0


def test_retention_cap_deletes_the_oldest_checkpoints(make_engine):
    eng, prog = make_engine(max_cached_checkpoints=1)
    for start in (1, 30, 60):
        h = eng.submit(request(range(start, start + 9), 3))
        eng.run_until_idle()
        h.result(timeout=0)
    assert len(eng.core.resources.catalog) == 1 and len(prog.ckpts) == 1
    (entry,) = eng.core.resources.catalog.values()
    assert entry.info.tokens == 9  # the newest prompt-end checkpoint survives
    usage = prog.resource_usage()
    assert usage.free_pages + usage.checkpoint_pages == usage.total_pages


def test_a_source_that_does_not_fit_falls_back_to_root(make_engine):
    # 14 pages of 4. The 34-token prompt-end checkpoint holds 9 pages (its partial page included); a 50-token
    # prompt continuing it with 6 new tokens needs 14 pages: from the checkpoint 8 are shared but 6 more must be
    # free (only 5 are), from root with the checkpoint released all 14 are.
    prog = ToyProgram(max_concurrency=2, total_pages=14, page_size=4, checkpoint_slots=2)
    eng, _ = make_engine(program=prog, max_concurrency=2)
    first = tuple(range(1, 35))
    eng.submit(request(first, 1))
    eng.run_until_idle()
    assert [len(c.tokens) for c in prog.ckpts.values()] == [34]
    h = eng.submit(request(first + tuple(range(40, 56)), 6))
    eng.run_until_idle()
    assert eng.available, eng.failure
    r = h.result(timeout=0)
    assert r.finish_reason in (FinishReason.STOP, FinishReason.LENGTH) and r.usage.cached_prompt_tokens == 0
