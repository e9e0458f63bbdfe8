"""DraftPolicy: the verify width of each speculative round from measured round costs and observed acceptance."""

from __future__ import annotations

import pytest

from ninfer.program_core.draft_policy import DECAY, DraftPolicy, RoundCosts, candidate_widths

# a 9B-like MTP round (k = 3): width 1 is the plain step, each draft adds a head step, verify grows with the block
MTP_COSTS = RoundCosts((1, 2, 4), ((7.0e-3, 9.5e-3, 12.0e-3), (7.2e-3, 9.8e-3, 12.6e-3)))


def _settle(policy: DraftPolicy, width: int, offered: list[int], produced: list[int], rounds: int = 200) -> None:
    for _ in range(rounds):
        policy.observe(width, offered, produced)


def test_candidate_widths_are_one_the_powers_of_two_and_the_block():
    assert candidate_widths(1) == (1, 2)
    assert candidate_widths(3) == (1, 2, 4)
    assert candidate_widths(5) == (1, 2, 4, 6)
    assert candidate_widths(15) == (1, 2, 4, 8, 16)


def test_without_costs_every_round_takes_the_full_block():
    policy = DraftPolicy(3)
    _settle(policy, 4, [3], [1])  # nothing accepted, ever: without costs the policy has no price to weigh
    assert policy.width([3, 3]) == 4 and policy.width([0]) == 4


def test_a_fresh_policy_is_optimistic_and_takes_the_full_width():
    assert DraftPolicy(3, MTP_COSTS).width([3]) == 4


def test_rejected_drafts_fall_back_to_the_plain_step_and_accepted_ones_keep_the_block():
    rejecting, accepting = DraftPolicy(3, MTP_COSTS), DraftPolicy(3, MTP_COSTS)
    _settle(rejecting, 4, [3, 3], [1, 1])
    _settle(accepting, 4, [3, 3], [4, 4])
    assert rejecting.width([3, 3]) == 1
    assert accepting.width([3, 3]) == 4
    assert rejecting.rates()[0] < 0.05 and accepting.rates() == pytest.approx([1.0] * 3)


def test_a_middle_acceptance_picks_a_middle_width():
    """Draft 0 always accepted, draft 1 never: 2 tokens per round at width 2 (9.5 ms) beat 2 at width 4 (12 ms)
    and 1 at width 1 (7 ms)."""
    policy = DraftPolicy(3, MTP_COSTS)
    _settle(policy, 4, [3], [2])
    assert policy.width([3]) == 2


def test_a_cut_blocks_replay_is_priced_by_the_chance_of_a_cut():
    """A plan without step states replays a cut block's kept tokens at commit (35B-A3B beside a drafter on an
    H100). Two rows whose one draft holds half the time, never both: 3 tokens a round at width 2 in 9.8 ms beat
    two plain steps' 2 in 7.2 ms, but not with a 9.3 ms replay after the 3 rounds in 4 that cut a block; a block
    that is never cut never pays for its replay."""
    cutting = RoundCosts(MTP_COSTS.widths, MTP_COSTS.per_batch, ((0.0, 9.0e-3, 12.0e-3), (0.0, 9.3e-3, 12.6e-3)))

    def half(costs: RoundCosts) -> DraftPolicy:
        policy = DraftPolicy(3, costs)
        for i in range(200):
            policy.observe(2, [1, 1], [1 + i % 2, 2 - i % 2])
        return policy
    assert half(MTP_COSTS).width([1, 1]) == 2 and half(cutting).width([1, 1]) == 1
    accepting = DraftPolicy(3, cutting)
    _settle(accepting, 4, [3, 3], [4, 4])
    assert accepting.width([3, 3]) == 4
    assert cutting.replay(2, 1) == 9.3e-3 and MTP_COSTS.replay(2, 1) == 0.0


def test_replay_costs_are_checked():
    with pytest.raises(ValueError, match="replay"):
        RoundCosts((1, 2), ((1e-3, 2e-3),), ((0.0,),))


def test_observations_are_censored_at_the_first_rejection_and_at_the_offer():
    policy = DraftPolicy(3, MTP_COSTS)
    policy.observe(4, [3, 1, 0], [2, 2, 1])
    # row 0: draft 0 kept, draft 1 rejected, draft 2 never examined; row 1: its one draft kept; row 2: no offer
    assert policy.trials == [2.0, 1.0, 0.0] and policy.hits == [2.0, 0.0, 0.0]
    policy.observe(1, [0], [1])
    assert policy.trials == pytest.approx([2 * DECAY, DECAY, 0.0]) and policy.rounds == {1: 1, 2: 0, 4: 1}


def test_plain_rounds_let_the_evidence_decay_until_the_block_is_tried_again():
    """After the drafts stop paying, rounds go plain; the old evidence then fades and the policy drafts again (the
    acceptance may have changed), so a narrow choice is never final."""
    policy = DraftPolicy(3, MTP_COSTS)
    _settle(policy, 4, [3], [1])
    plain = 0
    while policy.width([3]) == 1:
        policy.observe(1, [0], [1])
        plain += 1
        assert plain < 2000, "the policy never drafts again"
    assert plain > 20  # but not at once: the evidence is weighed first


def test_rows_without_room_never_widen_the_round():
    policy = DraftPolicy(3, MTP_COSTS)
    assert policy.width([0, 0]) == 1
    assert policy.width([1, 0]) == 2  # one row may take a draft: the 4-wide block would only pad


@pytest.mark.parametrize("widths, per_batch", [((2, 4), ((1.0, 2.0),)), ((1, 4, 2), ((1.0, 2.0, 3.0),)),
                                               ((1, 4), ((1.0,),)), ((1, 4), ((1.0, float("nan")),)),
                                               ((1, 4), ())])
def test_malformed_round_costs_are_refused(widths, per_batch):
    with pytest.raises(ValueError, match="round"):
        RoundCosts(widths, per_batch)


def test_costs_for_another_block_are_refused():
    with pytest.raises(ValueError, match="blocks of 8"):
        DraftPolicy(7, MTP_COSTS)
