"""Mixed units (`Program.decode(handles, prefill=PrefillChunk(...))`): the fast Program's one model pass over a
prefill chunk and the decode rows (`FastModel.mixed`) leaves the state and draws the chunk's own pass then the
round leave, at the model's logits too; the MIXED batch commits and aborts row by row like the PREFILL and DECODE
batches it stands for, on both Programs; a chunk that cannot ride the round is refused before anything moves."""

from __future__ import annotations

import os

import pytest
import torch

from ninfer.contracts import BatchKind, EngineFailure, PrefillChunk, ResourceChoice, RowDecision, TransitionKind
from ninfer.sampling import SamplingParams
from ninfer.testing.serving import run_transition as run

GREEDY = SamplingParams(temperature=0.0, logprobs=2)
ON_GPU = os.environ.get("NINFER_TEST_DEVICE") == "cuda" and torch.cuda.is_available()
# the one pass multiplies n + B rows where the two multiply n and B: fp32 rounds differently (GPU: tl.dot is TF32)
TOL = 3e-2 if ON_GPU else 1e-5
PROMPT_B, CHUNKS, CAPTURE = 20, (8, 8, 4), 13  # B's chunks: from 0 (slot reset), mid-prompt (capture 13), final


def materialize(program, prompt, rid, captures=()):
    return run(program, ResourceChoice(TransitionKind.MATERIALIZE, request_id=rid, prompt=tuple(prompt),
                                       max_new_tokens=8, sampling=GREEDY, captures=captures)).handle


def ready(program, prompt, rid):
    """A sequence past its prompt with its first output token committed (pending): a decode row."""
    handle = materialize(program, prompt, rid)
    program.commit(program.prefill(handle, len(prompt)).take(), [RowDecision(1, False)])
    return handle


def recorded(model, name):
    """Every output of `model.<name>` in call order (the instance's method wrapped): the logits each pass made."""
    outs, method = [], getattr(model, name)

    def call(*args, **kw):
        out = method(*args, **kw)
        outs.append(out.clone())
        return out
    setattr(model, name, call)
    return outs


def gdn_state(program, slot):
    """A GDN slot's conv window and S of every GDN layer."""
    pools = program.model.pools
    return pools.conv[:, slot].clone(), pools.ssm[:, slot].clone()


def test_the_one_pass_equals_the_chunk_then_the_round(make_fast, prompt_of):
    """Eager passes on both (`cuda_graphs=False`), so that every decode calls `FastModel.decode` to record; B's slot
    holds garbage before its first chunk, which the one pass must reset as prefill does."""
    one, two = make_fast(cuda_graphs=False), make_fast(cuda_graphs=False)
    seqs = [(ready(p, prompt_of(8, seed=1), 1), materialize(p, prompt_of(PROMPT_B, seed=2), 2, (CAPTURE,)))
            for p in (one, two)]
    for p, (_, b) in zip((one, two), seqs):  # what only the reset at position 0 clears
        p.model.pools.conv[:, b.slot].fill_(1.0)
        p.model.pools.ssm[:, b.slot].fill_(1.0)
    mixed, one_prefills = recorded(one.model, "mixed"), recorded(one.model, "prefill")
    prefills, decodes = recorded(two.model, "prefill"), recorded(two.model, "decode")
    for i, n in enumerate(CHUNKS):
        (a1, b1), (a2, b2) = seqs
        batch = one.decode([a1], prefill=PrefillChunk(b1, n))
        first = two.prefill(b2, n)  # the PREFILL batch of the final chunk, else None
        plain = two.decode([a2])
        assert batch.kind is BatchKind.MIXED and (first is None) == (i < len(CHUNKS) - 1)
        assert [r.tokens for r in batch.rows] == [r.tokens for r in plain.rows + (first.rows if first else ())]
        # [B + 1, V]: the decode row's logits, then the piece's last token's, as the two passes made them
        assert len(mixed) == len(prefills) == len(decodes) == i + 1 and not one_prefills
        torch.testing.assert_close(mixed[i][-1], prefills[i], rtol=TOL, atol=TOL)
        torch.testing.assert_close(mixed[i][:-1], decodes[i], rtol=TOL, atol=TOL)
        one.commit(batch.take(), [RowDecision(1, False)] * len(batch.rows))
        if first is not None:
            two.commit(first.take(), [RowDecision(1, False)])
        two.commit(plain.take(), [RowDecision(1, False)])
        one.check_invariants()
        two.check_invariants()
        for h1, h2 in zip(*seqs):  # both sequences' live GDN state, the reset and the piece's chunked rule's
            for x, y in zip(gdn_state(one, h1.slot), gdn_state(two, h2.slot)):
                torch.testing.assert_close(x, y, rtol=TOL, atol=TOL)
    (snap1,), (snap2,) = (p.sequence(b).snapshots for p, (_, b) in zip((one, two), seqs))
    assert snap1.tokens == snap2.tokens == prompt_of(PROMPT_B, seed=2)[:CAPTURE]  # filled inside the mid chunk
    for x, y in zip(gdn_state(one, snap1.slot), gdn_state(two, snap2.slot)):
        torch.testing.assert_close(x, y, rtol=TOL, atol=TOL)
    (a1, b1), (a2, b2) = seqs  # both go on decoding alike
    assert [r.tokens for r in one.decode([a1, b1]).rows] == [r.tokens for r in two.decode([a2, b2]).rows]


@pytest.fixture(params=["fast", "reference"])
def make(request, make_fast, make_reference):
    return {"fast": make_fast, "reference": make_reference}[request.param]


def committed(program, handle):
    """A sequence's committed bookkeeping (the GDN state shows in what it draws next)."""
    seq = program.sequence(handle)
    return seq.frontier, seq.pending, list(seq.table), seq.reserve_left, program.prompt_remaining(handle)


def draw(program, handle):
    """The next decode draw (token, logprob) from the committed state, aborted again."""
    batch = program.decode([handle])
    program.abort_pending(batch.take())
    return batch.rows[0].tokens, batch.rows[0].logprobs


def assert_draws(rows, want):
    """The rows drew `want`'s tokens, at its logprobs up to the rounding of another pass (the fast one pass)."""
    assert [r.tokens for r in rows] == [t for t, _ in want]
    torch.testing.assert_close([r.logprobs for r in rows], [lp for _, lp in want], rtol=TOL, atol=TOL)


def test_a_mixed_batch_commits_and_aborts_row_by_row(make, prompt_of):
    """An aborted MIXED batch restores its decode rows, but its prompt tokens stay consumed (not provisional); the
    first-token row comes last, only once the prompt is done, and cancelling it leaves the decode rows' commit."""
    program = make(max_concurrency=3)
    a, c = ready(program, prompt_of(8, seed=1), 1), ready(program, prompt_of(11, seed=3), 3)
    b = materialize(program, prompt_of(PROMPT_B, seed=2), 2)
    before, want = [committed(program, h) for h in (a, c)], [draw(program, h) for h in (a, c)]
    batch = program.decode([a, c], prefill=PrefillChunk(b, 12))
    assert batch.kind is BatchKind.MIXED and [r.handle for r in batch.rows] == [a, c]
    assert [r.base_frontier for r in batch.rows] == [s[0] + 1 for s in before]
    assert_draws(batch.rows, want)
    program.abort_pending(batch.take())
    assert [committed(program, h) for h in (a, c)] == before
    assert [draw(program, h) for h in (a, c)] == want  # the GDN state restored as well
    assert program.prompt_remaining(b) == PROMPT_B - 12 and program.sequence(b).pending is None
    program.check_invariants()
    batch = program.decode([a, c], prefill=PrefillChunk(b, 64))
    assert [r.handle for r in batch.rows] == [a, c, b] and batch.payload[-1] is None
    assert batch.rows[-1].base_frontier == PROMPT_B
    assert_draws(batch.rows[:2], want)
    program.commit(batch.take(), [RowDecision(1, False)] * 2 + [RowDecision(0, True, cancelled=True)])
    assert [committed(program, h)[:2] for h in (a, c)] == [(s[0] + 1, r.tokens[0]) for s, r in zip(before, batch.rows)]
    assert committed(program, b)[:2] == (PROMPT_B, None) and program.prompt_remaining(b) == 0
    program.check_invariants()
    run(program, ResourceChoice(TransitionKind.RELEASE, handle=b))
    program.commit(program.decode([a, c]).take(), [RowDecision(1, False)] * 2)  # the decode rows go on
    program.check_invariants()


def test_a_chunk_that_cannot_ride_the_round_is_refused(make, prompt_of):
    """A chunk of a decode row itself, of a consumed prompt, or beside no decode row: EngineFailure, and nothing
    moved."""
    program = make(max_concurrency=3)
    a, done = ready(program, prompt_of(8, seed=1), 1), ready(program, prompt_of(6, seed=4), 4)
    b = materialize(program, prompt_of(PROMPT_B, seed=2), 2)
    before = [committed(program, h) for h in (a, done, b)]
    for rows, chunk in (([a], PrefillChunk(a, 4)), ([a, done], PrefillChunk(done, 4)), ([a], PrefillChunk(done, 4)),
                        ([], PrefillChunk(b, 4))):
        with pytest.raises(EngineFailure):
            program.decode(rows, prefill=chunk)
        assert [committed(program, h) for h in (a, done, b)] == before
        program.check_invariants()


@pytest.mark.parametrize("lengths", [(1, 37, 5), (64, 100, 13)])
def test_the_mixed_graphs_padded_pass_equals_the_eager_one(make_fast, prompt_of, lengths):
    """The mixed graphs' body (`MixedGraphRunner`, buckets 64 and 128: a piece padded to its bucket beside B rows,
    all device data; run eagerly on a CPU, replayed on CUDA) against `FastModel.mixed` on a Program without prefill
    graphs: the same logits, draws and live state, at one and two decode rows, from position 0 and mid-prompt,
    pieces of 1 token, of a whole bucket and past half of the next."""
    graphed = make_fast(max_concurrency=3, prefill_graph_tokens=128)
    eager = make_fast(max_concurrency=3, prefill_graph_tokens=0)
    assert graphed.mixed.buckets == (64, 128) and eager.mixed is None
    # the graphed pass's logits as the runner returns them (a replay on CUDA calls no model method)
    logits = {graphed: recorded(graphed.mixed, "run"), eager: recorded(eager.model, "mixed")}
    prompt = prompt_of(sum(lengths), seed=5)
    seqs = [(ready(p, prompt_of(8, seed=1), 1), ready(p, prompt_of(11, seed=3), 3), materialize(p, prompt, 2))
            for p in (graphed, eager)]
    for i, n in enumerate(lengths):
        batches = [p.decode([a, c][:1 + i % 2], prefill=PrefillChunk(b, n)) for p, (a, c, b) in zip((graphed, eager),
                                                                                                   seqs)]
        assert [r.tokens for r in batches[0].rows] == [r.tokens for r in batches[1].rows]
        torch.testing.assert_close(logits[graphed][-1], logits[eager][-1], rtol=TOL, atol=TOL)
        for p, batch, (a, c, b) in zip((graphed, eager), batches, seqs):
            p.commit(batch.take(), [RowDecision(1, False)] * len(batch.rows))
            p.check_invariants()
    assert len(logits[graphed]) == len(logits[eager]) == len(lengths)
    for hs1, hs2 in zip(*seqs):
        for x, y in zip(gdn_state(graphed, hs1.slot), gdn_state(eager, hs2.slot)):
            torch.testing.assert_close(x, y, rtol=TOL, atol=TOL)
