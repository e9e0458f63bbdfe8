"""The fast MTP round's graphs timed on their own: per B, one verify pass (backup copies, target pass, MTP advance;
`ninfer/fast/verify_graphs.py`) replayed from its captured graph against the same body run eagerly, the B = 1 replay
graph (a cut block's replay) likewise, and the draft's graphs (`ninfer/fast/draft_graphs.py`: start and k chained
steps with their draws, greedy and sort variants), at a context of `context` positions on the plan's dummy slot and
row (no live state is touched). What the Engine-level phases (`bench_spec.Phases`) cannot separate: the graphs'
device time from the host work around them.
"""

from __future__ import annotations

import statistics
import time

import torch

from ninfer.fast.sampling.rows import GREEDY, SORT


def _median_ms(call, device: str, reps: int) -> float:
    """Median wall ms of `call`, each bracketed by device syncs (CUDA events would hide nothing here: the
    eager body's host launches are part of what it costs)."""
    for _ in range(3):
        call()
    times = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        call()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def round_graph_times(program, batches, context: int, device: str, reps: int = 20) -> list[dict]:
    """One row per B and pass (verify, draft; and one replay): graph ms (None where nothing was captured: CPU) and
    eager ms of the same bodies."""
    verifier = getattr(program.executor, "verifier", None)
    if verifier is None:
        return []
    plan, rows = program.model.plan, []
    start = min(context, plan.max_context - verifier.width)
    cases = [(B, True) for B in batches if B <= verifier.max_batch] + [(1, False)]
    for B, backup in cases:
        verifier.inputs.fill_dummy(B, plan.dummy_slot, plan.dummy_row, start)
        graph = verifier.graphs.get((B, backup))
        row = {"B": B, "k": verifier.width - 1, "pass": "verify" if backup else "replay", "context": start,
               "graph_ms": None if graph is None else _median_ms(graph.replay, device, reps),
               "eager_ms": _median_ms(lambda: verifier.body(B, backup), device, reps)}
        rows.append(row)
    return rows + _draft_times(program, [B for B, backup in cases if backup], start, device, reps)


def _draft_times(program, batches, context: int, device: str, reps: int) -> list[dict]:
    """Per B and draw variant (greedy; sort: sampled rows with top-k/top-p): the start graph and k step graphs in a
    row, each step with its draw, against the same bodies eagerly."""
    drafter, k, plan = program.executor.drafter, program.executor.spec.k, program.model.plan
    rows = []
    for B in batches:
        for variant in (GREEDY, SORT):
            drafter.fill([plan.dummy_slot] * B, [plan.dummy_row] * B, [context] * B, [0] * B, [0] * B, [k] * B)
            drafter.draws.fill_dummy(B, variant, drafter.spec.tables.dummy_row)
            keys = [("start", B, None)] + [("step", B, variant)] * k

            def replay():
                for key in keys:
                    drafter.graphs[key].replay()

            def eager():
                drafter.start(B)
                for _ in range(k):
                    drafter.step(B, variant)
            captured = all(key in drafter.graphs for key in keys)
            rows.append({"B": B, "k": k, "pass": f"draft ({variant})", "context": context,
                         "graph_ms": _median_ms(replay, device, reps) if captured else None,
                         "eager_ms": _median_ms(eager, device, reps)})
    return rows


def print_round_graphs(name: str, rows: list[dict]) -> None:
    for r in rows:
        graph = "not captured" if r["graph_ms"] is None else f"{r['graph_ms']:.2f} ms"
        print(f"  {name} {r['pass']} graph B={r['B']} k={r['k']} ctx {r['context']}: graph {graph}, same body eager "
              f"{r['eager_ms']:.2f} ms")
