"""`measure_rounds`: the speculative round's costs the fast Program measures at start on CUDA for its draft policy
(`program_core/draft_policy.py`), run here with a stand-in timer (every timed run 1 ms) over the eager bodies on the
CPU and the captured graphs on the GPU: per B = 1..max_concurrency and per verify width, the verify pass of B full
blocks of that width on the dummy slot and row, plus the backend's draft of width - 1 tokens past width 1."""

from __future__ import annotations

import pytest

from ninfer.program_core.draft_policy import DraftPolicy


def _program(method: str, make_fast_spec, make_fast_dflash):
    if method == "mtp":
        return make_fast_spec(3, adaptive=True), 3
    return make_fast_dflash("dflash", 7, adaptive=True), 7


@pytest.mark.parametrize("method", ["mtp", "dflash", "dflash-replaying"])
def test_round_costs_time_every_width_and_the_draft_past_width_one(make_fast_spec, make_fast_dflash,
                                                                    make_replaying_dflash, monkeypatch, method):
    """`dflash-replaying`: a plan without step states also times the replay pass (no backups) of B rows at every
    width past 1, which the policy prices by the chance of a cut."""
    from ninfer.fast.program import costs

    program, k = (make_replaying_dflash("dflash", 15, adaptive=True), 15) if method == "dflash-replaying" else \
        _program(method, make_fast_spec, make_fast_dflash)
    ex, lanes = program.executor, program.limits.max_concurrency
    verifier = ex.verifier
    passes, drafts = [], []
    # the passes and drafts measure_rounds times, recorded where it asks for them (on CUDA their graphs replay, on
    # the CPU the eager bodies run)
    dummy_pass = verifier.dummy_pass
    monkeypatch.setattr(verifier, "dummy_pass", lambda B, width, backup=True: passes.append((B, width, backup)) or
                        dummy_pass(B, width, backup))
    dummy_draft = ex.drafter.dummy_draft if method == "mtp" else ex.dflash.graphs.dummy_draft

    def draft(B: int, n: int):
        drafts.append((B, n))
        return dummy_draft(B, n)
    monkeypatch.setattr(costs, "_best", lambda device, fn, repeats=3: (fn(), 1e-3)[1])
    measured = costs.measure_rounds(verifier, draft)

    widths = {3: (1, 2, 4), 7: (1, 2, 4, 8), 15: (1, 2, 4, 8, 16)}[k]
    assert measured.widths == verifier.widths == widths
    assert measured.per_batch == ((1e-3,) + (2e-3,) * (len(widths) - 1),) * lanes  # verify, then verify + draft
    replays = [(B, w, False) for B in range(1, lanes + 1) for w in widths[1:]] if method == "dflash-replaying" else []
    assert sorted(passes) == sorted([(B, w, True) for B in range(1, lanes + 1) for w in widths] + replays)
    assert measured.replays == (((0.0,) + (1e-3,) * (len(widths) - 1),) * lanes if replays else ())
    # the backend's greedy draft of w - 1 tokens over B rows for each width past 1
    assert sorted(drafts) == sorted((B, w - 1) for B in range(1, lanes + 1) for w in widths[1:])
    assert DraftPolicy(k, measured).width([k] * lanes) == k + 1  # a fresh policy takes the whole block
