"""kernel_table.py's per-call spans and profile_graphs.py's choice of table, on the CPU (the GPU run has no other
check: a wrong split of the calls, or a replay table that CUPTI left empty taken at its word, would mislead the
next profile)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))
import kernel_table as kt  # noqa: E402
import profile_graphs as pg  # noqa: E402


def test_span_splits_the_calls_by_count():
    # two calls of two kernels: spans 3 (0..3) and 5 (10..15)
    events = [("a", 0.0, 1.0, 1.0), ("b", 2.0, 3.0, 1.0), ("a", 10.0, 11.0, 1.0), ("b", 13.0, 15.0, 2.0)]
    assert kt._span(events, 2) == 4.0
    assert kt._span(events[:3], 2) is None  # the calls launched different counts
    overlapping = events[:2] + [("a", 2.5, 4.0, 1.5), ("b", 5.0, 6.0, 1.0)]
    assert kt._span(overlapping, 2) is None  # call 2 began before call 1 ended: not separate calls
    assert kt._span([], 1) is None


def test_kernel_table_counts_every_call():
    a = torch.randn(32, 32)
    table = kt.kernel_table(lambda: torch.relu(a @ a), calls=3)
    names = {r["kernel"]: r["count"] for r in table.rows}
    assert names["aten::mm"] == 1 and names["aten::relu"] == 1  # per call, not over the three
    assert table.launches == sum(r["count"] for r in table.rows)
    assert table.span_us is not None and table.span_us >= 0.99 * table.kernel_us > 0


def test_profile_case_falls_back_to_the_eager_table_when_the_replay_shows_too_few():
    s = dataclasses.replace(pg.SMOKE, calls=2)
    a = torch.randn(16, 16)

    def body():
        return torch.tanh(torch.relu(a @ a) * a + a).sum()

    def sparse():  # what a replay looks like where CUPTI saw one kernel of the graph
        return a + a

    seen = pg.profile_case(s, "seen", body, body, body)
    assert seen["profiled"] == "replay" and seen["graph"]["launches"] == seen["eager"]["launches"]
    missed = pg.profile_case(s, "missed", sparse, sparse, body)
    assert missed["profiled"].startswith("eager body (the replay showed 1 of")
    assert missed["replay_device_ms"] > 0
    eager_only = pg.profile_case(s, "cpu", body, None, body)
    assert eager_only["graph"] is None and eager_only["profiled"] == "eager body (nothing captured)"
