"""Per-kernel device time of a repeated call, from torch.profiler (CUPTI on CUDA), for profile_fast.py and
profile_graphs.py: each kernel's time and launches per call, the sum of kernel time per call, and the call's span
on the device (its first kernel's start to its last one's end), whose excess over the sum is the idle time between
its kernels. The calls are separated by device syncs, so each call's events are its own.

A CUDA graph's replay shows the kernels inside it: CUPTI reports graph-launched kernels (and memcpy/memset nodes)
like any other, as long as the profiler starts after the capture. On a CPU (the --smoke runs) the profiler's
operators stand in for kernels, each with its self time, so nested operators count once and the same grouping and
tables run.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

NAME_CHARS = 90  # cuBLAS names run long; their tile and layout fit in this


@dataclass(frozen=True)
class KernelTable:
    rows: list[dict]  # {"kernel", "us", "count"}: per call, by time
    kernel_us: float  # sum of kernel time per call
    launches: float  # kernels (and copies) per call
    span_us: float | None  # mean per call; None where the calls' events did not split evenly
    device: bool  # CUDA kernels (False: CPU operators)

    def as_dict(self, top: int = 30) -> dict:
        gap = None if self.span_us is None else self.span_us - self.kernel_us
        return {"kernel_us": self.kernel_us, "launches": self.launches, "span_us": self.span_us,
                "idle_in_span_us": gap, "device_kernels": self.device, "top": self.rows[:top]}


def kernel_table(fn: Callable[[], object], calls: int) -> KernelTable:
    """Profile `calls` runs of `fn` (after one untimed run) on CUDA when there is a device, else on the CPU."""
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    fn()
    sync()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
            sync()
    events = _events(prof, cuda)
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, _, _, us in events:
        t = totals[name[:NAME_CHARS]]
        t[0] += us
        t[1] += 1
    rows = sorted(({"kernel": k, "us": v[0] / calls, "count": v[1] / calls} for k, v in totals.items()),
                  key=lambda r: -r["us"])
    return KernelTable(rows, sum(r["us"] for r in rows), len(events) / calls, _span(events, calls), cuda)


def _events(prof, cuda: bool) -> list[tuple[str, float, float, float]]:
    """(name, start us, end us, time us) of every kernel (CUDA) or operator (CPU: its self time), by start."""
    out = []
    for ev in prof.events():
        if cuda and ev.device_type == DeviceType.CUDA:
            out.append((ev.name, ev.time_range.start, ev.time_range.end, ev.time_range.elapsed_us()))
        elif not cuda and ev.device_type == DeviceType.CPU and not ev.is_async:
            out.append((ev.name, ev.time_range.start, ev.time_range.end, ev.self_cpu_time_total))
    return sorted(out, key=lambda e: e[1])


def _span(events: list[tuple[str, float, float, float]], calls: int) -> float | None:
    """Mean over the calls (as the kernel sums are) of first start to last end. Every call launches the same
    kernels, so call i is the i-th run of len / calls events; a count that does not divide, or calls that overlap,
    give None."""
    if not events or len(events) % calls:
        return None
    n = len(events) // calls
    chunks = [events[i * n:(i + 1) * n] for i in range(calls)]
    bounds = [(c[0][1], max(e[2] for e in c)) for c in chunks]
    if any(end > nxt for (_, end), (nxt, _) in zip(bounds, bounds[1:])):
        return None
    return sum(end - start for start, end in bounds) / calls
