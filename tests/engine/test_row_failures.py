"""A row whose token cannot be drawn ends its request alone: a typed finish, the batch's other rows unharmed, the
Engine serving on and its pools drained (the reference and fast Programs: tests/fast_program/test_row_failures.py)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.contracts import (BatchKind, EngineFailure, FinishReason, PendingBatch, PendingRow, RowDecision,
                              RowFailure, SequenceHandle)
from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.engine.records import GenerationRequest
from ninfer.testing.serving import assert_drained
from ninfer.testing.sessions import TokenSession
from ninfer.testing.toy_program import ToyProgram

VOCAB = 97
NOTHING = [False] * VOCAB


def _request(prompt, max_tokens=8, mask=None):
    return GenerationRequest(tuple(prompt), TokenSession(max_tokens, mask=mask), max_tokens)


def _serve(requests, **cfg):
    program = ToyProgram(max_concurrency=4, vocab=VOCAB)
    engine = Engine(program, EngineConfig(check_invariants=True, max_concurrency=4, prefill_chunk=4, **cfg),
                    threaded=False)
    handles = [engine.submit(r) for r in requests]
    engine.run_until_idle()
    results = [h.result(timeout=0) for h in handles]
    assert engine.available, engine.failure
    assert engine.outstanding == 0
    assert_drained(program)
    return results, engine


@pytest.mark.parametrize("fail_after", [0, 2])  # 0: the prefill draw fails; 2: a decode round of three rows
def test_one_failed_row_ends_its_request_alone(fail_after):
    prompts = [range(1, 9), range(3, 14), range(5, 11)]
    alone, _ = _serve([_request(p) for p in prompts])
    mask = lambda n: NOTHING if n >= fail_after else None  # noqa: E731
    got, engine = _serve([_request(prompts[0]), _request(prompts[1], mask=mask), _request(prompts[2])])
    failed = got[1]
    assert failed.finish_reason is FinishReason.ERROR and failed.failure is RowFailure.NOTHING_ALLOWED
    assert "sampling failed" in failed.error
    assert failed.token_ids == alone[1].token_ids[:fail_after], "the tokens before the failure stay committed"
    assert [got[0].token_ids, got[2].token_ids] == [alone[0].token_ids, alone[2].token_ids]
    assert got[0].failure is got[2].failure is None
    # the Engine serves on
    again, _ = _serve([_request(prompts[1])])
    assert again[0].token_ids == alone[1].token_ids


def test_a_failed_row_needs_a_cancelled_row_decision():
    row = PendingRow.failed(SequenceHandle(0, 1), 5, RowFailure.NON_FINITE_LOGITS)
    batch = PendingBatch(BatchKind.DECODE, (row, PendingRow(SequenceHandle(1, 1), (4,), 7)), 0)
    batch.check_decisions([RowDecision(0, True, cancelled=True), RowDecision(1, False)])
    with pytest.raises(EngineFailure, match="cancelled-row decision"):
        batch.check_decisions([RowDecision(0, True), RowDecision(1, False)])
    with pytest.raises(EngineFailure, match="failed row"):
        PendingBatch(BatchKind.DECODE, (PendingRow(SequenceHandle(0, 1), (3,), 5, failure=RowFailure.NOTHING_ALLOWED),),
                     0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(3, 14), st.one_of(st.none(), st.integers(0, 7))), min_size=1, max_size=6),
       st.integers(1, 6), st.integers(1, 4))
def test_failed_rows_never_touch_the_other_requests(shape, prefill_chunk, concurrency):
    """Any mix of requests, each failing at some token or never, at any concurrency and chunk size: a failing
    request ends with NOTHING_ALLOWED and the tokens it had; every other one produces exactly what it produces
    when no request fails; the pools drain."""
    prompts = [range(1 + i, 1 + i + n) for i, (n, _) in enumerate(shape)]

    def run(fail: bool):
        program = ToyProgram(max_concurrency=concurrency, vocab=VOCAB)
        engine = Engine(program, EngineConfig(check_invariants=True, max_concurrency=concurrency,
                                              prefill_chunk=prefill_chunk), threaded=False)
        reqs = []
        for p, (_, at) in zip(prompts, shape):
            mask = (lambda n, at=at: NOTHING if n >= at else None) if fail and at is not None else None
            reqs.append(_request(p, 8, mask))
        handles = [engine.submit(r) for r in reqs]
        engine.run_until_idle()
        results = [h.result(timeout=0) for h in handles]
        assert engine.available and engine.outstanding == 0, engine.failure
        assert_drained(program)
        return results

    clean, got = run(False), run(True)
    for (_, at), want, r in zip(shape, clean, got):
        if at is None or at >= len(want.token_ids):
            assert r.failure is None and r.token_ids == want.token_ids
        else:
            assert r.failure is RowFailure.NOTHING_ALLOWED and r.finish_reason is FinishReason.ERROR
            assert r.token_ids == want.token_ids[:at]
