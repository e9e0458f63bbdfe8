"""Prefill chunk sizing over the Program's PrefillCosts (engine/chunking.py): the verdicts, the ITL bound they keep
on a measured cost model shaped like the 9B's on the H200, graphed short pieces against the eager fixed cost
measured on the 0.8B, and the chunks the Engine actually asks for."""

from __future__ import annotations

import dataclasses

import pytest

from ninfer.contracts import PrefillCosts
from ninfer.engine.chunking import FALLBACK_CHUNK, GRID, MARGIN, ChunkVerdict, prefill_chunk
from ninfer.engine.records import GenerationRequest
from ninfer.testing.sessions import TokenSession, token_request
from ninfer.testing.toy_program import ToyProgram

# 9B bf16 on the H200 (docs/performance.md): ~38k prefill tokens/s, ~1 ms fixed per piece, 5.4 / 6.3 ms steps
NINE_B = PrefillCosts(signature="test 9B", fixed_s=1e-3, token_s=1 / 38e3, pair_s=1e-9,
                      decode_step_s=(5.4e-3, 5.6e-3, 5.8e-3, 5.9e-3, 6.0e-3, 6.1e-3, 6.2e-3, 6.3e-3), measured=True)


def test_fixed_and_fallback():
    assert prefill_chunk(NINE_B, 9000, 0, 3, 100, 2.5) == (100, ChunkVerdict.FIXED)  # explicit: always that
    assert prefill_chunk(NINE_B, 40, 0, 3, 100, 2.5) == (40, ChunkVerdict.FIXED)
    assert prefill_chunk(PrefillCosts(), 9000, 0, 3, None, 2.5) == (FALLBACK_CHUNK, ChunkVerdict.FIXED)
    no_steps = dataclasses.replace(NINE_B, decode_step_s=())  # measured prefill, no plain decode graphs
    assert prefill_chunk(no_steps, 9000, 0, 2, None, 2.5) == (FALLBACK_CHUNK, ChunkVerdict.FIXED)
    assert prefill_chunk(no_steps, 9000, 0, 0, None, 2.5) == (8192, ChunkVerdict.WHOLE)
    with pytest.raises(ValueError, match="consumed"):
        prefill_chunk(NINE_B, 0, 10, 0, None, 2.5)


def test_nothing_decoding_runs_the_largest_piece():
    assert prefill_chunk(NINE_B, 20000, 0, 0, None, 2.5) == (8192, ChunkVerdict.WHOLE)
    assert prefill_chunk(NINE_B, 300, 0, 0, None, 2.5) == (300, ChunkVerdict.WHOLE)
    odd = dataclasses.replace(NINE_B, max_piece=1000)
    assert prefill_chunk(odd, 20000, 0, 0, None, 2.5) == (960, ChunkVerdict.WHOLE)  # whole GDN chunks


@pytest.mark.parametrize("rows", [1, 4, 8])
@pytest.mark.parametrize("frontier", [0, 4096, 30000])
def test_decoding_rows_bound_the_chunk(rows, frontier):
    chunk, verdict = prefill_chunk(NINE_B, 9000, frontier, rows, None, 2.5)
    budget = MARGIN * 1.5 * NINE_B.step_s(rows)
    assert verdict is ChunkVerdict.ITL and chunk % GRID == 0
    assert NINE_B.piece_s(chunk, frontier) <= budget < NINE_B.piece_s(chunk + GRID, frontier)  # the largest


def test_deeper_frontiers_and_wider_batches_size_differently():
    sizes = [prefill_chunk(NINE_B, 9000, f, 8, None, 2.5)[0] for f in (0, 8192, 30000)]
    assert sizes[0] > sizes[1] > sizes[2]  # attention over the keys before the chunk grows with the frontier
    assert prefill_chunk(NINE_B, 9000, 0, 1, None, 2.5)[0] <= prefill_chunk(NINE_B, 9000, 0, 8, None, 2.5)[0]
    assert prefill_chunk(NINE_B, 9000, 0, 8, None, 2.5)[0] < prefill_chunk(NINE_B, 9000, 0, 8, None, 4.0)[0]


def test_a_short_rest_runs_whole_and_a_tiny_budget_runs_one_gdn_chunk():
    assert prefill_chunk(NINE_B, 100, 0, 8, None, 2.5) == (100, ChunkVerdict.ITL)
    slow = dataclasses.replace(NINE_B, fixed_s=20e-3)  # the fixed cost alone is over the budget
    assert prefill_chunk(slow, 9000, 0, 8, None, 2.5) == (GRID, ChunkVerdict.FLOOR)
    assert prefill_chunk(slow, 10, 0, 8, None, 2.5) == (10, ChunkVerdict.FLOOR)
    heavy = dataclasses.replace(NINE_B, floor_s=8e-3, pair_s=0.0)  # a piece reads every weight: 8 ms however short
    assert heavy.piece_s(64, 0) == heavy.piece_s(128, 0) == 8e-3
    # over the budget anyway: the decoding rows wait 8 ms for one GDN chunk or for 1 ms + 266 tokens at 38k/s
    assert prefill_chunk(heavy, 9000, 0, 8, None, 2.5) == (256, ChunkVerdict.THROUGHPUT)
    assert prefill_chunk(heavy, 100, 0, 8, None, 2.5) == (64, ChunkVerdict.FLOOR)  # 100 would cost more
    assert prefill_chunk(heavy, 9000, 0, 8, None, 4.0)[1] is ChunkVerdict.ITL  # 0.8 * 3 steps = 15 ms fits


# 0.8B bf16 on the H200 (docs/performance.md, fourth session): an eager piece has a 12 ms fixed cost, 180k tokens/s,
# 1.6-2.0 ms steps. The graphed buckets are an assumed shape (not yet measured): about 0.4 ms of weight reads and
# 0.1 ms fixed, then 180k tokens/s
ZERO_8B = PrefillCosts(signature="test 0.8B", fixed_s=12e-3, token_s=1 / 180e3, pair_s=1e-10, floor_s=12.1e-3,
                       decode_step_s=(1.57e-3, 1.64e-3, 1.6e-3, 1.42e-3, 1.6e-3, 1.7e-3, 1.8e-3, 1.95e-3),
                       measured=True)
GRAPHED = dataclasses.replace(ZERO_8B, graph_buckets=(64, 128, 256, 512), graph_fixed_s=1e-4,
                              graph_piece_s=(0.5e-3, 0.8e-3, 1.5e-3, 2.9e-3))


def test_graphed_buckets_lift_the_floor():
    # eager only: one GDN chunk costs 12 ms against a 2.3 ms budget, and every token more costs more: FLOOR
    assert prefill_chunk(ZERO_8B, 8192, 0, 8, None, 2.5) == (GRID, ChunkVerdict.FLOOR)
    # a graphed piece costs its bucket: 256 tokens (1.5 ms) fit 0.8 * 1.5 * 1.95 ms, 320 (the 512 bucket) do not
    assert GRAPHED.piece_s(300, 0) == GRAPHED.piece_s(512, 0) == 2.9e-3
    assert GRAPHED.piece_s(513, 0) == ZERO_8B.piece_s(513, 0)  # past the largest bucket: eager
    assert prefill_chunk(GRAPHED, 8192, 0, 8, None, 2.5) == (256, ChunkVerdict.ITL)
    assert prefill_chunk(GRAPHED, 8192, 0, 0, None, 2.5) == (8192, ChunkVerdict.WHOLE)  # alone: one eager piece
    frontier, gaps, step = 0, [], GRAPHED.step_s(8)
    while frontier < 8192:
        chunk, verdict = prefill_chunk(GRAPHED, 8192 - frontier, frontier, 8, None, 2.5)
        assert verdict is ChunkVerdict.ITL and chunk >= 128
        gaps.append(step + GRAPHED.piece_s(chunk, frontier))
        frontier += chunk
    assert max(gaps) <= 2.5 * step


def test_graph_and_mixed_costs_are_checked():
    with pytest.raises(ValueError, match="ascending length"):
        dataclasses.replace(GRAPHED, graph_piece_s=(1e-3, 0.8e-3, 1.5e-3, 2.9e-3))  # a longer bucket faster
    with pytest.raises(ValueError, match="ascending length"):
        dataclasses.replace(GRAPHED, graph_buckets=(64, 128))
    with pytest.raises(ValueError, match="ascending length"):
        dataclasses.replace(NINE_B, mixed_tokens=(512, 64), mixed_pass_s=(1e-3, 2e-3))
    with pytest.raises(ValueError, match="ascending length"):
        dataclasses.replace(NINE_B, mixed_tokens=(64,), mixed_pass_s=())


def test_an_8192_token_prompt_beside_decoding_rows_keeps_every_gap_within_the_bound():
    """The issue's case on the model: 8 rows decode while an 8192-token prompt prefills; each gap a decoding row
    sees is one step plus one chunk. Every gap stays within 2.5 steps; with nothing decoding it is one piece."""
    frontier, gaps, step = 0, [], NINE_B.step_s(8)
    while frontier < 8192:
        chunk, _ = prefill_chunk(NINE_B, 8192 - frontier, frontier, 8, None, 2.5)
        gaps.append(step + NINE_B.piece_s(chunk, frontier))
        frontier += chunk
    assert max(gaps) <= 2.5 * step and len(gaps) > 1
    assert prefill_chunk(NINE_B, 8192, 0, 0, None, 2.5) == (8192, ChunkVerdict.WHOLE)


@pytest.mark.parametrize("rows", [1, 4, 8])
@pytest.mark.parametrize("frontier", [0, 4096, 30000])
def test_a_riding_chunk_bounds_its_pass(rows, frontier):
    """Riding on the round, a decoding row waits the one pass: the chunk is the largest whose pass over it and the
    decode rows fits the whole ITL budget, not the budget less a step."""
    chunk, verdict = prefill_chunk(NINE_B, 9000, frontier, rows, None, 2.5, mixed=True)
    budget = MARGIN * 2.5 * NINE_B.step_s(rows)
    assert verdict is ChunkVerdict.ITL and chunk % GRID == 0
    assert NINE_B.mixed_s(chunk, frontier, rows) <= budget < NINE_B.mixed_s(chunk + GRID, frontier, rows)
    assert chunk > prefill_chunk(NINE_B, 9000, frontier, rows, None, 2.5)[0]


def test_riding_chunks_keep_prefill_near_its_speed_alone():
    """Issue 14's case on the model: an 8192-token prompt beside 8 decoding rows. Riding, each gap is one pass
    within 2.5 steps and the prompt is done within 20% of its one-piece time (the rows decoding all along);
    alternating, the steps between the smaller chunks more than double it."""
    step, alone = NINE_B.step_s(8), NINE_B.piece_s(8192, 0)
    took = {}
    for mixed in (False, True):
        frontier, gaps = 0, []
        while frontier < 8192:
            chunk, _ = prefill_chunk(NINE_B, 8192 - frontier, frontier, 8, None, 2.5, mixed=mixed)
            gaps.append(NINE_B.mixed_s(chunk, frontier, 8) if mixed else step + NINE_B.piece_s(chunk, frontier))
            frontier += chunk
        assert max(gaps) <= 2.5 * step
        took[mixed] = sum(gaps)
    assert took[True] <= 1.2 * alone and took[False] > 2 * alone


def test_measured_mixed_passes_predict_a_riding_chunk():
    """With timed passes the prediction is the shortest timed length holding the chunk (a graphed pass runs its
    whole bucket; beyond the longest, along its last segment), plus the attention over the keys before the chunk
    and the plain step's growth per extra row; the chunk sizing follows the table rather than the eager fit."""
    costs = dataclasses.replace(NINE_B, mixed_tokens=(64, 256, 512, 1024), mixed_pass_s=(8e-3, 9e-3, 11e-3, 26e-3))
    assert costs.mixed_s(10, 0, 1) == costs.mixed_s(64, 0, 1) == 8e-3  # a pass reads every weight however short
    assert costs.mixed_s(300, 0, 1) == costs.mixed_s(512, 0, 1) == 11e-3
    assert costs.mixed_s(1536, 0, 1) == pytest.approx(41e-3)
    assert costs.mixed_s(512, 1000, 1) == pytest.approx(11e-3 + 512 * 1000 * NINE_B.pair_s)
    assert costs.mixed_s(512, 0, 8) == pytest.approx(11e-3 + NINE_B.step_s(8) - NINE_B.step_s(1))
    # budget 0.8 * 2.5 * 6.3 ms = 12.6 ms with 0.9 ms for seven more rows: 512 tokens (11.9 ms) fit, more do not
    assert prefill_chunk(costs, 9000, 0, 8, None, 2.5, mixed=True) == (512, ChunkVerdict.ITL)
    assert prefill_chunk(NINE_B, 9000, 0, 8, None, 2.5, mixed=True)[0] != 512  # the fit sizes otherwise


def prompt(n: int) -> list[int]:
    return [1 + i % 90 for i in range(n)]  # inside the toy vocabulary


def test_the_engine_asks_for_the_sized_chunks(make_engine):
    """Through the Engine over a Program reporting measured costs: a prompt alone runs whole; a prompt beside a
    decoding request runs in the ITL-bounded chunks; an explicit prefill_chunk overrides both."""
    costs = PrefillCosts(fixed_s=1e-4, token_s=1e-5, decode_step_s=(1e-3, 1e-3), max_piece=192, measured=True)
    asked = []

    def program():
        prog = ToyProgram(max_concurrency=2)
        prog.limits = dataclasses.replace(prog.limits, prefill=costs)
        prefill = prog.prefill
        prog.prefill = lambda handle, n, mask=None: asked.append(n) or prefill(handle, n, mask)
        return prog
    eng, _ = make_engine(program(), max_concurrency=2)
    eng.submit(token_request(prompt(199), 3))
    eng.run_until_idle()
    assert asked == [192, 7]  # the Program's largest piece, then the rest
    for mixed, chunks in ((False, [4, 64, 64, 71]), (True, [4, 128, 71])):
        asked.clear()
        eng, _ = make_engine(program(), max_concurrency=2, mixed_prefill=mixed)
        eng.submit(GenerationRequest((95, 94, 93, 92), TokenSession(40, stop_ids=()), 40))  # never stops early
        for _ in range(4):  # the first request is decoding
            eng.step()
        eng.submit(token_request(prompt(199), 3))
        eng.run_until_idle()
        # alternating: 0.8 * 1.5 ms budget, 1e-4 + t * 1e-5 <= 1.2e-3 -> t <= 110: 64 tokens a chunk, then 71 at
        # once. Riding on the round: 0.8 * 2.5 ms for the one pass over t + 1 rows -> t <= 189: 128, then 71
        assert asked == chunks, mixed
    asked.clear()
    eng, _ = make_engine(program(), max_concurrency=2, prefill_chunk=50)
    eng.submit(token_request(prompt(119), 3))
    eng.run_until_idle()
    assert asked == [50, 50, 19]
