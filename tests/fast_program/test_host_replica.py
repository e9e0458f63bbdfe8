"""A checkpoint resumed from its host replica equals the same checkpoint resumed from the device, token for token
and logprob for logprob, on both Programs: demotion (PLACE to the host) copies the GDN state and every KV page and
drops the device original (its pages go back to the allocator, and are poisoned here so that nothing can read
them), the resume from the host copies the replica into fresh pages through the same materialization, and
promotion (PLACE back) rebuilds the device checkpoint from the replica."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from ninfer.contracts import CostFacts, ResourceChoice, RowDecision, TransitionKind
from ninfer.sampling import SamplingParams
from ninfer.testing.serving import run_transition as run

LOGPROBS = SamplingParams(temperature=0.0, logprobs=2)
ON_GPU = os.environ.get("NINFER_TEST_DEVICE") == "cuda" and torch.cuda.is_available()


def generate(program, prompt, n, source=None, captures=()):
    """Resume (or start) a sequence, prefill in chunks of 5, decode until n tokens: (handle, tokens, logprobs)."""
    r = run(program, ResourceChoice(TransitionKind.MATERIALIZE, request_id=1, prompt=prompt, max_new_tokens=n,
                                    source=source, captures=captures, sampling=LOGPROBS))
    batch = None
    while batch is None:
        batch = program.prefill(r.handle, 5)
    tokens, lps = [], []
    while True:
        tokens.append(batch.rows[0].tokens[0])
        lps.append(batch.rows[0].logprobs[0])
        program.commit(batch.take(), [RowDecision(1, len(tokens) == n)])
        if len(tokens) == n:
            return r.handle, tokens, lps
        batch = program.decode([r.handle])


def poison_free_pages(program) -> None:
    """NaN into every free KV page (of every pipeline stage): a resume that read a dropped device page would show
    it."""
    free = list(program.alloc.free)
    program.store.store_pages(free, _nan_like(program.store.load_pages(free)))


def _nan_like(data):
    """NaN tensors of `data`'s structure (the reference Program's staged replica nests each plane's K and V)."""
    if isinstance(data, torch.Tensor):
        return torch.full_like(data, float("nan"))
    return tuple(_nan_like(part) for part in data)


def resume_runs(program, prompt_of):
    """The same continuation resumed from the device, from the host replica (device pages dropped and poisoned),
    and from the device again after promotion."""
    base = prompt_of(13, seed=3)  # 13 % 4: the device resume copies a partial page too
    handle, _, _ = generate(program, base, 2, captures=(len(base),))
    (info,) = run(program, ResourceChoice(TransitionKind.CAPTURE, handle=handle)).published
    run(program, ResourceChoice(TransitionKind.RELEASE, handle=handle))
    prompt = base + prompt_of(6, seed=4)
    pages = program.config.pages_for(len(base))
    runs = []
    for tier in ("device", "host", "device again"):
        if tier != "device":
            free = program.alloc.available
            run(program, ResourceChoice(TransitionKind.PLACE, source=info.id))  # demote, then promote back
            assert program.alloc.available == free + (pages if tier == "host" else -pages)
        on_device = program.checkpoint_info(info.id).on_device
        assert on_device == (tier != "host")
        if tier == "host":
            assert program.ckpts[info.id].table == [] and program.checkpoint_info(info.id).host_bytes == \
                program.host.bytes_for(pages) == info.device_bytes
            poison_free_pages(program)
        h, tokens, lps = generate(program, prompt, 5, source=info.id)
        runs.append((tokens, lps))
        run(program, ResourceChoice(TransitionKind.RELEASE, handle=h))
    usage = program.resource_usage()
    assert usage.checkpoints == 1 and usage.host_checkpoints == 0 and usage.active_sequences == 0
    return runs


def _program(kind, make_fast, make_reference, stage_devices):
    if kind == "fast staged":  # two pipeline stages: a replica holds each rank's pages and slot state
        return make_fast(devices=stage_devices(2))
    if kind == "fast 3 stages":  # one layer each (GDN, attention, GDN): empty KV planes and an empty GDN pool
        return make_fast(devices=stage_devices(3))
    if kind == "reference 3 stages":
        return make_reference(devices=("cpu",) * 3)
    return make_fast() if kind == "fast" else make_reference()


@pytest.mark.parametrize("kind", ["reference", "fast", "fast staged", "fast 3 stages", "reference 3 stages"])
def test_resume_from_the_host_replica_equals_resume_from_the_device(make_fast, make_reference, stage_devices,
                                                                     prompt_of, kind):
    program = _program(kind, make_fast, make_reference, stage_devices)
    runs = resume_runs(program, prompt_of)
    assert runs[0] == runs[1] == runs[2]  # exactly: the replica holds the very bytes of the device state
    if kind == "fast 3 stages":
        assert [p.conv.shape[0] for p in program.model.ranks] == [1, 0, 1]
        assert [p.k.shape[0] for p in program.model.ranks] == [0, 1, 0]
    if kind == "reference 3 stages":
        assert [len(r.layers) for r in program.states.ranks] == [1, 0, 1]


@pytest.mark.parametrize("kind", ["reference", "fast", "fast staged"])
def test_a_replica_missing_one_page_is_caught(make_fast, make_reference, stage_devices, prompt_of, kind,
                                              monkeypatch):
    """The planted bug: demotion copies every page but the last (it keeps the pool's stale contents), so the
    resume from the host differs from the device one (over stages: the last page of the last stage's plane)."""
    program = _program(kind, make_fast, make_reference, stage_devices)
    load = program.store.load_pages

    def skip_last(pages):
        data = load(pages)  # page-major on both Programs: [n, ...]; over stages rank 1's K and V last
        for t in data[-2:]:
            t[-1].zero_()
        return data

    monkeypatch.setattr(program.store, "load_pages", skip_last)
    runs = resume_runs(program, prompt_of)
    assert runs[0] != runs[1]


@pytest.mark.skipif(not ON_GPU, reason="pinned host memory: the fast Program on CUDA (NINFER_TEST_DEVICE=cuda)")
def test_fast_replicas_are_pinned_host_memory(make_fast, prompt_of):
    program = make_fast()
    handle, _, _ = generate(program, prompt_of(9), 1, captures=(9,))
    (info,) = run(program, ResourceChoice(TransitionKind.CAPTURE, handle=handle)).published
    run(program, ResourceChoice(TransitionKind.RELEASE, handle=handle))
    run(program, ResourceChoice(TransitionKind.PLACE, source=info.id))
    replica = program.host.entries[info.id.value]
    tensors = [*replica.state, *replica.pages]
    assert all(t.device.type == "cpu" and t.is_pinned() for t in tensors)


def test_the_fast_program_measures_its_cost_facts_on_cuda(make_fast):
    """On CUDA the cost model's facts are measured at start; elsewhere the Program reports the generic fallback."""
    from ninfer.contracts import CostFacts

    costs = make_fast().limits.costs
    if ON_GPU:
        assert costs.measured and costs.copy_bytes_per_s > 1e8 and costs.prefill_tokens_per_s > 10
        assert 0 < costs.copy_latency_s < 0.1
    else:
        assert costs == CostFacts()


def test_the_fast_program_measures_its_prefill_signature_on_cuda(make_fast):
    """The chunk sizing's PrefillCosts: on CUDA measured at start (a plain decode step per B, a prefill model that
    predicts a timed piece within 3x: the tiny model's pieces are mostly launch latency; each prefill graph
    bucket's run, the shortest bucket faster than the eager shortest piece, and a graphed piece predicted within 3x;
    the decode round with a chunk riding, predicted within 3x); elsewhere the generic fallback."""
    import dataclasses
    import time

    from ninfer.contracts import PrefillCosts

    program = make_fast()
    costs = program.limits.prefill
    if not ON_GPU:
        assert costs == PrefillCosts()
        return
    assert costs.measured and costs.signature != "generic" and costs.max_piece == program.model.plan.max_prefill_tokens
    assert len(costs.decode_step_s) == program.limits.max_concurrency and all(0 < s < 0.1 for s in costs.decode_step_s)
    model, plan = program.model, program.model.plan
    ids = torch.zeros(192, dtype=torch.long, device=model.device)
    model.prefill(ids, plan.dummy_slot, plan.dummy_row, 0)
    torch.cuda.synchronize()
    t = time.perf_counter()
    model.prefill(ids, plan.dummy_slot, plan.dummy_row, 64)
    torch.cuda.synchronize()
    took = time.perf_counter() - t
    eager = dataclasses.replace(costs, graph_buckets=(), graph_piece_s=())  # the eager piece's fit alone
    assert took / 3 < eager.piece_s(192, 64) < 3 * took, (took, costs)
    pieces = program.pieces
    assert costs.graph_buckets == pieces.buckets and all(s > 0 for s in costs.graph_piece_s)
    # the launches an eager piece pays from Python: the shortest bucket's replay beats the eager shortest piece (the
    # fitted eager fixed cost can be 0 on a model this small, so the measured pieces are compared)
    assert costs.graph_piece_s[0] < costs.floor_s, costs
    assert pieces.graphs.keys() == set(pieces.buckets)
    pieces.run([1] * 100, plan.dummy_slot, plan.dummy_row, 64)
    torch.cuda.synchronize()
    t = time.perf_counter()
    pieces.run([1] * 100, plan.dummy_slot, plan.dummy_row, 64)
    torch.cuda.synchronize()
    took = time.perf_counter() - t
    assert took / 3 < costs.piece_s(100, 64) < 3 * took, (took, costs)
    # decode rounds carrying a chunk, timed per chunk length: a 100-token chunk beside two rows predicted within 3x
    graphed = program.mixed.buckets  # each graphed bucket, then the eager lengths past them up to the piece
    assert costs.mixed_tokens == graphed + tuple(t for t in (64, 256, 512, 1024, 2048)
                                                 if graphed[-1] < t <= plan.max_prefill_tokens)
    rows = (torch.zeros(2, dtype=torch.long, device=model.device), [plan.dummy_slot] * 2, [plan.dummy_row] * 2,
            [70, 80])
    model.mixed(ids[:100], plan.dummy_slot, plan.dummy_row, 64, rows)
    torch.cuda.synchronize()
    t = time.perf_counter()
    model.mixed(ids[:100], plan.dummy_slot, plan.dummy_row, 64, rows)
    torch.cuda.synchronize()
    took = time.perf_counter() - t
    assert took / 3 < costs.mixed_s(100, 64, 2) < 3 * took, (took, costs)


def test_through_the_engine_a_demoted_conversation_resumes_from_its_replica(make_fast, prompt_of):
    """The fast Program behind the Engine: later conversations push an earlier one's checkpoints (state and KV
    pages) to the host, its next turn resumes from the replica, the replica is promoted back, and the output
    equals the cold run."""
    from ninfer.engine.config import EngineConfig
    from ninfer.engine.engine import Engine
    from ninfer.testing.serving import assert_drained, cold
    from ninfer.testing.sessions import token_request

    program = make_fast(max_concurrency=1, checkpoint_slots=1)
    # on CUDA the Program measures its costs, and recomputing this tiny model's tokens beats any copy, so the cost
    # model would rightly delete instead of demoting: the test pins costs under which a replica pays
    program.limits = dataclasses.replace(program.limits, costs=CostFacts(prefill_tokens_per_s=10.0))
    engine = Engine(program, EngineConfig(max_concurrency=1, prefill_chunk=8, check_invariants=True), threaded=False)

    def turns(seed: int, n: int) -> tuple[int, ...]:
        """n turns; each next prompt drops the last 2 tokens (the turn boundary is before them) and adds 9."""
        prompt = prompt_of(20, seed=seed)
        for t in range(n):
            engine.submit(token_request(prompt, 3, capture_hints=(len(prompt) - 2,)))
            engine.run_until_idle()
            last, prompt = prompt, prompt[:-2] + prompt_of(9, seed=seed * 100 + t)
        return last

    first = turns(7, 3)
    for seed in range(8, 11):
        turns(seed, 2)
    assert program.resource_usage().host_checkpoints > 0
    poison_free_pages(program)  # a page the replica failed to restore would keep NaN, not a stale right value
    prompt = first[:-2] + prompt_of(5, seed=99)
    handle = engine.submit(token_request(prompt, 3))
    engine.run_until_idle()
    result = handle.result(timeout=0)
    stats = engine.core.resources.stats
    assert result.usage.cached_prompt_tokens == len(first) - 2 and stats.host_resumes >= 1
    assert stats.demotions > 0 and stats.promotions >= 1
    assert result.token_ids == cold(make_fast, prompt, 3)
    assert_drained(program)
