"""The fast Program with the DFlash / DFlash2 backends (the twins of tests/reference_program/test_dflash.py):
start-up errors name the field, greedy equals the autoregressive run (real drafts and forced acceptance lengths,
with and without a draft window), the drafts equal the reference Program's on the same weights, the drafter context
in the pages after prefill chunks, verified blocks, rollbacks and aborts equals the context built from scratch over
the committed tokens, drafting writes no page, host replicas of pages carry the context, a sampled prefix hit
equals the cold run, and grammar rows over the drafter's device drafts constrain every prefix. CPU: naive kernels;
NINFER_TEST_DEVICE=cuda: Triton on the GPU."""

from __future__ import annotations

import functools

import pytest
import torch

from ninfer.fast.program import FastProgram
from ninfer.program_core.speculation import row_context
from ninfer.program_core.speculative import MissingBackendWeights, SpeculativeConfigError
from ninfer.sampling import SamplingParams
from ninfer.testing.serving import assert_drained, serve
from ninfer.testing.sessions import ParityMask, TokenSession, token_request
from ninfer.testing.spec_driving import (assert_every_width_keeps_greedy, assert_sampled_hit_equals_cold,
                                         drafts_on_device, mixed_rounds, record_drafts, spec_prompts, start_decoding)


def test_a_missing_or_unfit_drafter_is_a_start_error(artifact, make_fast_dflash):
    with pytest.raises(MissingBackendWeights, match="'dflash' needs a dflash drafter") as e:
        FastProgram.from_artifact(artifact, max_concurrency=1, max_context=64, budget_bytes=1 << 30,
                                  speculative_config={"method": "dflash", "num_speculative_tokens": 7})
    assert e.value.field == "method"
    program = make_fast_dflash("dflash", 15)
    assert (program.limits.speculative, program.limits.draft_tokens) == ("dflash (k=15, fixed width)", 15)
    assert program.model.plan.drafter is not None and program.model.pools.dk is not None
    assert make_fast_dflash("dflash", 0).model.pools.dk is None


def test_the_reference_checks_apply(tiny):
    from ninfer.fast.program import FastProgramConfig
    from ninfer.models.qwen3_5.drafter import DrafterConfig
    from ninfer.program_core.speculative import SpeculativeConfig, SpeculativeMethod
    from ninfer.testing.drafters import drafter_hf_config, drafter_tensors

    cfg, weights = tiny
    block8 = DrafterConfig.from_hf(drafter_hf_config(cfg, "dflash", block_size=8))
    source = {**weights, **drafter_tensors(block8, 1)}.__getitem__

    def build(kind, k):
        spec = SpeculativeConfig(SpeculativeMethod(kind), k, adaptive=False)
        config = FastProgramConfig(max_concurrency=1, max_context=64, page_size=4, kv_pages=40,
                                   dtype=torch.float32, speculative=spec)
        return FastProgram.build(cfg, source, config, budget_bytes=1 << 30, device="cpu", kernels="naive",
                                 drafter=block8)
    with pytest.raises(MissingBackendWeights, match="carries a dflash drafter"):
        build("dflash2", 7)
    with pytest.raises(SpeculativeConfigError, match="trained for blocks of 8") as e:
        build("dflash", 15)
    assert e.value.field == "num_speculative_tokens"
    assert build("dflash", 7).limits.draft_tokens == 7


@pytest.fixture(scope="module")
def plain_greedy(make_fast_dflash, prompt_of):
    return [r.token_ids for r in serve(make_fast_dflash("dflash", 0), [token_request(p, 12) for p in
                                                                      spec_prompts(prompt_of)],
                                       max_concurrency=2, prefill_chunk=9)]


@pytest.mark.parametrize("kind, k, forced, window", [("dflash", 15, False, None), ("dflash2", 15, False, None),
                                                     ("dflash", 7, True, None), ("dflash2", 7, True, 6),
                                                     ("dflash2", 3, True, None)])
def test_greedy_with_dflash_equals_greedy_without(make_fast_dflash, prompt_of, plain_greedy, kind, k, forced,
                                                  window):
    program = make_fast_dflash(kind, k, forced=forced, window=window)
    spec = serve(program, [token_request(p, 12) for p in spec_prompts(prompt_of)], max_concurrency=2, prefill_chunk=9)
    assert [r.token_ids for r in spec] == plain_greedy
    if forced:
        assert any(r.usage.accepted_draft_tokens > 1 for r in spec)
    assert_drained(program)


def test_a_commit_replays_its_cut_blocks_in_one_pass(make_replaying_dflash, prompt_of, plain_greedy):
    """A plan whose step states would pass their share of what the weights leave (35B-A3B's beside a drafter on an
    H100, the 27B's) keeps none, and captures a verify graph without backups per (B, width) on CUDA: a commit whose
    rows both cut their blocks replays their kept tokens in one pass over both rows (`feed_rows`; it was one pass a
    row, which at 35B-A3B made a round of 8 rows cost 14 plain steps), and greedy output stays the autoregressive
    output."""
    program = make_replaying_dflash("dflash", 15)
    verifier = program.executor.verifier
    assert any(B == 2 and not backup for B, _, backup, _ in verifier.graphs) == verifier.use_graphs
    rows, feed_rows = [], program.executor.feed_rows
    program.executor.feed_rows = lambda seqs, feds: rows.append(len(seqs)) or feed_rows(seqs, feds)
    # the random drafter's blocks: cut at their first miss, nearly all
    spec = serve(program, [token_request(p, 12) for p in spec_prompts(prompt_of)], max_concurrency=2, prefill_chunk=9)
    assert [r.token_ids for r in spec] == plain_greedy
    assert 2 in rows, rows
    assert_drained(program)


@pytest.mark.parametrize("kind, forced", [("dflash", False), ("dflash2", False), ("dflash", True)])
def test_grammar_rows_over_device_drafts_constrain_every_prefix(make_fast_dflash, prompt_of, kind, forced):
    """Structured output with the drafter: the rows of every draft prefix come from the session's fill, run on the
    drafts still on the device (`PrefixMasks`' host function, in stream order with the round); every output obeys
    its grammar and equals the plain constrained run. `forced`: the teacher's drafts as a `DraftBlock`, so that
    blocks pass the grammar and acceptance reads rows past the first."""
    from ninfer.engine.records import GenerationRequest

    vocab = make_fast_dflash(kind, 0).limits.vocab_size
    prompts = spec_prompts(prompt_of)

    def requests():
        return [GenerationRequest(tuple(p), TokenSession(14, mask=ParityMask(vocab)), 14) for p in prompts]
    plain = serve(make_fast_dflash(kind, 0), requests(), max_concurrency=2, prefill_chunk=9)
    program = make_fast_dflash(kind, 7, forced=forced)
    if forced:
        drafts_on_device(program)
    spec = serve(program, requests(), max_concurrency=2, prefill_chunk=9)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    assert all(t % 2 == i % 2 for r in spec for i, t in enumerate(r.token_ids))
    assert not forced or sum(r.usage.accepted_draft_tokens for r in spec) > 0
    assert_drained(program)


@pytest.mark.parametrize("kind, forced", [("dflash", True), ("dflash2", False)])
def test_rounds_of_every_width_keep_greedy(make_fast_dflash, prompt_of, kind, forced):
    """The draft policy's narrower rounds (1..8 in turn at block 8, the plain step among them; the drafter context
    extended by each): greedy as without a backend."""
    program, longest = assert_every_width_keeps_greedy(functools.partial(make_fast_dflash, kind), prompt_of, 7, forced)
    assert program.executor.verifier.widths == (1, 2, 4, 8)
    assert {program.executor.verifier.width_for([n]) for n in longest} == {1, 2, 4, 8}, longest


def _on_gpu(program) -> bool:
    return program.model.device.type == "cuda"


@pytest.mark.parametrize("kind, window, vocab", [("dflash", None, None), ("dflash2", None, None), ("dflash2", 7, None),
                                                 ("dflash", None, 48), ("dflash2", None, 48)])
def test_device_drafts_equal_the_reference_programs(make_fast_dflash, make_reference_dflash, prompt_of, kind,
                                                    window, vocab):
    """The same requests (greedy and sampled) through both Programs with the real drafter: the same drafts at every
    round (two rows batched in one block pass, the context in pages, the window as a first-key bound, the selector
    walk; with a draft vocabulary, the device's lm_head rows below it against the reference's masked logits) and
    the same tokens and accepted counts."""
    prompts = spec_prompts(prompt_of)
    runs = []
    fast = make_fast_dflash(kind, 7, window=window, draft_vocab=vocab)
    for program in (fast, make_reference_dflash(kind, 7, window=window, draft_vocab=vocab)):
        drafts = record_drafts(program)
        reqs = [token_request(p, 14, **({} if i % 2 else dict(sampling=SamplingParams(temperature=0.8), seed=3 + i)))
                for i, p in enumerate(prompts)]
        out = serve(program, reqs, max_concurrency=2, prefill_chunk=9)
        runs.append((drafts, [(r.token_ids, r.usage.accepted_draft_tokens) for r in out]))
    (fast_drafts, fast_out), (ref_drafts, ref_out) = runs
    assert len(fast_drafts) > 10 and sum(len(d) for d in fast_drafts) > 40
    assert vocab is None or max(t for d in fast_drafts for t in d) < vocab
    if not _on_gpu(fast):
        assert fast_drafts == ref_drafts
        assert fast_out == ref_out
        return
    # TF32 on the GPU against fp32 on the CPU: a random drafter's near-ties may flip a draft (and with it the
    # sampled rows' draws), so the rounds' drafts agree almost always and the greedy requests exactly
    same = sum(a == b for a, b in zip(fast_drafts, ref_drafts)) / max(len(fast_drafts), len(ref_drafts))
    assert same >= 0.9, same
    assert fast_out[1::2] == ref_out[1::2]


# chunks of 7: the drafter context is built in pieces
_start = functools.partial(start_decoding, max_new=40, chunk=7)


def _context(program, seq, n):
    """The drafter's K and V of positions 0..n-1 of `seq`, read through its block table: [layers, n, nkv, d]."""
    pools, ps = program.model.pools, program.model.plan.page_size
    pos = torch.arange(n)
    flat = torch.tensor(seq.table)[pos // ps] * ps + pos % ps
    return [pool.flatten(1, 2)[:, flat.to(pool.device)].cpu() for pool in (pools.dk, pools.dv)]


def _assert_same_context(program, seq, fresh):
    """The context of seq's consumed positions equals a fresh Program's after prefilling them as one prompt."""
    h = _start(fresh, tuple(seq.tokens[:seq.frontier]), max_new=2)
    ref = fresh.sequence(h)
    assert ref.frontier == seq.frontier
    tol = 1e-2 if _on_gpu(program) else 1e-5  # TF32 tl.dot on the GPU: the verify and prefill paths round apart
    for a, b in zip(_context(program, seq, seq.frontier), _context(fresh, ref, ref.frontier)):
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)


@pytest.mark.parametrize("kind, replay", [("dflash", False), ("dflash2", True)])
def test_drafter_context_follows_the_committed_tokens(make_fast_dflash, prompt_of, kind, replay):
    """Rounds that accept all, some or none of their drafts, a cut block and an aborted round: after each commit
    the context in the pages is exactly the one built from scratch. A partly kept block takes its state from the
    step slots, or (`replay`: a plan without them) replays the kept tokens, which extends the context again."""
    program = make_fast_dflash(kind, 5, forced=True)
    assert program.model.plan.step_slots == 5
    kept, select = [], program.executor.select

    def selecting(seq, keep: int) -> bool:
        kept.append(keep)
        return not replay and select(seq, keep)  # False: the core replays the kept tokens
    program.executor.select = selecting
    h = _start(program, prompt_of(17, seed=3))
    seq = program.sequence(h)
    mixed_rounds(program, h, lambda: _assert_same_context(program, seq, make_fast_dflash(kind, 5, max_concurrency=1)))
    assert any(1 < k for k in kept), kept  # a block kept drafts and dropped others


def test_a_prefill_in_model_pieces_builds_the_same_context(make_fast_dflash, prompt_of):
    """One 150-token chunk through a plan whose prefill piece is 64: three model calls, each piece's taps turned
    into context, equal to the context built in chunks of 7."""
    program = make_fast_dflash("dflash2", 7, max_prefill_tokens=64)
    h = _start(program, prompt_of(150, seed=4), chunk=200)
    _assert_same_context(program, program.sequence(h), make_fast_dflash("dflash2", 7, max_concurrency=1))


def test_drafting_writes_no_page(make_fast_dflash, prompt_of):
    program = make_fast_dflash("dflash2", 15)
    h = _start(program, prompt_of(9, seed=8))
    seq = program.sequence(h)
    pools, plan = program.model.pools, program.model.plan
    before = [p[:, :plan.num_pages + 1].clone() for p in (pools.dk, pools.dv)]
    one = program.executor.draft([seq], [row_context(program, seq)], [15])
    two = program.executor.draft([seq], [row_context(program, seq)], [15])
    assert one[0][0] == two[0][0] and len(one[0][0]) == 15
    for b, p in zip(before, (pools.dk, pools.dv)):
        assert torch.equal(b, p[:, :plan.num_pages + 1])


def test_the_start_up_warm_run_writes_only_the_dummy_and_scratch_pages(make_fast_dflash):
    """What FastProgram runs on CUDA before serving (every drafter kernel once): no usable page changes."""
    program = make_fast_dflash("dflash2", 15, window=9)
    pools, plan = program.model.pools, program.model.plan
    for pool in (pools.dk, pools.dv):
        pool.copy_(torch.randn(pool.shape))  # any write, zeros included, shows
    before = [p.clone() for p in (pools.dk, pools.dv)]
    program.executor.dflash.warm(40)
    assert not torch.equal(before[0][:, plan.num_pages:], pools.dk[:, plan.num_pages:])  # dummy and scratch written
    for b, p in zip(before, (pools.dk, pools.dv)):
        assert torch.equal(b[:, :plan.num_pages], p[:, :plan.num_pages])


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_the_draft_graphs_capture_writes_only_scratch_pages(make_fast_dflash, kind):
    """What the draft graphs capture on CUDA (each variant's body on the capture inputs, `fill_dummy`), run eagerly
    here: every page but the rows' scratch stays as it was. The drafter pools hold no scratch for the dummy row: a
    capture over its pages wrote past them on an H100, into the drafter context, and every draft went wrong (on
    the CPU the same inputs raise an index error)."""
    from ninfer.fast.sampling.draw_variants import DRAW_VARIANTS, LEAN, base_variant

    program = make_fast_dflash(kind, 15)
    graphs, pools, plan = program.executor.dflash.graphs, program.model.pools, program.model.plan
    for pool in (pools.dk, pools.dv):
        pool.copy_(torch.randn(pool.shape))
    before = [p.clone() for p in (pools.dk, pools.dv)]
    R = graphs.max_batch
    graphs.fill_dummy(R)
    for variant in DRAW_VARIANTS:
        for block in graphs.block_draws(variant):
            graphs.draws.fill_dummy(R, base_variant(variant), graphs.spec.tables.dummy_row)
            graphs.body(R, variant, block)
    # DFlash: slot by slot and the one-pass block draw, whose form alone a lean round (no penalties) takes
    assert graphs.block_draws("greedy") == ((False, True) if kind == "dflash" else (False,))
    assert graphs.block_draws("greedy" + LEAN) == ((True,) if kind == "dflash" else (False,))
    assert not torch.equal(before[0][:, plan.num_pages + 1:], pools.dk[:, plan.num_pages + 1:])  # scratch written
    for b, p in zip(before, (pools.dk, pools.dv)):
        assert torch.equal(b[:, :plan.num_pages + 1], p[:, :plan.num_pages + 1])


def test_page_copies_and_host_replicas_carry_the_context(make_fast_dflash, prompt_of):
    program = make_fast_dflash("dflash", 7)
    h = _start(program, prompt_of(13, seed=9))
    seq = program.sequence(h)
    pools, spare = program.model.pools, program.model.plan.num_pages - 1  # a page no sequence holds
    assert spare not in seq.table
    program.store.copy_page(seq.table[-1], spare)  # what a resume does with the partial page at its frontier
    for pool in (pools.dk, pools.dv):
        assert pool[:, seq.table[-1]].abs().sum() > 0 and torch.equal(pool[:, spare], pool[:, seq.table[-1]])
    want = _context(program, seq, seq.frontier)
    replica = program.store.load_pages(list(seq.table))
    assert len(replica) == 4  # target K, V, drafter K, V
    for pool in (program.model.pools.dk, program.model.pools.dv):
        pool.fill_(float("nan"))
    program.store.store_pages(list(seq.table), replica)
    for a, b in zip(want, _context(program, seq, seq.frontier)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("kind, window, base_len, reused", [("dflash", None, 12, 12), ("dflash", None, 14, 14),
                                                            ("dflash2", None, 100, 64),
                                                            ("dflash2", 10, 100, 64)])
def test_sampled_prefix_hit_with_dflash_equals_the_cold_run(make_fast_dflash, prompt_of, kind, window, base_len,
                                                            reused):
    """A checkpoint without the drafter context of its frontier (in the shared and copied pages) would change the
    drafts and with them the sampled tokens."""
    assert_sampled_hit_equals_cold(lambda: make_fast_dflash(kind, 7, window=window), prompt_of, base_len, reused)
