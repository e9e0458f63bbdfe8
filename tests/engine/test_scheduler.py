"""The Scheduler's unit choice with staged prefill beside decoding rows: with mixed units a staged prompt's chunk
rides in every decode round (round robin over the staged requests), otherwise prefill and decode alternate;
forced control comes first either way, and with nothing decoding a prefill runs alone."""

from __future__ import annotations

from ninfer.engine.scheduler import Scheduler, Unit


def _scheduler(mixed: bool) -> Scheduler:
    s = Scheduler(concurrent_prefill=True, mixed=mixed)
    for rid in (5, 6):  # staged prompts
        s.start_prefill(rid)
    s.set_decode_ready(2, lane=1)
    s.set_decode_ready(1, lane=0)
    return s


def test_a_staged_chunk_rides_in_every_decode_round_round_robin():
    s = _scheduler(mixed=True)
    units = [s.next_unit() for _ in range(4)]
    assert units == [Unit("decode", (1, 2), riding=5), Unit("decode", (1, 2), riding=6),
                     Unit("decode", (1, 2), riding=5), Unit("decode", (1, 2), riding=6)]
    s.set_control_ready(1)
    assert s.next_unit() == Unit("control", (1,))  # control first; the round then holds the rest
    assert s.next_unit() == Unit("control", (1,))
    s.set_decode_ready(1, lane=0)
    s.leave_active(1)
    s.leave_active(2)
    assert s.next_unit() == Unit("prefill", (5,))  # nothing decodes: the chunk runs alone
    s.check_invariants()


def test_without_mixed_units_prefill_and_decode_alternate():
    s = _scheduler(mixed=False)
    units = [s.next_unit() for _ in range(4)]
    assert units == [Unit("prefill", (5,)), Unit("decode", (1, 2)), Unit("prefill", (6,)), Unit("decode", (1, 2))]
    s.check_invariants()
