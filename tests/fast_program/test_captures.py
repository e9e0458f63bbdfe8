"""Captures inside a prefill piece, on both Programs (with and without the MTP backend): the piece stays one model
call, whose checkpoints equal those a prefill cut at the same frontiers captures (every resume from them yields the
same tokens and logprobs, and equals the cold run); captures exactly on a piece or chunk boundary and one token
either side resume to the cold run, with and without MTP and DFlash."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from ninfer.contracts import ResourceChoice, RowDecision, TransitionKind
from ninfer.fast.program.config import GRAPHED_PREFILL_TOKENS
from ninfer.sampling import SamplingParams
from ninfer.testing.serving import run_transition as run

GREEDY = SamplingParams(temperature=0.0, logprobs=2)
ON_GPU = os.environ.get("NINFER_TEST_DEVICE") == "cuda" and torch.cuda.is_available()
# CPU: fp32 projections over different row counts round differently (~1e-5 on S); GPU: fp32 tl.dot is TF32
TOL, STATE_RTOL = (3e-2, 2e-2) if ON_GPU else (1e-5, 1e-4)
CAPTURES = (45, 13, 30)  # the prompt end, then two frontiers off the page (4) and chunk (64) grids


@pytest.fixture(params=["reference", "fast", "reference_mtp", "fast_mtp"])
def make(request, make_fast, make_reference, make_fast_spec, make_reference_spec):
    return {"reference": make_reference, "fast": make_fast, "reference_mtp": lambda: make_reference_spec(2),
            "fast_mtp": lambda: make_fast_spec(2)}[request.param]


def count_prefills(prog) -> list[tuple[int, int]]:
    """Every executor prefill call as (start, end), recorded as it happens."""
    calls, prefill = [], prog.executor.prefill

    def counted(seq, start, end, captures=()):
        calls.append((start, end))
        return prefill(seq, start, end, captures)
    prog.executor.prefill = counted
    return calls


def materialize(prog, prompt, rid, source=None, captures=()):
    return run(prog, ResourceChoice(TransitionKind.MATERIALIZE, request_id=rid, prompt=tuple(prompt),
                                    max_new_tokens=8, source=source, sampling=GREEDY, captures=captures))


def generate(prog, handle, n, pieces):
    """Prefill in the given piece sizes (the last one ends the prompt), then decode: n (token, logprob) pairs."""
    for size in pieces:
        batch = prog.prefill(handle, size)
    out = []
    while True:
        row = batch.rows[0]
        take = min(len(row.tokens), n - len(out))
        prog.commit(batch.take(), [RowDecision(take, len(out) + take == n)])
        out += [(t, lp) for t, lp in zip(row.tokens[:take], row.logprobs[:take])]
        prog.check_invariants()
        if len(out) == n:
            return out
        batch = prog.decode([handle])


def checkpoints(prog, prompt, pieces):
    """Serve `prompt` in `pieces` with CAPTURES reserved, publish them: {frontier: checkpoint id}."""
    r = materialize(prog, prompt, 1, captures=CAPTURES)
    assert sorted(r.captures) == sorted(CAPTURES)
    generate(prog, r.handle, 1, pieces)
    published = run(prog, ResourceChoice(TransitionKind.CAPTURE, handle=r.handle)).published
    run(prog, ResourceChoice(TransitionKind.RELEASE, handle=r.handle))
    return {info.tokens: info.id for info in published}


def flat(x) -> list[torch.Tensor]:
    """Every tensor of a store's slot state (tensors, GDN states, the MTP backend's KV and hidden), in order."""
    if isinstance(x, torch.Tensor):
        if x.is_pinned():  # a host copy queued without a host wait (fast/program/stores.py): wait before reading
            torch.cuda.synchronize()
        return [x.float()]
    if dataclasses.is_dataclass(x):
        x = [getattr(x, f.name) for f in dataclasses.fields(x)]
    elif isinstance(x, dict):
        x = [x[k] for k in sorted(x)]
    return [t for item in (x if isinstance(x, (list, tuple)) else ()) for t in flat(item)]


def assert_same_state(a, b):
    assert [t.shape for t in a] == [t.shape for t in b]
    assert all(torch.allclose(x.cpu(), y.cpu(), rtol=STATE_RTOL, atol=STATE_RTOL / 10) for x, y in zip(a, b))


def assert_same(got, want):
    assert [t for t, _ in got] == [t for t, _ in want]
    assert max(abs(a - b) for (_, a), (_, b) in zip(got, want)) < TOL


def test_a_capture_inside_a_piece_equals_one_captured_by_cutting(make, prompt_of):
    prompt = prompt_of(45, seed=21)
    one, cut = make(), make()
    one_calls, cut_calls = count_prefills(one), count_prefills(cut)
    mid = checkpoints(one, prompt, [64])
    assert one_calls == [(0, 45)]  # one model call for the whole prompt, the two inner captures filled in it
    by_cut = checkpoints(cut, prompt, [13, 17, 15])
    assert cut_calls == [(0, 13), (13, 30), (30, 45)]
    assert sorted(mid) == sorted(by_cut) == sorted(CAPTURES)
    for f in CAPTURES:  # the checkpoints' whole slot state (GDN, MTP hidden or backend state) is the cut one's
        assert_same_state(*(flat(p.store.load_slot(p.ckpts[ids[f]].slot)) for p, ids in ((one, mid), (cut, by_cut))))
    cold = make()
    for rid, f in enumerate(sorted(CAPTURES), start=2):
        resumed = prompt[:f] + prompt_of(6, seed=f)
        got = []
        for prog, ids in ((one, mid), (cut, by_cut)):
            r = materialize(prog, resumed, rid, source=ids[f])
            assert r.reused_tokens == f
            got.append(generate(prog, r.handle, 5, [64]))
            run(prog, ResourceChoice(TransitionKind.RELEASE, handle=r.handle))
        r = materialize(cold, resumed, rid)
        want = generate(cold, r.handle, 5, [64])
        run(cold, ResourceChoice(TransitionKind.RELEASE, handle=r.handle))
        assert_same(got[0], got[1])
        assert_same(got[0], want)
    for prog in (one, cut, cold):
        prog.check_invariants()


# The fast model prefills in pieces of max_prefill_tokens (64 or 128 here); the Engine cuts the 150-token prompt in
# chunks [0, 100) and [100, 150). Each triple puts a capture exactly on one boundary and one either side: a model
# piece boundary (64, 128 at pieces of 64: the live state between two pieces), a GDN chunk boundary inside a piece
# (64 at pieces of 128: gdn_chunk's cuts= on its own chunk grid), the end of the Engine's chunk (100: capture_due).
BOUNDARY_PROMPT, BOUNDARY_CHUNKS = 150, (100, 64)
BOUNDARIES = [(63, 64, 65), (127, 128, 129), (99, 100, 101)]


@pytest.fixture(params=["reference", "reference_mtp", "reference_dflash", "fast_64", "fast_128", "fast_mtp_64",
                        "fast_dflash_64"])
def make_boundary(request, make_fast, make_reference, make_fast_spec, make_reference_spec, make_fast_dflash,
                  make_reference_dflash):
    return {"reference": make_reference, "reference_mtp": lambda: make_reference_spec(2),
            "reference_dflash": lambda: make_reference_dflash("dflash", 15),
            "fast_64": lambda: make_fast(max_prefill_tokens=64), "fast_128": lambda: make_fast(max_prefill_tokens=128),
            "fast_mtp_64": lambda: make_fast_spec(2, max_prefill_tokens=64),
            "fast_dflash_64": lambda: make_fast_dflash("dflash", 15, max_prefill_tokens=64)}[request.param]


def test_a_capture_on_or_beside_a_piece_boundary_resumes_as_the_cold_run(make_boundary, prompt_of):
    prompt, cold = prompt_of(BOUNDARY_PROMPT, seed=5), make_boundary()
    for rid, frontiers in enumerate(BOUNDARIES, start=1):
        prog = make_boundary()
        r = materialize(prog, prompt, rid, captures=frontiers)
        assert sorted(r.captures) == sorted(frontiers)
        generate(prog, r.handle, 1, BOUNDARY_CHUNKS)
        published = run(prog, ResourceChoice(TransitionKind.CAPTURE, handle=r.handle)).published
        run(prog, ResourceChoice(TransitionKind.RELEASE, handle=r.handle))
        ids = {info.tokens: info.id for info in published}
        assert set(frontiers) <= set(ids)
        for f in frontiers:
            resumed = prompt[:f] + prompt_of(6, seed=f)
            r = materialize(prog, resumed, 10 + f, source=ids[f])
            assert r.reused_tokens == f
            got = generate(prog, r.handle, 5, [64])
            run(prog, ResourceChoice(TransitionKind.RELEASE, handle=r.handle))
            r = materialize(cold, resumed, 10 + f)
            want = generate(cold, r.handle, 5, [256])
            run(cold, ResourceChoice(TransitionKind.RELEASE, handle=r.handle))
            assert_same(got, want), f
        prog.check_invariants()
    cold.check_invariants()


def test_the_fast_program_prefills_short_pieces_through_its_graphs(make_fast, prompt_of):
    """A piece up to the largest bucket (128 here) runs the prefill graphs' padded body, cut at each capture inside
    it (the checkpoints equal the eager Program's); a longer piece, or a Program without prefill graphs, runs
    eagerly."""
    graphed, eager = make_fast(prefill_graph_tokens=128), make_fast(prefill_graph_tokens=0)
    assert graphed.pieces.buckets == (64, 128) and eager.pieces is None
    assert (make_fast().pieces is not None) == ON_GPU  # by default graphed on CUDA only
    # 512, capped by the 256-token context
    assert make_fast(prefill_graph_tokens=GRAPHED_PREFILL_TOKENS).pieces.buckets == (64, 128, 256)
    runs, run_piece = [], graphed.pieces.run
    graphed.pieces.run = lambda tokens, slot, row, start: runs.append((start, start + len(tokens))) or \
        run_piece(tokens, slot, row, start)
    prompt = prompt_of(45, seed=21)
    ids = [checkpoints(p, prompt, [64]) for p in (graphed, eager)]
    assert runs == [(0, 13), (13, 30), (30, 45)]
    for f in CAPTURES:
        assert_same_state(*(flat(p.store.load_slot(p.ckpts[i[f]].slot)) for p, i in zip((graphed, eager), ids)))
    runs.clear()
    r = materialize(graphed, prompt_of(150, seed=3), 9)
    generate(graphed, r.handle, 2, [150])
    assert runs == []  # 150 tokens: past the largest bucket, one eager piece
