"""Host syncs of the fast Program's speculative round, counted on any device (``ninfer.testing.host_syncs``): a
round of greedy and sampled rows (with logprobs) makes exactly one, its readback, and committing it none, with the
MTP head and with the DFlash / DFlash2 drafters: a block cut by acceptance or by the Engine takes its state from the
step slots (`select`), or, for a DFlash plan whose step states pass their share of the budget, replays its kept
tokens from the backup (both counted). A regression (a
per-position ``.item()``, a list built straight onto the device, the drafts read back before verify) fails here,
where the GPU would only show it as a slower round."""

from __future__ import annotations

import pytest

from ninfer.contracts import RowDecision
from ninfer.sampling import SamplingParams
from ninfer.testing.host_syncs import count_host_syncs
from ninfer.testing.spec_driving import start_decoding
from ninfer.testing.speculation import ForcedDrafts

GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=0.8, top_p=0.9, presence_penalty=0.5, logprobs=2)


@pytest.mark.parametrize("forced", [False, True], ids=["mtp-drafts", "forced-drafts"])
def test_a_round_syncs_once_and_its_commit_never(make_fast_spec, mtp_reference_model, prompt_of, forced):
    program = make_fast_spec(3)
    if forced:  # a host drafter (the draft hook replaced): its drafts cross to the device without a wait
        ForcedDrafts(mtp_reference_model).install(program)
    _rounds(program, prompt_of, forced)


@pytest.mark.parametrize("forced, replay", [(False, False), (True, False), (True, True)],
                         ids=["drafter", "forced-drafts", "forced-replay"])
@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_a_dflash_round_syncs_once_and_its_commit_never(make_fast_dflash, prompt_of, kind, forced, replay):
    """The drafter's block pass, its draws (DFlash2's selector walk slot by slot) on the device, the verify pass
    with the drafter context's extension: one sync a round (they were 8 for DFlash and 28 for DFlash2 at k = 7,
    each block's index lists built straight onto the device and the drafts drawn on the host). `replay`: the plan
    keeps no step states (the 27B's), so every cut block's commit replays its kept tokens from the backup."""
    program = make_fast_dflash(kind, 7, forced=forced)
    assert program.model.plan.step_slots == 7
    if replay:
        program.executor.select = lambda seq, keep: False  # what `select` answers for a plan without step slots
    _rounds(program, prompt_of, forced)


def _rounds(program, prompt_of, forced: bool) -> None:
    rollbacks = []  # the tokens each cut block kept
    select = program.executor.select
    program.executor.select = lambda seq, keep: rollbacks.append(keep) or select(seq, keep)
    handles = [start_decoding(program, prompt_of(n, seed=n), 64, sampling=p, seed=7)
               for n, p in ((9, GREEDY), (14, SAMPLED))]
    for i in range(12):
        with count_host_syncs() as syncs:
            batch = program.decode(handles)
        assert syncs.count == 1 and "host_sync" in syncs.sites[0], syncs.sites
        # from round 5 on, the first round where a block kept drafts cuts every block after one token (the terminal
        # rule); which round that is depends on the forced lengths and on the target's
        # argmax agreeing with the teacher's, which differ between the CPU and the GPU model
        last = i >= 5 and (max(row.produced for row in batch.rows) > 1 or (not forced and i == 5))
        with count_host_syncs() as syncs:
            program.commit(batch.take(), [RowDecision(1, True) if last else RowDecision(row.produced, False)
                                          for row in batch.rows])
        assert syncs.count == 0, syncs.sites
        program.check_invariants()
        if last:
            break
    assert last and (not forced or max(row.produced for row in batch.rows) > 1)  # the cut dropped kept drafts
    # the commits counted above cut blocks inside (the last round's two rows at least), forced ones after kept drafts
    assert len(rollbacks) >= 2 and (not forced or any(k > 1 for k in rollbacks)), rollbacks


@pytest.mark.parametrize("kind", ["mtp", "dflash", "dflash2"])
def test_a_grammar_round_syncs_once_and_fills_from_its_own_drafts(make_fast_spec, make_fast_dflash, prompt_of,
                                                                  kind):
    """Rows under a grammar whose rows depend on the drafts (`DraftMasks.fill`): the fill reads the drafts on the
    device side of the round (`PrefixMasks`' host function in stream order), so the round still syncs once (reading
    the drafts back before acceptance made it two), each fill saw exactly its row's drafts of that round, and its
    rows applied where they belong: a grammar that allows only the next draft at every draft position makes every
    row, greedy or sampled, accept its whole block."""
    import torch

    from ninfer.contracts import DraftMasks

    program = make_fast_spec(3) if kind == "mtp" else make_fast_dflash(kind, 7)
    V, blocks, draft = program.limits.vocab_size, [], program.executor.draft
    verifier = program.executor.verifier
    queue, in_pass = verifier.masks.queue, []  # where each round's bracket runs: inside its verify pass
    verifier.masks.queue = lambda *a: in_pass.append(a[2]) or queue(*a)
    program.executor.draft = lambda *a: blocks.append(draft(*a)) or blocks[-1]
    handles = [start_decoding(program, prompt_of(n, seed=n), 64, sampling=p, seed=7)
               for n, p in ((9, GREEDY), (14, SAMPLED))]
    seen: dict = {h: [] for h in handles}

    def masks_of(h):
        def fill(drafts):
            seen[h].append(tuple(drafts))
            rows = torch.zeros(len(drafts) + 1, V, dtype=torch.bool)
            rows[torch.arange(len(drafts)), list(drafts)] = True
            rows[-1] = True  # the bonus position: anything
            return rows
        return DraftMasks(fill=fill)
    for _ in range(4):
        with count_host_syncs() as syncs:
            batch = program.decode(handles, [masks_of(h) for h in handles])
        assert syncs.count == 1 and "host_sync" in syncs.sites[0], syncs.sites
        drafted = [blocks[-1].host(b) for b in range(len(handles))]  # read back with the round: no sync
        assert [seen[h][-1] for h in handles] == drafted
        for row, d in zip(batch.rows, drafted):
            assert row.failure is None and row.tokens[:-1] == d, (row, d)
        program.commit(batch.take(), [RowDecision(row.produced, False) for row in batch.rows])
        program.check_invariants()
    assert all(len(v) == 4 for v in seen.values())
    # one captured step on CUDA: the verify graphs' masked twins hold the bracket (eager bodies elsewhere)
    assert in_pass == [True] * 4 and any(key[3] for key in verifier.graphs) == verifier.use_graphs
