"""`measure_rounds`: the speculative round's costs the fast Program measures at start on CUDA for its draft policy
(`program_core/draft_policy.py`), run here over the eager bodies with a stand-in timer (every timed run 1 ms): per
B = 1..max_concurrency and per verify width, the verify pass of B full blocks of that width on the dummy slot and
row, plus the backend's draft of width - 1 tokens past width 1."""

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
    body = verifier.body
    monkeypatch.setattr(verifier, "body", lambda B, backup, width=None: passes.append((B, width, backup)) or
                        body(B, backup, width))
    if method == "mtp":
        step = ex.drafter.step
        monkeypatch.setattr(ex.drafter, "step", lambda B, variant: drafts.append(B) or step(B, variant))
        draft = ex.drafter.dummy_draft
    else:
        block = ex.dflash.graphs.body
        monkeypatch.setattr(ex.dflash.graphs, "body",
                            lambda R, variant, block_draw=False: drafts.append(R) or block(R, variant, block_draw))
        draft = ex.dflash.graphs.dummy_draft
    monkeypatch.setattr(costs, "_best", lambda device, fn, repeats=3: (fn(), 1e-3)[1])
    measured = costs.measure_rounds(verifier, draft)

    widths = {3: (1, 2, 4), 7: (1, 2, 4, 8), 15: (1, 2, 4, 8, 16)}[k]
    assert measured.widths == verifier.widths == widths
    assert measured.per_batch == ((1e-3,) + (2e-3,) * (len(widths) - 1),) * lanes  # verify, then verify + draft
    replays = [(B, w, False) for B in range(1, lanes + 1) for w in widths[1:]] if method == "dflash-replaying" else []
    assert sorted(passes) == sorted([(B, w, True) for B in range(1, lanes + 1) for w in widths] + replays)
    assert measured.replays == (((0.0,) + (1e-3,) * (len(widths) - 1),) * lanes if replays else ())
    if method == "mtp":  # w - 1 chained head steps of B rows for each width past 1
        assert sorted(drafts) == sorted(B for B in range(1, lanes + 1) for w in widths[1:] for _ in range(w - 1))
    else:  # one block pass of R rows for each width past 1, whatever the width
        assert sorted(drafts) == sorted(B for B in range(1, lanes + 1) for _ in widths[1:])
    assert DraftPolicy(k, measured).width([k] * lanes) == k + 1  # a fresh policy takes the whole block
