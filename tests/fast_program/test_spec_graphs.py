"""The MTP round through its graphs' static buffers (the draft, `ninfer/fast/draft_graphs.py`; the target pass with
every block position's state kept for a cut block, `ninfer/fast/verify_graphs.py`) against the eager round, round by
round: the same drafts, tokens and logprobs, and the same state in the pools (every live slot's conv window, S and
stored hidden, every layer's K/V below each frontier, the MTP layer's included). On CPU the static path runs eagerly and
is compared with the eager round (`MtpHead.draft` over a gathered copy of the MTP KV, the multi-query
`FastModel.verify`, which packs no pad rows); with NINFER_TEST_DEVICE=cuda the captured graphs are compared with both,
byte for byte with the static path run eagerly."""

from __future__ import annotations

import os
import random

import pytest
import torch

from ninfer.contracts import RowDecision
from ninfer.fast.program.config import GRAPHED_PREFILL_TOKENS
from ninfer.fast.verify_graphs import VerifyInputs
from ninfer.sampling import SamplingParams
from ninfer.testing.numerics import assert_close
from ninfer.testing.serving import serve
from ninfer.testing.sessions import token_request
from ninfer.testing.spec_driving import record_drafts, start_decoding

ON_GPU = os.environ.get("NINFER_TEST_DEVICE") == "cuda" and torch.cuda.is_available()
PARAMS = (SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_p=0.9, logprobs=2))


def _state(program, handles):
    """Every live slot's GDN state and stored hidden (MTP), and all K/V (target and MTP layers, a DFlash drafter's
    context) below each frontier."""
    pools, ps, out = program.model.pools, program.config.page_size, []
    paged = [t for t in (pools.k, pools.v, pools.dk, pools.dv) if t is not None]
    for h in handles:
        seq = program.sequence(h)
        out += [pools.conv[:, h.slot], pools.ssm[:, h.slot]]
        out += [] if pools.mtp_hidden is None else [pools.mtp_hidden[h.slot]]
        pos = torch.arange(seq.frontier)
        pages = torch.tensor(seq.table, dtype=torch.long)[pos // ps].to(pools.k.device)
        out += [t[:, pages, (pos % ps).to(pools.k.device)] for t in paged]
    return [t.clone() for t in out]


def _drive(program, prompts, rounds: int, seed: int, replays: list[int]):
    """Two rows decoding; from a random round on, a row's first block of more than one token is cut inside (a
    terminal keep < produced: its state from the step slots, counted in `replays`), after which the other decodes
    on alone. Yields (rows, state) per round."""
    rng = random.Random(seed)
    handles = [start_decoding(program, p, 30, sampling=params, seed=11 + i)
               for i, (p, params) in enumerate(zip(prompts, PARAMS))]
    cut_from, done = {h: rng.randrange(3, rounds - 1) for h in handles}, set()
    for i in range(rounds):
        live = [h for h in handles if h not in done]
        if not live:
            break
        batch = program.decode(live)
        rows = [(r.tokens, r.logprobs, r.top_logprobs, r.drafted) for r in batch.rows]
        decisions = []
        for h, r in zip(live, batch.rows):
            if i >= cut_from[h] and r.produced > 1:
                decisions.append(RowDecision(rng.randrange(1, r.produced), True))
                done.add(h)
                replays.append(i)
            else:
                decisions.append(RowDecision(r.produced, False))
        program.commit(batch.take(), decisions)
        program.check_invariants()
        yield rows, _state(program, live)


def _compare(static, eager, other: str, prompts, life: int, replays: list[int]) -> int:
    """Drive `static` (its graphs' static buffers) and `eager` (the eager round, or the static path run eagerly)
    through the same rounds and compare them round by round; returns the drafts recorded."""
    drafts, drafts_eager = record_drafts(static), record_drafts(eager)
    pairs = zip(_drive(static, prompts, 8, life, replays), _drive(eager, prompts, 8, life, []))
    for n, ((rows, state), (rows_eager, state_eager)) in enumerate(pairs):
        if other == "eager-static":
            assert rows == rows_eager, (life, n)
            assert all(torch.equal(a, b) for a, b in zip(state, state_eager)), (life, n)
            continue
        # pad rows change the GEMMs' row count, and with it their rounding on some BLAS paths: the tokens are
        # the same, logprobs and state agree to rounding
        assert [r[0] for r in rows] == [r[0] for r in rows_eager], (life, n)
        for r, e in zip(rows, rows_eager):
            assert r[3] == e[3] and (r[1] is None) == (e[1] is None)
            if r[1] is not None:
                assert torch.allclose(torch.tensor(r[1]), torch.tensor(e[1]), atol=1e-4), (life, n)
                assert [[t for t, _ in top] for top in r[2]] == [[t for t, _ in top] for top in e[2]]
        for a, b in zip(state, state_eager):
            assert_close(f"life {life} round {n}", a, b, 1e-2 if ON_GPU else 1e-5)
    assert n >= 3 and drafts == drafts_eager
    return sum(map(len, drafts))


@pytest.mark.parametrize("other", ["eager-round", "eager-static"])
@pytest.mark.parametrize("forced", [True, False], ids=["forced-drafts", "mtp-drafts"])
def test_the_static_round_equals_the_eager_round(make_fast_spec, prompt_of, forced, other):
    if other == "eager-static" and not ON_GPU:
        pytest.skip("without CUDA the static path is the eager one: nothing is captured")
    replays: list[int] = []
    for life in range(3):
        prompts = [prompt_of(9 + 6 * life, seed=life), prompt_of(14 + life, seed=40 + life)]
        static, eager = make_fast_spec(3, forced=forced), make_fast_spec(3, forced=forced)
        assert (static.executor.verifier.graphs and static.executor.drafter.graphs) or not ON_GPU
        if other == "eager-round":
            eager.executor.verifier = eager.executor.drafter = None
        else:
            eager.executor.verifier.graphs.clear()
            eager.executor.drafter.graphs.clear()
        assert _compare(static, eager, other, prompts, life, replays) > 10
    # the Engine's cut needs a kept draft, which random MTP weights seldom give: the forced drafts cover it
    assert not forced or len(replays) >= 3, replays


@pytest.mark.parametrize("other", ["eager-round", "eager-static"])
@pytest.mark.parametrize("kind, forced", [("dflash", True), ("dflash2", False)])
def test_the_dflash_static_verify_equals_the_eager_one(make_fast_dflash, prompt_of, kind, forced, other):
    """DFlash / DFlash2 blocks of 8 through the verify graphs' static buffers (the target pass with its taps and
    the drafter context's extension; a cut block's state from the step slots, or, in the forced case, its replay:
    the path of a plan without step slots) against the eager multi-query pass and `FastDFlashBackend.advance`: the
    same drafts, tokens and logprobs, and the same GDN state, K/V and drafter context below every frontier. On CUDA
    (`eager-static`) the draft graphs (`dflash_graphs.py`) are compared with their buffers run eagerly too."""
    if other == "eager-static" and not ON_GPU:
        pytest.skip("without CUDA the static path is the eager one: nothing is captured")
    replays: list[int] = []
    for life in range(2):
        prompts = [prompt_of(9 + 6 * life, seed=life), prompt_of(14 + life, seed=40 + life)]
        static, eager = make_fast_dflash(kind, 7, forced=forced), make_fast_dflash(kind, 7, forced=forced)
        assert static.model.plan.step_slots == 7
        if forced:  # roll back by the replay, as a plan whose step states would pass their share of the budget
            for program in (static, eager):
                program.executor.select = lambda seq, keep: False
        verifier = static.executor.verifier
        assert verifier.width == 8 and (verifier.graphs or not ON_GPU)
        assert static.executor.dflash.graphs.graphs or not ON_GPU
        run, passes = verifier.run, []
        verifier.run = lambda *a, **kw: passes.append(len(a[4])) or run(*a, **kw)
        if other == "eager-round":
            eager.executor.verifier = None
        else:
            eager.executor.verifier.graphs.clear()
            eager.executor.dflash.graphs.graphs.clear()
        assert _compare(static, eager, other, prompts, life, replays) > 10
        # both rows' verify passes, and with the replay a single row's (a cut block's replay, alone)
        assert 2 in passes and (1 in passes or not forced), passes
    assert not forced or len(replays) >= 2, replays  # a random drafter seldom gets a draft kept: forced covers it


def test_the_static_inputs_pad_every_short_block():
    """Blocks of lens 2, 4 and 1 at width 4: the real tokens packed first, the pad block on the pad row and slot at
    positions 0.., every short row's later GDN steps on the last pad row with slots -1, each token's MTP pair on the
    hidden before it (a block's first on its row's stored hidden, rows 12.. of [hidden ; stored]). In place (a
    feed) each step reads and writes the row's slot and only the last stores its hidden there; keeping the steps
    (a verify), step j writes the row's step slot j (the last one the slot) and step j + 1 reads it, each storing its
    hidden beside it; a pad step's hidden goes to the pad slot."""
    inputs = VerifyInputs(max_batch=4, width=4, device=torch.device("cpu"))
    inputs.fill([0, 0, 0, 0], [3, 3, 3, 3], [1, 1, 1, 1], [4, 4, 4, 4], [0] * 4, 9, 8)  # a full pass first: stale
    assert inputs.fill([5, 6, 7], [2, 0, 1], [10, 3, 7], [2, 4, 1], [0, 100, 0], 9, 8) == 3
    v = {name: t.tolist() for name, t in inputs.views.items()}
    assert v["slot_ids"][:4] == [5, 6, 7, 8] and v["table_rows"][:4] == [2, 0, 1, 9]
    assert v["starts"][:4] == [10, 3, 7, 0] and v["cu"][:5] == [0, 2, 6, 7, 12]
    assert v["positions"][:12] == [10, 11, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4]
    assert v["rope_positions"][:12] == [10, 11, 103, 104, 105, 106, 7, 0, 1, 2, 3, 4]
    assert v["block"][:12] == [0, 0, 1, 1, 1, 1, 2, 3, 3, 3, 3, 3]
    assert v["h_src"][:12] == [12, 0, 13, 2, 3, 4, 14, 15, 7, 8, 9, 10]
    assert [r[:3] for r in v["step_rows"]] == [[0, 2, 6], [1, 3, 11], [11, 4, 11], [11, 5, 11]]
    assert [r[:3] for r in v["step_slots"]] == [[5, 6, 7], [5, 6, -1], [-1, 6, -1], [-1, 6, -1]]
    assert [r[:3] for r in v["step_outs"]] == [[5, 6, 7], [5, 6, -1], [-1, 6, -1], [-1, 6, -1]]
    assert [r[:3] for r in v["h_dst"]] == [[8, 8, 7], [5, 8, 8], [8, 8, 8], [8, 6, 8]]
    steps = ([[5, 20], [6, 30, 31, 32], [7]], [[20, 5], [30, 31, 32, 6], [7]])  # row i's step slots 20.., 30..
    inputs.fill([5, 6, 7], [2, 0, 1], [10, 3, 7], [2, 4, 1], [0, 100, 0], 9, 8, steps)
    v = {name: t.tolist() for name, t in inputs.views.items()}
    assert [r[:3] for r in v["step_slots"]] == [[5, 6, 7], [20, 30, -1], [-1, 31, -1], [-1, 32, -1]]
    assert [r[:3] for r in v["step_outs"]] == [[20, 30, 7], [5, 31, -1], [-1, 32, -1], [-1, 6, -1]]
    assert [r[:3] for r in v["h_dst"]] == [[20, 30, 7], [5, 31, 8], [8, 32, 8], [8, 6, 8]]
    with pytest.raises(ValueError, match="blocks of 1..4"):
        inputs.fill([5], [2], [10], [5], [0], 9, 8)


def test_drafting_writes_only_scratch_pages(make_fast_spec, prompt_of):
    """The draft graphs' chain goes to the rows' scratch pages: every page of the pool (the dummy page included),
    every state slot and the block tables are unchanged by a draft; the scratch holds the frontier's partial page."""
    from ninfer.program_core.speculation import row_context

    program = make_fast_spec(3)
    handles = [start_decoding(program, prompt_of(n, seed=n), 30, sampling=p, seed=5)
               for n, p in ((10, PARAMS[0]), (13, PARAMS[1]))]
    pools, plan = program.model.pools, program.model.plan
    seqs = [program.sequence(h) for h in handles]
    before = [t.clone() for t in (pools.k[:, :plan.num_pages + 1], pools.v[:, :plan.num_pages + 1], pools.conv,
                                   pools.ssm, pools.mtp_hidden, pools.block_tables)]
    block = program.executor.draft(seqs, [row_context(program, s) for s in seqs], [3, 2])
    assert [len(block.host(b)) for b in range(2)] == [3, 2]
    after = (pools.k[:, :plan.num_pages + 1], pools.v[:, :plan.num_pages + 1], pools.conv, pools.ssm,
             pools.mtp_hidden, pools.block_tables)
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    ps, layer = plan.page_size, program.model.mtp.pool
    for s in seqs:  # the committed pairs of the frontier's page, copied into the row's first scratch page
        F = s.frontier
        scratch = pools.k[layer, pools.scratch_page(s.row, 0), :F % ps]
        assert F % ps and torch.equal(scratch, pools.k[layer, s.table[F // ps], :F % ps])


def test_each_pass_replays_its_own_graphs(make_fast, make_fast_spec, prompt_of):
    """The executor's dispatch: a plain Program's short prefill piece and forced tokens go through the prefill
    graphs (`pieces`), an MTP Program's verify and forced tokens through the verify graphs and its draft through the
    draft graphs (two dispatch rules once shared one method name, and the prefill graphs went silently unused); a
    block cut after one token runs no second pass (its state comes from the step slots)."""
    calls = []

    def spy(obj, name):
        run = getattr(obj, name)
        setattr(obj, name, lambda *a, **kw: calls.append((type(obj).__name__, name)) or run(*a, **kw))

    plain = make_fast(prefill_graph_tokens=GRAPHED_PREFILL_TOKENS)
    spy(plain.executor.pieces, "run")
    h = start_decoding(plain, prompt_of(9, seed=1), 30, sampling=PARAMS[0], seed=3)
    assert ("PrefillGraphRunner", "run") in calls and plain.sequence(h).frontier == 9
    calls.clear()
    program = make_fast_spec(3, forced=True)
    spy(program.executor.verifier, "run")
    spy(program.executor.drafter, "run")
    h = start_decoding(program, prompt_of(9, seed=1), 30, sampling=PARAMS[0], seed=3)
    assert not calls  # a prefill under a backend is eager
    batch = program.decode([h])
    program.commit(batch.take(), [RowDecision(1, True)])
    assert batch.rows[0].produced > 1 and calls.count(("VerifyGraphRunner", "run")) == 1
    h = start_decoding(program, prompt_of(9, seed=2), 30, sampling=PARAMS[0], seed=3)
    calls.clear()
    program.control(h, (5, 6, 7))  # forced tokens: [pending, 5, 6] in place
    assert calls == [("VerifyGraphRunner", "run")]
    program = make_fast_spec(3)
    spy(program.executor.drafter, "run")
    h = start_decoding(program, prompt_of(9, seed=1), 30, sampling=PARAMS[0], seed=3)
    program.decode([h])
    assert ("DraftGraphRunner", "run") in calls


def test_a_row_at_its_context_end_drafts_beside_a_longer_one(make_fast_spec, prompt_of):
    """A row whose room is one draft chains on as far as the round's longest (its extra drafts unread): with its last
    token at max_context (a page boundary) the chain runs past the block table's last page, which the draft graphs
    must not index (a device assert on CUDA). Greedy is unchanged by the backend."""
    def requests():
        return [token_request(prompt_of(4, seed=1), 20), token_request(prompt_of(26, seed=2), 6)]
    plain = serve(make_fast_spec(0, max_context=32), requests(), max_concurrency=2)
    spec = serve(make_fast_spec(5, max_context=32), requests(), max_concurrency=2)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    assert [len(r.token_ids) for r in plain] == [20, 6]


def test_many_short_blocks_beside_a_small_context(make_fast_spec, prompt_of):
    """Three rows at their output budget verify one token each at k = 7: 21 pad rows, more than the dummy row's
    table (16 positions) addresses, so the round takes the eager pass (its static one indexed past the table: a
    device assert on CUDA). Greedy is unchanged by the backend."""
    def requests():
        return [token_request(prompt_of(10, seed=i), 4) for i in range(3)]
    plain = serve(make_fast_spec(0, max_context=16, max_concurrency=3), requests(), max_concurrency=3)
    spec = serve(make_fast_spec(7, max_context=16, max_concurrency=3), requests(), max_concurrency=3)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    assert [len(r.token_ids) for r in plain] == [4] * 3


def test_a_lean_greedy_mtp_draft_step_launches(make_fast_spec):
    """A lean greedy draft's start and step launches (`LaunchCounter`; on a CPU the Triton table interpreted): the
    start's one op and the draws' reset, then what the step graph replays k times a round: the MTP layer (2 input norms, fc, attention with its KV slot from `decode_slots`, MLP,
    final norm), the draft vocabulary's lm_head and the draw in one launch (`greedy_draw`: argmax, the draft's
    column and the drawable count). 26 since the draw's ten torch kernels became one (seventeenth session; 38
    after the slot, the drawable test, the parameter rows and a cast were folded in the sixteenth, 56 before)."""
    from ninfer.fast.sampling.draw_variants import LEAN
    from ninfer.fast.sampling.rows import GREEDY
    from ninfer.testing.launches import LaunchCounter

    program = make_fast_spec(3, kernels="triton")
    drafter, plan = program.executor.drafter, program.model.plan
    drafter.fill([plan.dummy_slot], [plan.dummy_row], [8], [0], [0], [3])
    drafter.draws.fill_dummy(1, GREEDY, drafter.spec.tables.dummy_row)
    drafter.start(1)
    drafter.step(1, GREEDY + LEAN)  # warm: nothing autotunes inside the count
    with LaunchCounter() as counter:
        drafter.start(1)
    # the start: one `draft_start` launch (25 torch launches before, nineteenth session) and the draws' reset
    assert counter.names("step") == ["_draft_start_kernel", "aten.zero_", "aten.zero_", "aten.zero_", "aten.fill_"]
    with LaunchCounter() as counter:
        drafter.step(1, GREEDY + LEAN)
    names = counter.names("step")  # the counter's default section
    assert len(names) <= 26, names
    assert names.count("_decode_slots_kernel") == 1 and names.count("_greedy_draw_kernel") == 1, names
    assert "aten.argmax" not in names and "aten.amax" not in names, names


def test_a_verify_pass_addresses_its_tokens_in_two_launches(make_fast_spec):
    """The verify graph's body (`LaunchCounter`; the Triton table interpreted on a CPU): after the backups' slot
    copies, its addressing is the rows' table gather and one `decode_slots` launch (each token's table row and KV
    slot); the MTP layer's per-token tables, key counts, first keys and rotary positions come with the pass's one
    host copy (`VerifyInputs`). 19 small torch launches did that before (nineteenth session)."""
    from ninfer.testing.launches import LaunchCounter

    program = make_fast_spec(3, kernels="triton")
    verifier, plan = program.executor.verifier, program.model.plan
    verifier.inputs[4].fill_dummy(1, plan.dummy_slot, plan.dummy_row)
    verifier.body(1, True)  # warm: nothing autotunes inside the count
    with LaunchCounter() as counter:
        verifier.body(1, True)
    names = counter.names("step")
    assert names[:6] == ["_slot_copy_kernel"] * 3 + ["aten.index_select", "_decode_slots_kernel", "aten.embedding"]
    assert not {"aten.floor_divide", "aten.remainder", "aten.index", "aten.lt"} & set(names), names
