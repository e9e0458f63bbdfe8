"""The GPU benchmarks' driver of an unthreaded Engine: submit requests, step the Engine and poll every live
request's events after each worker boundary (`Tracker`: each token and each OutputDelta with the time it was
seen), and the steady decode interval read from those times. bench_engine.py and bench_spec.py drive through it.
"""

from __future__ import annotations

import statistics
import time

from ninfer.contracts import GenerationResult, GenerationStart, OutputDelta
from ninfer.engine.engine import Engine
from ninfer.engine.records import GenerationRequest
from ninfer.testing.sessions import TokenSession


class Tracker:
    """One request's events with the time each was seen: after each worker boundary the driver polls every live
    handle without blocking."""

    def __init__(self, handle, submitted: float):
        self.handle, self.submitted = handle, submitted
        self.token_times: list[float] = []  # one entry per committed token
        self.deltas: list[tuple[float, int]] = []  # (time seen, tokens) of every OutputDelta
        self.tokens: list[int] = []
        self.reused = 0
        self.result: GenerationResult | None = None

    def poll(self, now: float) -> None:
        try:
            for ev in self.handle.events(timeout=0):
                if isinstance(ev, GenerationStart):
                    self.reused = ev.reused_prefix_tokens
                elif isinstance(ev, OutputDelta):
                    self.token_times.extend([now] * len(ev.token_ids))
                    self.deltas.append((now, len(ev.token_ids)))
                    self.tokens.extend(ev.token_ids)
                elif isinstance(ev, GenerationResult):
                    self.result = ev
        except TimeoutError:
            pass  # no event ready now: the next poll looks again

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.submitted


def submit(engine: Engine, prompt: list[int], max_tokens: int, sampling=None) -> Tracker:
    """sampling: a `SamplingParams` (None: greedy)."""
    # stop_ids=() : random weights would otherwise stop at an early eos and shorten the timed stretch
    session = TokenSession(max_tokens, stop_ids=())
    t = time.perf_counter()
    return Tracker(engine.submit(GenerationRequest(tuple(prompt), session, max_tokens, sampling=sampling, seed=0)),
                   t)


def drive(engine: Engine, trackers: list[Tracker], on_step=None) -> None:
    live = list(trackers)
    while live:
        engine.step()
        if engine.failure:
            raise RuntimeError(f"engine failed: {engine.failure}")
        now = time.perf_counter()
        for t in live:
            t.poll(now)
        if on_step is not None:
            on_step()
        live = [t for t in live if t.result is None]
    for t in trackers:
        if t.result.error is not None:
            raise RuntimeError(f"request failed: {t.result.error}")


def steady_step_ms(trackers: list[Tracker]) -> tuple[float, int]:
    """Median interval between consecutive tokens of each request inside the window where all of them decode:
    from the last first token to the first last token. Returns (ms, intervals used)."""
    start = max(t.token_times[0] for t in trackers)
    end = min(t.token_times[-1] for t in trackers)
    gaps = [b - a for t in trackers for a, b in zip(t.token_times, t.token_times[1:]) if a >= start and b <= end]
    if not gaps:
        raise RuntimeError("no interval where every request decoded: raise decode_tokens")
    return statistics.median(gaps) * 1e3, len(gaps)
