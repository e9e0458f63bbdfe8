"""Where a prefill's time goes, and what a long prefill does to decoding rows (issue 14), for bench_engine.py.

`PhaseTimer(program)` is an opt-in hook: `install()` wraps the fast Program's phases on the instance (nothing is
wrapped, so nothing is paid, until then; `uninstall()` puts the originals back). Each wrapped call is bracketed by
a device synchronization and host timer (so the device work it queued is charged to it, not to whatever waits
next) and by two CUDA events (the device time of what it queued). The phases: the resource transitions
(`plan`, `start`, `advance`: a resume's restore copies run in `advance`), the Program's `prefill` (of which the
executor's model call and the first-token draw), `commit`, and the store's copies (`copy_slot`, `copy_page`,
`store_slot`, `store_pages`, `write_row`), which nest inside the transitions and the prefill. The
synchronizations cost a few tens of us per phase, so the timed round is separate from the untimed TTFT.

`itl_report(...)` turns the token times of decoding rows around one long prefill into the ITL verdict.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

# (name, the attribute path on the program)
PHASES = (("plan", ""), ("start", ""), ("advance", ""), ("prefill", ""), ("model prefill", "executor"),
          ("first draw", "executor"), ("commit", ""), ("copy_slot", "store"), ("copy_page", "store"),
          ("store_slot", "store"), ("store_pages", "store"), ("write_row", "store"))
_METHOD = {"model prefill": "prefill", "first draw": "draw_first"}


class PhaseTimer:
    def __init__(self, program: Any):
        self.program = program
        self.cuda = program.device.type == "cuda" and torch.cuda.is_available()
        self.calls: dict[str, list[tuple[float, Any, Any]]] = {}  # name -> (host s, start event, end event)
        self._saved: list[tuple[Any, str, Any]] = []

    def install(self) -> "PhaseTimer":
        for name, where in PHASES:
            obj = getattr(self.program, where) if where else self.program
            method = _METHOD.get(name, name)
            self._saved.append((obj, method, obj.__dict__.get(method)))
            setattr(obj, method, self._timed(name, getattr(obj, method)))
        return self

    def uninstall(self) -> None:
        for obj, method, original in reversed(self._saved):
            if original is None:
                delattr(obj, method)
            else:
                setattr(obj, method, original)
        self._saved.clear()

    def _timed(self, name: str, fn):
        def timed(*args, **kwargs):
            if self.cuda:
                torch.cuda.synchronize()
                ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                ev[0].record()
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            if self.cuda:
                ev[1].record()
                torch.cuda.synchronize()
            self.calls.setdefault(name, []).append((time.perf_counter() - t, *(ev if self.cuda else (None, None))))
            return out
        return timed

    def report(self) -> dict[str, dict[str, float]]:
        """name -> calls, host ms and (on CUDA) device ms, summed over the calls."""
        out = {}
        for name, calls in self.calls.items():
            row = {"calls": len(calls), "host_ms": sum(c[0] for c in calls) * 1e3}
            if self.cuda:
                row["device_ms"] = sum(a.elapsed_time(b) for _, a, b in calls)
            out[name] = row
        return out


def itl_report(decoders: list[list[float]], submitted: float, first_token: float, prompt: int, alone_tok_s: float,
               ratio: float) -> dict:
    """The gaps between consecutive tokens of every decoding row: before the long prompt was submitted (the plain
    step, median) and while it prefilled (median, p99, max: with B rows each boundary makes B gaps), the ITL verdict
    against `ratio` plain steps, and the prompt's own prefill throughput (its TTFT less the decode rounds run
    meanwhile) against one-piece prefill alone."""
    plain = [b - a for ts in decoders for a, b in zip(ts, ts[1:]) if b <= submitted and a >= max(t[0] for t in decoders)]
    during = [b - a for ts in decoders for a, b in zip(ts, ts[1:]) if a >= submitted and b <= first_token]
    if not plain or not during:
        raise RuntimeError("no plain or no concurrent decode gaps: raise itl_tokens")
    step = statistics.median(plain)
    p99 = sorted(during)[min(len(during) - 1, int(0.99 * len(during)))]
    rounds = len(during) / len(decoders)
    prefill_s = max(first_token - submitted - rounds * step, 1e-9)
    tok_s = prompt / prefill_s
    return {"plain_step_ms": step * 1e3, "p99_ms": p99 * 1e3, "max_ms": max(during) * 1e3,
            "median_ms": statistics.median(during) * 1e3, "gaps": len(during),
            "ratio": p99 / step, "target": ratio, "itl_pass": p99 <= ratio * step, "ttft_ms": (first_token -
            submitted) * 1e3, "prefill_tok_s": tok_s, "alone_tok_s": alone_tok_s,
            "throughput_share": tok_s / alone_tok_s if alone_tok_s else None,
            "throughput_pass": bool(alone_tok_s) and tok_s >= 0.95 * alone_tok_s}
