"""Engine host overhead per decode round, with a Program that does no work (not a test).

Run: python benchmarks/engine_overhead.py [--rounds 20000] (tests/benchmarks/test_engine_overhead.py runs it small)
Prints CPU microseconds (process time, robust to a busy machine) of Engine Python per decode round at B = 1, 2, 4, 8 (median of 5 repeats; the no-op
Program's own cost is included and is a few microseconds).
"""

from __future__ import annotations

import argparse
import statistics
import time

from ninfer.contracts import (BatchKind, PendingBatch, PendingRow, ProgramLimits, ResourcePlan, ResourceResult,
                              ResourceUsage, RunningTransaction, SequenceHandle, TransitionKind)
from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine
from ninfer.testing.sessions import TokenSession
from ninfer.engine.records import GenerationRequest


PROMPT_LEN = 3


class NoOpProgram:
    """Admits everything, returns token 5 for every row, keeps nothing."""

    def __init__(self, max_concurrency: int):
        self.limits = ProgramLimits(max_concurrency, 10**9, 100, ())
        self.resource_revision = 0
        self._slot = 0
        self._prefilled: set[SequenceHandle] = set()

    def plan(self, choice):
        return ResourcePlan(choice, 0, 0)

    def start(self, plan):
        return RunningTransaction(plan, 0)

    def advance(self, txn):
        kind = txn.plan.choice.kind
        handle = None
        if kind is TransitionKind.MATERIALIZE:
            self._slot += 1
            handle = SequenceHandle(self._slot, 0)
        return ResourceResult(0, kind, True, 0, handle=handle)

    def abort(self, txn):
        return ResourceResult(0, txn.plan.choice.kind, False, 0)

    def backfill_feasible(self, head, donors, borrower):
        return True

    def prompt_remaining(self, handle):
        return 0 if handle in self._prefilled else PROMPT_LEN  # each prompt is one prefill unit

    def prefill(self, handle, max_tokens, mask=None):
        self._prefilled.add(handle)
        return PendingBatch(BatchKind.PREFILL, (PendingRow(handle, (5,), 0),), 0)

    def decode(self, handles, masks=None):
        return PendingBatch(BatchKind.DECODE, tuple(PendingRow(h, (5,), 0) for h in handles), 0)

    def control(self, handle, tokens):
        return PendingBatch(BatchKind.CONTROL, (PendingRow(handle, tuple(tokens), 0),), 0)

    def commit(self, batch, decisions):
        pass

    def abort_pending(self, batch):
        pass

    def resource_usage(self):
        return ResourceUsage(0, 0, 0, 0, 0, 0, 0, 0, 0)

    def check_invariants(self):
        pass


def per_round_us(batch: int, rounds: int) -> float:
    engine = Engine(NoOpProgram(8), EngineConfig(max_concurrency=8, prefix_caching=False), threaded=False)
    prompt = tuple(range(1, PROMPT_LEN + 1))
    handles = [engine.submit(GenerationRequest(prompt, TokenSession(10**8, stop_ids=()), 10**8)) for _ in range(batch)]
    while len(engine.core.scheduler.decode_ready) < batch:
        engine.step()
        if engine.failure:
            raise RuntimeError(f"engine failed: {engine.failure}")
    # Consumers drain their events between timed stretches, as a server's streaming tasks do; letting deltas pile
    # up would time the garbage collector scanning them instead of the Engine.
    elapsed, drained = 0.0, 0
    for _ in range(rounds // 100):
        t0 = time.process_time()
        for _ in range(100):
            engine.step()
        elapsed += time.process_time() - t0
        for h in handles:
            while not h._rec.events.empty():
                h._rec.events.get_nowait()
                drained += 1
    rounds = rounds // 100 * 100
    # every round must have decoded every row (a failed Engine or a stalled one would time nothing)
    if engine.failure or drained < batch * rounds:
        raise RuntimeError(f"{drained} events for {batch} rows x {rounds} rounds; engine failure: {engine.failure}")
    for h in handles:
        h.close()
    return elapsed / rounds * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20000)
    args = ap.parse_args()
    print("B  us/round (median of 5)")
    for b in (1, 2, 4, 8):
        print(f"{b}  {statistics.median(per_round_us(b, args.rounds) for _ in range(5)):.1f}")


if __name__ == "__main__":
    main()
