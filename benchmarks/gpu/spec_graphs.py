"""The fast speculative round's graphs timed on their own: per B, one verify pass (backup copies, target pass, MTP
advance or DFlash context extension; `ninfer/fast/verify_graphs.py`) replayed from its captured graph against the
same body run eagerly, the B = 1 replay graph (the pass without backups: DFlash's replay of a cut block and forced
tokens; an MTP cut block replays nothing, its state comes from the verify pass's step slots) likewise, and the
draft's graphs: the MTP head's (`ninfer/fast/draft_graphs.py`: start and k chained steps with their draws, greedy
and sort variants) at a context of `context` positions on the plan's dummy slot and row, or the DFlash / DFlash2
drafter's (`ninfer/fast/dflash_graphs.py`: the block pass and its draws, each variant in the form a round without
penalties takes) on the rows' scratch pages at position 0 (no live state is touched). What the Engine-level phases (`spec_forcing.Phases`) cannot separate: the graphs'
device time from the host work around them.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from ninfer.fast.sampling.rows import GREEDY, SORT
from ninfer.fast.sampling.draw_variants import LEAN, base_variant


def median_ms(call, device: str, reps: int) -> float:
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


@dataclass(frozen=True)
class GraphCase:
    """One pass of the round at B rows: `prepare` fills its inputs on the dummy slot and row, `replay` replays its
    captured graphs (None: nothing captured, the CPU) and `eager` launches the same body; both may run again and
    again after one `prepare`. profile_graphs.py profiles these cases' kernels."""

    B: int
    name: str  # "verify", "replay" (B = 1 without backups), "draft (greedy)", "draft (sort)"
    k: int
    context: int
    prepare: Callable[[], None]
    replay: Callable[[], None] | None
    eager: Callable[[], None]


def round_cases(program, batches, context: int) -> list[GraphCase]:
    """Per B (those the verifier serves) the verify pass, then the B = 1 replay, then per B the draft's greedy, lean
    greedy and sort variants (the MTP head's or the DFlash drafter's); none without the round's graphs (a Program
    without a backend, or the reference one)."""
    verifier = getattr(program.executor, "verifier", None)
    if verifier is None:
        return []
    plan, k = program.model.plan, verifier.width - 1
    start = min(context, plan.max_context - verifier.width)
    cases = []
    for B, backup in [(B, True) for B in batches if B <= verifier.max_batch] + [(1, False)]:
        graph = verifier.graphs.get((B, verifier.width, backup, False))  # (B, width, backup, masked)
        cases.append(GraphCase(B, "verify" if backup else "replay", k, start,
                               lambda B=B: verifier.inputs[verifier.width].fill_dummy(B, plan.dummy_slot,
                                                                                      plan.dummy_row, start),
                               None if graph is None else graph.replay,
                               lambda B=B, backup=backup: verifier.body(B, backup)))
    served = [c.B for c in cases if c.name == "verify"]
    variants = (GREEDY, GREEDY + LEAN, SORT)
    if program.executor.drafter is not None:
        return cases + [_draft_case(program, B, variant, start) for B in served for variant in variants]
    if getattr(program.executor, "dflash", None) is not None:
        return cases + [_dflash_draft_case(program, B, variant) for B in served for variant in variants]
    return cases


def _draft_case(program, B: int, variant: str, context: int) -> GraphCase:
    """The start graph and k step graphs in a row, each step with its draw (greedy; its lean form, without steps
    1-4; sort: sampled rows with top-k / top-p), against the same bodies eagerly."""
    drafter, k, plan = program.executor.drafter, program.executor.spec.k, program.model.plan
    keys = [("start", B, None)] + [("step", B, variant)] * k

    def prepare():
        drafter.fill([plan.dummy_slot] * B, [plan.dummy_row] * B, [context] * B, [0] * B, [0] * B, [k] * B)
        drafter.draws.fill_dummy(B, base_variant(variant), drafter.spec.tables.dummy_row)

    def replay():
        for key in keys:
            drafter.graphs[key].replay()

    def eager():
        drafter.start(B)
        for _ in range(k):
            drafter.step(B, variant)
    captured = all(key in drafter.graphs for key in keys)
    return GraphCase(B, f"draft ({variant})", k, context, prepare, replay if captured else None, eager)


def _dflash_draft_case(program, B: int, variant: str) -> GraphCase:
    """The DFlash / DFlash2 draft graph of B rows (block pass and draws) in the form a round without penalties takes
    (`DFlashDraftGraphs.draft`: DFlash's lean variants draw all slots in one pass), against its body eagerly."""
    graphs, k = program.executor.dflash.graphs, program.executor.spec.k
    one_pass = True in graphs.block_draws(variant)

    def prepare():
        graphs.fill_dummy(B)
        graphs.draws.fill_dummy(B, base_variant(variant), graphs.spec.tables.dummy_row)
    graph = graphs.graphs.get((B, variant, one_pass))
    return GraphCase(B, f"draft ({variant})", k, 0, prepare, None if graph is None else graph.replay,
                     lambda: graphs.body(B, variant, one_pass))


def round_graph_times(program, batches, context: int, device: str, reps: int = 20) -> list[dict]:
    """One row per B and pass (verify, draft; and one replay): graph ms (None where nothing was captured: CPU) and
    eager ms of the same bodies."""
    rows = []
    for case in round_cases(program, batches, context):
        case.prepare()
        rows.append({"B": case.B, "k": case.k, "pass": case.name, "context": case.context,
                     "graph_ms": None if case.replay is None else median_ms(case.replay, device, reps),
                     "eager_ms": median_ms(case.eager, device, reps)})
    return rows


def print_round_graphs(name: str, rows: list[dict]) -> None:
    for r in rows:
        graph = "not captured" if r["graph_ms"] is None else f"{r['graph_ms']:.2f} ms"
        print(f"  {name} {r['pass']} graph B={r['B']} k={r['k']} ctx {r['context']}: graph {graph}, same body eager "
              f"{r['eager_ms']:.2f} ms")
