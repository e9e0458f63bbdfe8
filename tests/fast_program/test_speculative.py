"""The fast Program with the MTP backend (the twins of tests/reference_program/test_speculative.py): start-up
errors, greedy equal to the autoregressive run (real MTP drafts and forced random acceptance lengths), the device
MTP head's drafts equal to the reference Program's, abort and cancel restore (GDN slot, stored hidden, MTP KV,
pages), a cut block equals the same tokens consumed plainly, sampled prefix hits equal the cold run, rows of one
round accept different lengths, grammar rows per draft prefix, drained pools. CPU: naive kernels; NINFER_TEST_DEVICE=cuda: Triton on the GPU."""

from __future__ import annotations

import os

import pytest
import torch

from ninfer.contracts import DraftMasks, RowDecision
from ninfer.fast.program import FastProgram
from ninfer.program_core.speculative import MissingBackendWeights
from ninfer.testing.numerics import assert_close
from ninfer.testing.serving import assert_drained, serve
from ninfer.testing.sessions import ParityMask, TokenSession, token_request
from ninfer.testing.spec_driving import (assert_draft_vocab_bounds, assert_every_width_keeps_greedy,
                                         assert_greedy_unchanged,
                                         assert_rows_accept_different_lengths,
                                         assert_sampled_hit_equals_cold, decode_until_drafted, drafts_on_device,
                                         record_drafts,
                                         spec_prompts, start_decoding)

ON_GPU = os.environ.get("NINFER_TEST_DEVICE") == "cuda" and torch.cuda.is_available()


def test_mtp_without_mtp_weights_is_a_start_error(artifact):
    with pytest.raises(MissingBackendWeights, match="mtp"):
        FastProgram.from_artifact(artifact, max_concurrency=1, max_context=64, budget_bytes=1 << 30,
                                  speculative_config={"method": "mtp", "num_speculative_tokens": 2})


def test_limits_name_the_backend(make_fast_spec):
    limits = make_fast_spec(3).limits
    assert (limits.speculative, limits.draft_tokens) == ("mtp (k=3, fixed width)", 3)
    assert make_fast_spec(0).limits.speculative is None


@pytest.mark.parametrize("k, forced", [(1, False), (3, False), (3, True), (7, True)])
def test_greedy_with_mtp_equals_greedy_without(make_fast_spec, prompt_of, k, forced):
    assert_greedy_unchanged(make_fast_spec, prompt_of, k, forced)


@pytest.mark.parametrize("forced", [False, True], ids=["mtp-drafts", "forced-drafts"])
def test_rounds_of_every_width_keep_greedy(make_fast_spec, prompt_of, forced):
    """The draft policy's narrower rounds (1..k + 1 in turn) through the verify widths the Program captured for
    them (1, 2 and 4 at k = 3; a block of 3 takes width 4's buffers with pads): greedy as without a backend."""
    program, longest = assert_every_width_keeps_greedy(make_fast_spec, prompt_of, 3, forced)
    verifier = program.executor.verifier
    assert verifier.widths == (1, 2, 4)
    assert {verifier.width_for([n]) for n in longest} == {1, 2, 4}, longest


@pytest.mark.parametrize("graphs", [True, False], ids=["draft-graphs", "eager-head"])
def test_a_draft_vocabulary_bounds_every_draft_and_keeps_greedy(make_fast_spec, prompt_of, graphs):
    """The MTP draft's lm_head over the ids below 48 alone (`head_logits`: 48 rows read, the rest -inf), through
    the draft graphs' buffers and through the head's own chained steps (`MtpHead.draft`)."""
    def make(k: int, **kw):
        program = make_fast_spec(k, **kw)
        if k and not graphs:
            program.executor.drafter = None
        return program
    assert_draft_vocab_bounds(make, prompt_of, 3, 48)  # of the model's 97 ids


@pytest.mark.parametrize("draft_vocab", [None, 48])
def test_device_mtp_drafts_equal_the_reference_programs(make_fast_spec, make_reference_spec, prompt_of, draft_vocab):
    """The same requests through the fast and the reference Program with the real MTP head: the same drafts at
    every round (so the device head, its paged KV and its stored hidden follow the reference's) and the same
    accepted counts; with a draft vocabulary, its rows alone read on the device and the reference's masked logits
    agree."""
    prompts = spec_prompts(prompt_of)
    runs = []
    for program in (make_fast_spec(3, draft_vocab=draft_vocab), make_reference_spec(3, draft_vocab=draft_vocab)):
        drafts = record_drafts(program)
        out = serve(program, [token_request(p, 16) for p in prompts], max_concurrency=2, prefill_chunk=9)
        runs.append((drafts, [(r.token_ids, r.usage.accepted_draft_tokens) for r in out]))
    (fast_drafts, fast_out), (ref_drafts, ref_out) = runs
    assert len(fast_drafts) > 20 and sum(len(d) for d in fast_drafts) > 40
    assert fast_drafts == ref_drafts
    assert fast_out == ref_out


def _slot_state(program, slot):
    pools = program.model.pools
    return [t[:, slot].clone() for t in (pools.conv, pools.ssm)] + [pools.mtp_hidden[slot].clone()]


def _mtp_kv(program, seq, n):
    """The MTP layer's K and V at page positions 1..n of the sequence (pair p at position p + 1)."""
    pools, ps, layer = program.model.pools, program.config.page_size, program.model.mtp.pool
    pos = torch.arange(1, n + 1)
    pages = torch.tensor(seq.table, dtype=torch.long)[pos // ps].to(pools.k.device)
    return [t[layer][pages, (pos % ps).to(pools.k.device)].clone() for t in (pools.k, pools.v)]


def test_abort_and_cancel_restore_the_whole_state(make_fast_spec, prompt_of):
    program = make_fast_spec(3, forced=True)
    h = start_decoding(program, prompt_of(9, seed=3))
    batch = decode_until_drafted(program, h, 2)
    program.abort_pending(batch.take())
    seq = program.sequence(h)
    before = (seq.frontier, list(seq.table), seq.reserve_left, _slot_state(program, h.slot),
              _mtp_kv(program, seq, seq.frontier - 1))
    again = program.decode([h])
    assert again.rows == batch.rows  # the same drafts, verified the same way: nothing leaked
    program.commit(again.take(), [RowDecision(0, True, cancelled=True)])
    assert (seq.frontier, seq.table, seq.reserve_left) == before[:3]
    for a, b in zip(_slot_state(program, h.slot) + _mtp_kv(program, seq, seq.frontier - 1), before[3] + before[4]):
        assert torch.equal(a, b)
    program.check_invariants()


def test_a_cut_block_commits_only_the_kept_tokens(make_fast_spec, prompt_of):
    """The Engine's terminal rule keeps 1 of a longer block: the state equals a Program that consumed the same
    tokens as one prompt (GDN, stored hidden, MTP KV), and the block table covers exactly the new frontier."""
    prompt = prompt_of(9, seed=4)
    program = make_fast_spec(3, forced=True)
    h = start_decoding(program, prompt)
    batch = decode_until_drafted(program, h, 3)
    seq = program.sequence(h)
    first = batch.rows[0].tokens[0]
    program.commit(batch.take(), [RowDecision(1, True)])
    assert seq.pending == first and len(seq.table) == program.config.pages_for(seq.frontier)
    program.check_invariants()
    ref = make_fast_spec(3)
    r = start_decoding(ref, tuple(seq.tokens), max_new=4)
    rs = ref.sequence(r)
    assert rs.frontier == seq.frontier
    # chunked prefill against stepped decode: rounding only (on the GPU fp32 GEMMs and tl.dot round as TF32)
    tol = 1e-2 if ON_GPU else 1e-4
    names = ("conv window", "S", "stored hidden", "MTP K", "MTP V")
    for name, a, b in zip(names, _slot_state(ref, r.slot) + _mtp_kv(ref, rs, rs.frontier - 1),
                          _slot_state(program, h.slot) + _mtp_kv(program, seq, seq.frontier - 1)):
        assert_close(name, a, b, tol)


@pytest.mark.parametrize("base_len, reused", [(12, 12), (100, 64)])
def test_sampled_prefix_hit_with_mtp_equals_the_cold_run(make_fast_spec, prompt_of, base_len, reused):
    """A checkpoint without the MTP state of its frontier (stored hidden and paged MTP KV) would change the drafts
    and with them the sampled tokens."""
    assert_sampled_hit_equals_cold(lambda: make_fast_spec(3), prompt_of, base_len, reused)


def test_rows_of_one_round_accept_different_lengths(make_fast_spec, prompt_of):
    assert_rows_accept_different_lengths(make_fast_spec(4, forced=True), prompt_of, 4)


@pytest.mark.parametrize("on_device", [False, True], ids=["host-drafts", "device-drafts"])
def test_grammar_rows_constrain_every_draft_prefix(make_fast_spec, prompt_of, on_device):
    """Structured output under speculation: drafts that ignore the grammar (ForcedDrafts' teacher sees no mask) end
    their block where the grammar forbids them; every output obeys it and equals the plain constrained run. With
    the drafts on the device (`on_device`: the teacher's drafts as a `DraftBlock`, as the MTP head and the DFlash
    drafter leave theirs) the rows come from the prefix masks' fill in stream order (`PrefixMasks`)."""
    from ninfer.engine.records import GenerationRequest

    vocab = make_fast_spec(0).limits.vocab_size
    prompts = spec_prompts(prompt_of)

    def requests():
        return [GenerationRequest(tuple(p), TokenSession(14, mask=ParityMask(vocab)), 14) for p in prompts]
    plain = serve(make_fast_spec(0), requests(), max_concurrency=2, prefill_chunk=9)
    program = make_fast_spec(3, forced=True)
    if on_device:
        drafts_on_device(program)
    spec = serve(program, requests(), max_concurrency=2, prefill_chunk=9)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    assert all(t % 2 == i % 2 for r in spec for i, t in enumerate(r.token_ids))
    assert sum(r.usage.accepted_draft_tokens for r in spec) > 0  # some blocks passed the grammar
    assert_drained(program)


class _FillBreaks(TokenSession):
    """Its grammar's draft rows raise once 3 tokens are committed (a Frontend failure inside the round)."""

    def draft_masks(self) -> DraftMasks:
        def fill(drafts):
            if len(self.tokens) >= 3:
                raise RuntimeError("planted: the grammar could not fill the draft rows")
            return torch.ones(len(drafts) + 1, self.vocab, dtype=torch.bool)  # everything allowed
        return DraftMasks(fill=fill)


@pytest.mark.parametrize("which", ["fast", "reference"])
def test_draft_rows_that_fail_end_their_request_alone(make_fast_spec, make_reference_spec, prompt_of, which):
    """The round calls the session's `fill` (the fast Program's from its host function, beside the target pass): a
    failure there fails that row (its state restored), and the other row of the round goes on."""
    from ninfer.contracts import FinishReason, RowFailure
    from ninfer.engine.engine import Engine
    from ninfer.engine.config import EngineConfig
    from ninfer.engine.records import GenerationRequest

    program = (make_fast_spec if which == "fast" else make_reference_spec)(3)
    session = _FillBreaks(12, stop_ids=())
    session.vocab = program.limits.vocab_size
    prompts = spec_prompts(prompt_of)
    engine = Engine(program, EngineConfig(max_concurrency=2, check_invariants=True), threaded=False)
    good = engine.submit(token_request(prompts[0], 12))
    bad = engine.submit(GenerationRequest(tuple(prompts[1]), session, 12))
    engine.run_until_idle()
    assert engine.available, engine.failure
    ok, failed = good.result(timeout=0), bad.result(timeout=0)
    assert len(ok.token_ids) == 12 or ok.finish_reason is FinishReason.STOP
    assert failed.finish_reason is FinishReason.ERROR and failed.failure is RowFailure.INVALID_SAMPLING_INPUT
    assert len(failed.token_ids) >= 3
    assert_drained(program)
