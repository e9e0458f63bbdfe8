"""Device idle time between decode steps through the Engine (issue 14's host/GPU overlap target: <= 30 us).

`StepGaps(program)` wraps the decode graph runner's `run_lists` (every plain decode step, launched ahead or not,
replays through it) with two CUDA events on the current stream: one recorded after the sampler's input copies
were queued and before the graph's own input copy and replay, one after the graph. The gap from one step's end
event to the next step's start event is the time the device spent outside the decode graphs: the previous step's
draws going to the host, the next step's input copies (a few us), and whatever the host was late by. When the
host is late the start event runs as soon as it is queued, so the gap is the lateness; when the step was already
queued behind the previous graph (async scheduling, a step chained behind the one the host is reading) it is the
copies alone. Without CUDA the same wrapper records
host timestamps (the smoke run), which measures the host's time between launches instead.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch


class StepGaps:
    def __init__(self, program: Any):
        self.runner = program.runner
        self.cuda = program.device.type == "cuda" and torch.cuda.is_available()
        self.marks: list[tuple[Any, Any]] = []  # (start, end) per step: CUDA events, or host seconds
        self.recording = False
        run_lists = self.runner.run_lists

        def timed(columns, variant=None, tokens=None):
            if not self.recording:
                return run_lists(columns, variant, tokens)
            start = self._mark()
            out = run_lists(columns, variant, tokens)
            self.marks.append((start, self._mark()))
            return out

        self.runner.run_lists = timed

    def _mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self) -> None:
        self.marks, self.recording = [], True

    def stop(self) -> dict:
        """Gaps between consecutive steps of the recorded stretch: median, p90, max and mean, in microseconds.
        A stretch where the batch changed (a request ended or joined) counts its gaps too: they are real idle."""
        self.recording = False
        if self.cuda:
            torch.cuda.synchronize()
            gaps = [end.elapsed_time(nxt) * 1e3 for (_, end), (nxt, _) in zip(self.marks, self.marks[1:])]
        else:
            gaps = [(nxt - end) * 1e6 for (_, end), (nxt, _) in zip(self.marks, self.marks[1:])]
        if not gaps:
            raise RuntimeError("fewer than two decode steps were recorded")
        gaps = [max(0.0, g) for g in gaps]
        ordered = sorted(gaps)
        return {"steps": len(self.marks), "gap_us_median": statistics.median(gaps),
                "gap_us_p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], "gap_us_max": ordered[-1],
                "gap_us_mean": statistics.fmean(gaps), "device_events": self.cuda}
