"""The fast Program under the real Engine equals the reference Program on the same fp32 weights: greedy and
sampled tokens, logprobs, forced control, prefix and session hits, concurrency; every page and slot comes back."""

from __future__ import annotations

import os

import pytest
import torch

from ninfer.contracts import FinishReason, OutputDelta
from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.fast.program import FastProgram
from ninfer.sampling import SamplingParams
from ninfer.testing.serving import assert_drained as check_drained
from ninfer.testing.serving import cold, in_turns, serve
from ninfer.testing.sessions import token_request

ON_GPU = os.environ.get("NINFER_TEST_DEVICE") == "cuda" and torch.cuda.is_available()


def assert_drained(program):
    check_drained(program, published=True)


def test_triton_concurrency_3_equals_reference(make_fast, make_reference, prompt_of):
    """The Triton kernels (interpreted on CPU) at three concurrent sequences, staged prefill, shared prefixes."""
    shared = prompt_of(6, seed=40)
    prompts = [shared + prompt_of(n, seed=41 + n) for n in (1, 5)] + [prompt_of(9, seed=50)]
    reqs = lambda: [token_request(p, 3) for p in prompts]  # noqa: E731
    cfg = dict(max_concurrency=3, prefill_chunk=16, concurrent_prefill=True)
    fast = make_fast(kernels="triton", max_concurrency=3)
    got = serve(fast, reqs(), **cfg)
    want = serve(make_reference(max_concurrency=3), reqs(), **cfg)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert all(r.finish_reason in (FinishReason.STOP, FinishReason.LENGTH) for r in got)
    assert_drained(fast)


def test_greedy_from_artifact_equals_reference(artifact, make_reference, prompt_of):
    fast = FastProgram.from_artifact(artifact, max_concurrency=2, max_context=256, budget_bytes=1 << 30,
                                     device="cuda" if ON_GPU else "cpu",
                                     kernels="triton" if ON_GPU else "naive", page_size=4, kv_pages=160,
                                     checkpoint_slots=3, dtype=torch.float32)
    prompts = [prompt_of(n, seed=n) for n in (3, 17, 70)]
    got = serve(fast, [token_request(p, 9) for p in prompts], max_concurrency=2, prefill_chunk=11)
    want = serve(make_reference(), [token_request(p, 9) for p in prompts], max_concurrency=2, prefill_chunk=11)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert_drained(fast)




@pytest.mark.parametrize("base_len, keep, chunk, reused", [(12, 12, 5, 12), (13, 13, 5, 13), (100, 80, 48, 64),
                                                          (140, 130, 64, 128)])
def test_prefix_hit_equals_cold_run(make_fast, prompt_of, base_len, keep, chunk, reused):
    """A short prompt resumes from its prompt-end checkpoint (at 13 with its partial page copied); a long one that
    diverges later resumes from a 64-token boundary checkpoint: 64 inside a chunk (filled within the chunk's one
    model call), 128 at a chunk end."""
    base = prompt_of(base_len, seed=11)
    second = base[:keep] + prompt_of(9, seed=12)
    program = make_fast()
    first, hit = in_turns(program, [[token_request(base, 4)], [token_request(second, 6)]], max_concurrency=2,
                          prefill_chunk=chunk)
    assert hit[0].usage.cached_prompt_tokens == reused
    assert hit[0].token_ids == cold(make_fast, second, 6)
    assert first[0].token_ids == cold(make_fast, base, 4)
    assert_drained(program)


def test_session_turns_equal_cold_runs(make_fast, prompt_of):
    program = make_fast()
    engine = Engine(program, EngineConfig(max_concurrency=2, prefill_chunk=8, check_invariants=True), threaded=False)
    prompt = prompt_of(10, seed=21)
    for turn in range(3):
        handle = engine.submit(token_request(prompt, 5, session_key="chat"))
        engine.run_until_idle()
        result = handle.result(timeout=0)
        assert result.token_ids == cold(make_fast, prompt, 5), f"turn {turn}"
        if turn:  # resumed from the retained conversation: all but the new 4 tokens and the last output
            assert result.usage.cached_prompt_tokens == len(prompt) - 5
        prompt = prompt + result.token_ids + prompt_of(4, seed=30 + turn)
    assert engine.available, engine.failure
    assert_drained(program)


def _logprob_stream(program, requests, **config):
    """(token ids, logprobs, top alternatives) per request, gathered from its OutputDeltas."""
    engine = Engine(program, EngineConfig(check_invariants=True, **config), threaded=False)
    handles = [engine.submit(r) for r in requests]
    engine.run_until_idle()
    assert engine.available, engine.failure
    out = []
    for h in handles:
        deltas = [e for e in h.events(timeout=0) if isinstance(e, OutputDelta)]
        out.append((sum((d.token_ids for d in deltas), ()), sum((d.logprobs or () for d in deltas), ()),
                    sum((d.top_logprobs or () for d in deltas), ())))
    return out


def test_sampling_logprobs_and_forced_control_equal_reference(make_fast, make_reference, prompt_of):
    """Seeded sampling with logprobs and top alternatives, and a thinking budget that forces a control token."""
    params = SamplingParams(temperature=0.8, top_k=20, logprobs=2)
    reqs = lambda: [token_request(prompt_of(7, seed=3), 8, sampling=params, seed=5),  # noqa: E731
                    token_request(prompt_of(9, seed=4), 8, think_budget=3)]
    cfg = dict(max_concurrency=2, prefill_chunk=4)
    fast = make_fast()
    got, want = _logprob_stream(fast, reqs(), **cfg), _logprob_stream(make_reference(), reqs(), **cfg)
    assert [g[0] for g in got] == [w[0] for w in want]
    assert got[1][0][3] == 1, "the thinking budget forced no control token"
    (tokens, lps, tops), (_, ref_lps, ref_tops) = got[0], want[0]
    assert len(lps) == len(tops) == len(tokens) and not got[1][1], "logprobs only where asked, one per token"
    tol = 3e-2 if ON_GPU else 1e-3  # the GPU's fp32 tl.dot is TF32
    assert lps == pytest.approx(ref_lps, abs=tol)
    assert [t for alt in tops for t, _ in alt] == [t for alt in ref_tops for t, _ in alt]
    assert [lp for alt in tops for _, lp in alt] == pytest.approx([lp for alt in ref_tops for _, lp in alt], abs=tol)
    assert_drained(fast)


def test_penalties_bias_min_tokens_and_truncation_equal_reference(make_fast, make_reference, prompt_of):
    """Every draw on the device (prefill and decode): penalties whose counts follow each commit (a forced control
    token included), logit bias, a min_tokens block on EOS, top-p and min-p, greedy and seeded rows in one round."""
    P = SamplingParams
    params = [P(temperature=0.0, repetition_penalty=1.6, frequency_penalty=0.7, presence_penalty=0.4),
              P.create(temperature=0.9, top_p=0.85, min_p=0.02, logit_bias={0: 4.0, 5: -3.0}, min_tokens=4),
              P(temperature=1.2, top_k=7, frequency_penalty=-0.6)]
    # the first request's thinking budget forces a control token: forced outputs are counted too
    reqs = lambda: [token_request(prompt_of(n, seed=70 + n), 9, sampling=p, seed=n,  # noqa: E731
                                  think_budget=3 if n == 6 else None) for n, p in zip((6, 8, 5), params)]
    cfg = dict(max_concurrency=3, prefill_chunk=5)
    fast = make_fast(max_concurrency=3)
    got = [r.token_ids for r in serve(fast, reqs(), **cfg)]
    assert got == [r.token_ids for r in serve(make_reference(max_concurrency=3), reqs(), **cfg)]
    assert 0 not in got[1][:4], "min_tokens let EOS through"
    assert got[0][3] == 1, "the thinking budget forced no control token"
    assert_drained(fast)


def test_pressure_drains_back_to_baseline(make_fast, prompt_of):
    """Few pages and slots: admissions wait, release victims, move checkpoints to the host tier, and backfill."""
    small = dict(max_concurrency=2, kv_pages=16, checkpoint_slots=1, page_size=4, max_context=40)
    program = make_fast(**small)
    prompts = [prompt_of(n, seed=60 + n) for n in (9, 17, 5, 22, 13)]
    results = serve(program, [token_request(p, 8) for p in prompts], max_concurrency=2, prefill_chunk=7)
    for p, r in zip(prompts, results):
        assert r.token_ids == cold(lambda: make_fast(**small), p, 8)
    assert_drained(program)


@pytest.mark.parametrize("fail_after, caching", [(2, False), (0, True)])  # 0: the prefill draw fails
@pytest.mark.parametrize("which", ["reference", "fast"])
def test_a_failed_row_ends_its_request_alone(make_fast, make_reference, prompt_of, which, fail_after, caching):
    """Three requests in one decode round; from its third token on one request's mask allows nothing (a grammar,
    bias and min_tokens that exclude every token). That request ends alone with a typed failure; the other two
    produce what they produce without it, the Engine serves on, and every page and slot comes back."""
    from ninfer.contracts import RowFailure
    from ninfer.engine.records import GenerationRequest
    from ninfer.testing.sessions import TokenSession

    make = make_fast if which == "fast" else make_reference
    program = make(max_concurrency=3)
    nothing = torch.zeros(program.limits.vocab_size, dtype=torch.bool)
    prompts = [prompt_of(n, seed=90 + n) for n in (6, 9, 7)]

    def reqs(fail: bool):
        mask = (lambda n: nothing if n >= fail_after else None) if fail else None
        return [GenerationRequest(p, TokenSession(6, mask=mask if i == 1 else None), 6) for i, p in enumerate(prompts)]
    cfg = dict(max_concurrency=3, prefill_chunk=4, prefix_caching=caching)
    alone = serve(make(max_concurrency=3), reqs(False), **cfg)
    got = serve(program, reqs(True), **cfg)
    assert got[1].finish_reason is FinishReason.ERROR and got[1].failure is RowFailure.NOTHING_ALLOWED
    assert got[1].token_ids == alone[1].token_ids[:fail_after]
    assert [got[0].token_ids, got[2].token_ids] == [alone[0].token_ids, alone[2].token_ids]
    check_drained(program)


def test_nan_logits_end_one_request_alone(make_reference, prompt_of):
    """The model answers NaN for one row of a decode round of several rows (the fifth decode_step call): that request
    ends with NON_FINITE_LOGITS, the other rows are unchanged."""
    from ninfer.contracts import RowFailure

    prompts = [prompt_of(n, seed=110 + n) for n in (6, 9, 7)]
    cfg = dict(max_concurrency=3, prefill_chunk=16, prefix_caching=False)
    alone = serve(make_reference(max_concurrency=3), [token_request(p, 6) for p in prompts], **cfg)
    program = make_reference(max_concurrency=3)
    model = program.executor.model
    real, calls, rounds, poisoned_round = model.decode_step, [], [], []

    def poisoned(token, state, return_hidden=False, **kw):
        calls.append(token)
        logits, hidden = real(token, state, return_hidden=True, **kw)
        if len(calls) == 5:
            poisoned_round.append(rounds[-1])
            logits = torch.full_like(logits, float("nan"))
        return (logits, hidden) if return_hidden else logits
    model.decode_step = poisoned
    decode = program.decode
    program.decode = lambda handles, masks=None, *chunk: rounds.append(len(handles)) or decode(handles, masks, *chunk)
    got = serve(program, [token_request(p, 6) for p in prompts], **cfg)
    assert poisoned_round[0] > 1, "the poisoned row was alone in its round"
    failed = [r for r in got if r.failure is not None]
    assert len(failed) == 1 and failed[0].failure is RowFailure.NON_FINITE_LOGITS
    assert failed[0].finish_reason is FinishReason.ERROR
    i = got.index(failed[0])
    assert failed[0].token_ids == alone[i].token_ids[:len(failed[0].token_ids)]
    assert [r.token_ids for j, r in enumerate(got) if j != i] == [r.token_ids for j, r in enumerate(alone) if j != i]
    check_drained(program)
