"""The reference Program under the real Engine: prefix and session hits equal the cold run, concurrency does not
change greedy outputs, and every page and slot comes back after drain."""

from __future__ import annotations

import pytest

from ninfer.contracts import FinishReason
from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.testing.serving import assert_drained, cold, in_turns, serve
from ninfer.sampling import SamplingParams
from ninfer.testing.sessions import token_request


@pytest.mark.parametrize("base_len, chunk, reused", [(12, 5, 12), (100, 48, 64)])
def test_prefix_hit_equals_cold_run(make_program, prompt_of, base_len, chunk, reused):
    """A short prompt resumes from its prompt-end checkpoint; a long one that diverges after 80 tokens resumes
    from the chunk-boundary checkpoint at 64."""
    base = prompt_of(base_len, seed=11)
    second = base[:min(base_len, 80)] + prompt_of(9, seed=12)
    program = make_program()
    first, hit = in_turns(program, [[token_request(base, 4)], [token_request(second, 6)]], max_concurrency=2,
                          prefill_chunk=chunk)
    assert hit[0].usage.cached_prompt_tokens == reused
    assert hit[0].token_ids == cold(make_program, second, 6)
    assert first[0].token_ids == cold(make_program, base, 4)
    assert_drained(program)


def test_session_turns_equal_cold_runs(make_program, prompt_of):
    program = make_program()
    engine = Engine(program, EngineConfig(max_concurrency=2, prefill_chunk=8, check_invariants=True),
                    threaded=False)
    prompt = prompt_of(10, seed=21)
    for turn in range(3):
        handle = engine.submit(token_request(prompt, 5, session_key="chat"))
        engine.run_until_idle()
        result = handle.result(timeout=0)
        assert result.token_ids == cold(make_program, prompt, 5), f"turn {turn}"
        if turn:  # resumed from the retained conversation: all but the new 4 tokens and the last output
            assert result.usage.cached_prompt_tokens == len(prompt) - 5
        prompt = prompt + result.token_ids + prompt_of(4, seed=30 + turn)
    assert engine.available, engine.failure
    assert_drained(program)


def test_concurrency_does_not_change_greedy_outputs(make_program, prompt_of):
    shared = prompt_of(20, seed=40)
    prompts = [shared + prompt_of(n, seed=41 + n) for n in (1, 6, 13)] + [prompt_of(30, seed=50)]
    program = make_program(max_concurrency=3)
    results = serve(program, [token_request(p, 7) for p in prompts], max_concurrency=3, prefill_chunk=6,
                       concurrent_prefill=True)
    for p, r in zip(prompts, results):
        assert r.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
        assert r.token_ids == cold(make_program, p, 7)
    assert_drained(program)


def test_pressure_drains_back_to_baseline(make_program, prompt_of):
    """Few pages and slots: admissions wait, release victims and backfill, and everything comes back."""
    program = make_program(max_concurrency=2, kv_pages=16, checkpoint_slots=1, page_size=4, max_context=40)
    prompts = [prompt_of(n, seed=60 + n) for n in (9, 17, 5, 22, 13)]
    results = serve(program, [token_request(p, 8) for p in prompts], max_concurrency=2, prefill_chunk=7)
    for p, r in zip(prompts, results):
        assert r.token_ids == cold(make_program, p, 8)
    assert_drained(program)


def _sync_and_overlapped(make, prompts, max_tokens: int, max_concurrency: int):
    """Each prompt's seeded sampled tokens served without and with async scheduling (a fresh Program from `make`
    each time, drained after), and the second Program."""
    def run(overlap: bool):
        program = make()
        requests = [token_request(p, max_tokens, seed=i, sampling=SamplingParams(temperature=0.8)) for i, p in
                    enumerate(prompts)]
        results = serve(program, requests, max_concurrency=max_concurrency, prefill_chunk=5,
                        async_scheduling=overlap)
        assert_drained(program)
        return [r.token_ids for r in results], program

    return run(False)[0], *run(True)


def test_async_scheduling_on_the_reference_program_equals_the_synchronous_run(make_program, prompt_of):
    """The reference executor has no device queue: its launched round runs at launch time (docs/engine.md "Async
    scheduling"), adopted by the next decode; seeded sampling and prefix hits give the same tokens."""
    shared = prompt_of(12, seed=60)
    prompts = [shared + prompt_of(n, seed=61 + n) for n in (2, 5)] + [prompt_of(9, seed=70)]
    sync, overlapped, program = _sync_and_overlapped(lambda: make_program(max_concurrency=3), prompts, 8, 3)
    assert overlapped == sync and program.ahead_adopted > 0


def test_async_scheduling_with_mtp_on_the_reference_program_equals_the_synchronous_run(make_spec, prompt_of):
    """Speculative rounds launched ahead on the reference executor (drafted, verified and accepted on the host at
    launch, adopted by the next decode): seeded sampling with random acceptance lengths gives the same tokens."""
    prompts = [prompt_of(n, seed=80 + n) for n in (7, 11)]
    sync, overlapped, program = _sync_and_overlapped(lambda: make_spec(3, forced=True), prompts, 10, 2)
    assert overlapped == sync and program.ahead_adopted > 0
