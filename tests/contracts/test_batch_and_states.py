"""The seed's accepted-prefix rules, move-only PendingBatch, and the lifecycle transition tables."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ninfer.contracts import (BatchKind, EngineFailure, IllegalTransition, LaneState, PendingBatch, PendingRow,
                              RequestState, RowDecision, SequenceHandle, check_lane_transition,
                              check_request_transition, check_row_decision)


def _legal(produced: int, d: RowDecision) -> bool:
    """The rule restated independently: cancelled -> 0 and terminal; else 1..produced, all unless terminal."""
    if d.cancelled:
        ok = d.accepted == 0 and d.terminal
    else:
        ok = 1 <= d.accepted <= produced and (d.terminal or d.accepted == produced)
    return ok and (d.boundary is None or 0 <= d.boundary <= d.accepted)


@given(produced=st.integers(1, 8), accepted=st.integers(-1, 9), terminal=st.booleans(), cancelled=st.booleans(),
       boundary=st.one_of(st.none(), st.integers(-1, 9)))
def test_row_decision_rule(produced, accepted, terminal, cancelled, boundary):
    d = RowDecision(accepted=accepted, terminal=terminal, cancelled=cancelled, boundary=boundary)
    if _legal(produced, d):
        check_row_decision(produced, d)
    else:
        with pytest.raises(EngineFailure):
            check_row_decision(produced, d)


def _batch(kind=BatchKind.DECODE, produced=(1, 3)):
    rows = tuple(PendingRow(SequenceHandle(i, 0), tuple(range(n)), base_frontier=10) for i, n in enumerate(produced))
    return PendingBatch(kind, rows, resource_revision=0)


def test_batch_is_consumed_exactly_once():
    b = _batch()
    assert b.take() is b and b.consumed
    with pytest.raises(EngineFailure, match="twice"):
        b.take()


def test_batch_rejects_duplicate_slots_and_empty_rows():
    row = PendingRow(SequenceHandle(0, 0), (5,), base_frontier=0)
    with pytest.raises(EngineFailure, match="twice"):
        PendingBatch(BatchKind.DECODE, (row, row), resource_revision=0)
    with pytest.raises(EngineFailure, match="at least one row"):
        PendingBatch(BatchKind.DECODE, (), resource_revision=0)
    with pytest.raises(EngineFailure, match="at least one token"):
        PendingBatch(BatchKind.DECODE, (PendingRow(SequenceHandle(0, 0), (), 0),), resource_revision=0)


def test_batch_decisions_cover_every_row():
    b = _batch(produced=(1, 3))
    b.check_decisions([RowDecision(1, False), RowDecision(2, True)])
    with pytest.raises(EngineFailure, match="decisions for a batch"):
        b.check_decisions([RowDecision(1, False)])
    with pytest.raises(EngineFailure, match="illegal row decision"):
        b.check_decisions([RowDecision(1, False), RowDecision(2, False)])


def test_control_suffix_is_all_or_nothing():
    b = _batch(kind=BatchKind.CONTROL, produced=(3,))
    b.check_decisions([RowDecision(3, False)])
    b.check_decisions([RowDecision(0, True, cancelled=True)])
    with pytest.raises(EngineFailure, match="whole"):
        b.check_decisions([RowDecision(2, True)])


def test_request_lifecycle_paths():
    S = RequestState
    path = [S.WAITING, S.MATERIALIZING, S.PREFILL, S.PREFILL, S.DECODE_READY, S.CONTROL_READY, S.DECODE_READY,
            S.TERMINAL_PENDING, S.FINISHED]
    for old, new in zip(path, path[1:]):
        check_request_transition(old, new)
    for old, new in [(S.WAITING, S.PREFILL), (S.DECODE_READY, S.FINISHED), (S.FINISHED, S.WAITING),
                     (S.TERMINAL_PENDING, S.DECODE_READY)]:
        with pytest.raises(IllegalTransition):
            check_request_transition(old, new)


def test_lane_lifecycle_paths():
    L = LaneState
    for old, new in [(L.FREE, L.MATERIALIZING), (L.MATERIALIZING, L.ACTIVE), (L.ACTIVE, L.TERMINAL_PENDING),
                     (L.TERMINAL_PENDING, L.FREE), (L.MATERIALIZING, L.FREE)]:
        check_lane_transition(old, new)
    for old, new in [(L.FREE, L.ACTIVE), (L.ACTIVE, L.FREE), (L.TERMINAL_PENDING, L.ACTIVE)]:
        with pytest.raises(IllegalTransition):
            check_lane_transition(old, new)
