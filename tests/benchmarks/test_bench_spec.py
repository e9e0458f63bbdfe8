"""bench_spec.py's forced acceptance holds even when the verify pass disagrees with the plain step's greedy
continuation (a bf16 verify at a near-tie): the pinned logits keep every round at exactly the forced length, and
every row on the continuation. Here the verify logits are replaced by noise, so nothing agrees by itself."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))
import bench_spec as bs  # noqa: E402
from runlog import Run  # noqa: E402
from spec_forcing import ForcedContinuation  # noqa: E402


def test_forced_lengths_survive_a_verify_that_agrees_with_nothing():
    s = dataclasses.replace(bs.SMOKE, batches=(2,))
    run = Run(120.0, None, s, "bench_spec.json")
    gen = torch.Generator().manual_seed(3)
    vocab = bs.config("tiny").vocab_size
    prompts = {2: [bs.random_prompt(gen, s.prompt_len, vocab) for _ in range(2)]}
    tokens = 1 + s.steps * (s.k + 1) + 2 * (s.k + 1)
    continuations = bs.bench_autoregressive(run, "tiny", prompts, tokens, {})
    program, engine = bs.build(s, "tiny", s.k)
    real = program.executor.verify
    noise = torch.Generator().manual_seed(4)
    program.executor.verify = lambda seqs, feds: [torch.randn(lg.shape, generator=noise) for lg in real(seqs, feds)]
    forced = ForcedContinuation(program, continuations, vocab, "cpu")
    try:
        for L in range(1, s.k + 2):
            forced.reset(L - 1)
            timed = 1 + s.steps * L
            trackers = bs.run_requests(engine, prompts[2], timed + s.k + 1 + L)
            assert bs.steady(trackers, timed)["tokens_per_step"] == L
            assert forced.diverged == 0 and forced.followed > 0
            for p, t in zip(prompts[2], trackers):
                assert t.tokens == continuations[tuple(p)][:len(t.tokens)]
    finally:
        bs.teardown(s, program, engine)


def test_the_adaptive_rows_follow_the_forced_acceptance():
    """bench_adaptive's rows (the Engine's default rounds, `DraftPolicy` over round costs; here given, the
    reference Program measures none): with every draft rejected the rounds go plain (width 1, one token each),
    with every draft accepted they keep the full block; every row stays on the greedy continuation."""
    s = dataclasses.replace(bs.SMOKE, batches=(2,), steps=8)
    run = Run(120.0, None, s, "bench_spec.json")
    gen = torch.Generator().manual_seed(5)
    vocab = bs.config("tiny").vocab_size
    prompts = {2: [bs.random_prompt(gen, s.prompt_len, vocab) for _ in range(2)]}
    tokens = 1 + (s.steps + 1) * (s.k + 1) + 2 * (s.k + 1)
    continuations = bs.bench_autoregressive(run, "tiny", prompts, tokens, {})
    program, engine = bs.build(s, "tiny", s.k)
    forced = ForcedContinuation(program, continuations, vocab, "cpu")
    costs = bs.RoundCosts((1, 2, 4), ((1.0e-3, 1.6e-3, 2.2e-3),) * 2)
    entry: dict = {}
    try:
        bs.bench_adaptive(run, engine, program, prompts[2], forced, entry, s.k, costs)
        rows = {r["L"]: r for r in entry["adaptive"]}
        assert sorted(rows) == bs.lengths(s, s.k) and forced.diverged == 0
        assert rows[1]["tokens_per_step"] == 1 and rows[1]["widths"]["1"] > rows[1]["widths"].get("4", 0)
        assert rows[s.k + 1]["tokens_per_step"] == s.k + 1 and set(rows[s.k + 1]["widths"]) == {"4"}
    finally:
        bs.teardown(s, program, engine)
