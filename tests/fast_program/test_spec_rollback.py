"""A partly accepted block on the fast Program (docs/speculative.md, "Commit and rollback"): the verify pass keeps the
state after each block position in the row's step slots, and the commit takes the kept tokens' state from there. It
must run no second target pass (the launches of the commit are one slot copy a cut row) and leave exactly the pools
the replay from the backup leaves (the reference Program's rule, which the fast Program keeps for DFlash): the same
live slots, stored hiddens and K/V below the frontier, round after round, for blocks cut by acceptance and by the
Engine, graphed or eager."""

from __future__ import annotations

import os
from collections import Counter

import pytest
import torch

from ninfer.contracts import RowDecision
from ninfer.sampling import SamplingParams
from ninfer.testing.launches import count_step
from ninfer.testing.numerics import assert_close
from ninfer.testing.spec_driving import start_decoding

ON_GPU = os.environ.get("NINFER_TEST_DEVICE") == "cuda" and torch.cuda.is_available()
PARAMS = (SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_p=0.9))


def _state(program, handles):
    """Every live slot's GDN state and stored hidden (MTP), and all K/V below each frontier (target and MTP layers,
    a DFlash drafter's context)."""
    pools, ps, out = program.model.pools, program.config.page_size, []
    for h in handles:
        seq = program.sequence(h)
        out += [pools.conv[:, h.slot], pools.ssm[:, h.slot]]
        out += [] if pools.mtp_hidden is None else [pools.mtp_hidden[h.slot]]
        pages = torch.tensor(seq.table, dtype=torch.long)[torch.arange(seq.frontier) // ps].to(pools.k.device)
        offsets = (torch.arange(seq.frontier) % ps).to(pools.k.device)
        out += [t[:, pages, offsets] for t in pools.page_pools()]
    return [t.clone() for t in out]


def _replaying(program):
    """The same Program committing a cut block by the replay from the backup (`speculation.rollback` without
    `select`): the oracle the step slots must equal."""
    program.executor.select = lambda seq, keep: False
    return program


@pytest.mark.parametrize("backend", ["mtp", "dflash"])
@pytest.mark.parametrize("eager", [False, True], ids=["verify-graphs", "eager-verify"])
def test_a_cut_block_takes_its_state_without_a_second_pass(make_fast_spec, make_fast_dflash, prompt_of, eager,
                                                            backend):
    make = (lambda: make_fast_spec(3, forced=True)) if backend == "mtp" else \
        (lambda: make_fast_dflash("dflash", 7, forced=True))  # 7 step slots a row: the budget affords them
    programs = [make(), _replaying(make())]
    assert programs[0].model.plan.step_slots == (3 if backend == "mtp" else 7)
    if eager:
        for p in programs:
            p.executor.verifier = None
    tokens = 80 if backend == "mtp" else 180  # 10 rounds and up to 10 more of blocks up to k + 1 long
    runs = [[start_decoding(p, prompt_of(n, seed=n), tokens, sampling=s, seed=5) for n, s in zip((9, 14), PARAMS)]
            for p in programs]
    cut = 0
    for i in range(20):
        batches = [p.decode(hs) for p, hs in zip(programs, runs)]
        assert batches[0].rows == batches[1].rows, i
        # acceptance cuts blocks from round 0; from round 10, in the first round where a row produced more than one
        # token, the Engine's terminal rule (a stop string, max_tokens) cuts every row one token short of what it
        # produced, and the rows end there
        last = i >= 10 and any(r.produced > 1 for r in batches[0].rows)
        decisions = [RowDecision(max(1, r.produced - 1), True) if last else RowDecision(r.produced, False)
                     for r in batches[0].rows]
        cuts = sum(d.accepted < len(p.fed) for d, p in zip(decisions, batches[0].payload))
        launches = count_step(lambda: programs[0].commit(batches[0].take(), decisions))
        programs[1].commit(batches[1].take(), decisions)
        # one slot copy a cut row (conv windows, S, the MTP head's stored hidden), no model launch
        copies = (3 if backend == "mtp" else 2) * cuts
        assert Counter(n for _, n in launches.launches) == Counter({"aten.copy_": copies} if cuts else {}), i
        assert not launches.counts().keys() & {"gdn", "attention", "ffn"}
        cut += cuts
        for p in programs:
            p.check_invariants()
        for a, b in zip(*(_state(p, hs) for p, hs in zip(programs, runs))):
            assert_close(f"round {i}", b, a, 1e-2 if ON_GPU else 1e-5)
        if last:
            break
    assert last, "no round in which the Engine could cut a row"
    assert cut >= 5, cut
