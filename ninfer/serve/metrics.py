"""GET /metrics in the Prometheus text format (0.0.4), names in vLLM's style under the `ninfer:` prefix.

Request figures are counted at the Gateway from the events the Engine publishes: a choice is waiting from submit
until its GenerationStart (admission) and running until its result, so queue depth and active lanes need no look
into the Engine's internals. The context cache's figures are the Engine's `cache_report()`: the ResourceManager's
counters and the Program's occupancy per tier, published by the worker after every adopted transition.
"""

from __future__ import annotations

import bisect
import threading
import time
from typing import Any, Sequence

from ninfer.contracts import GenerationResult

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: Sequence[float]):
        self.name, self.help, self.buckets = name, help_text, tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum, self.count = 0.0, 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        running = 0
        for bound, n in zip(self.buckets, self.counts):
            running += n
            lines.append(f'{self.name}_bucket{{le="{bound}"}} {running}')
        lines.append(f'{self.name}_bucket{{le="+Inf"}} {self.count}')
        lines += [f"{self.name}_sum {self.sum}", f"{self.name}_count {self.count}"]
        return lines


class RequestTimer:
    """Timing of one request's choices: first token per choice, then TPOT and end-to-end at finish."""

    def __init__(self, metrics: "Metrics"):
        self.metrics, self.start = metrics, time.monotonic()
        self.first: dict[int, float] = {}

    def tokens(self, index: int, count: int) -> None:
        if count and index not in self.first:
            self.first[index] = now = time.monotonic()
            self.metrics.ttft.observe(now - self.start)

    def finish(self, results: Sequence[GenerationResult]) -> None:
        end = time.monotonic()
        with self.metrics.lock:
            self.metrics.e2e.observe(end - self.start)
            for i, r in enumerate(results):
                n = r.usage.completion_tokens
                if n > 1 and i in self.first:
                    self.metrics.tpot.observe((end - self.first[i]) / (n - 1))
                self.metrics.prompt_tokens += r.usage.prompt_tokens
                self.metrics.generation_tokens += n
                self.metrics.cache_hit_tokens += r.usage.cached_prompt_tokens
                self.metrics.count_speculation(r.usage)
                self.metrics.finished[r.finish_reason.value] = self.metrics.finished.get(r.finish_reason.value, 0) + 1


class Metrics:
    def __init__(self, model_name: str):
        self.model = model_name
        self.lock = threading.Lock()
        self.ttft = Histogram("ninfer:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.tpot = Histogram("ninfer:time_per_output_token_seconds", "Time per output token after the first.",
                              TPOT_BUCKETS)
        self.e2e = Histogram("ninfer:e2e_request_latency_seconds", "End-to-end request latency.", E2E_BUCKETS)
        self.acceptance = Histogram("ninfer:spec_decode_acceptance_length", "Tokens a speculative round emitted "
                                    "per row (accepted drafts + 1).", tuple(range(1, 17)))
        self.draft_tokens = self.accepted_draft_tokens = 0
        self.waiting = self.running = 0
        self.prompt_tokens = self.generation_tokens = self.cache_hit_tokens = self.scored_tokens = 0
        self.finished: dict[str, int] = {}
        self.rejected: dict[str, int] = {}

    def timer(self) -> RequestTimer:
        return RequestTimer(self)

    def move(self, waiting: int = 0, running: int = 0) -> None:
        with self.lock:
            self.waiting += waiting
            self.running += running

    def count_finished(self, reason: str) -> None:
        with self.lock:
            self.finished[reason] = self.finished.get(reason, 0) + 1

    def count_speculation(self, usage: Any) -> None:
        """A finished choice's drafts, accepted drafts and rounds by length (the caller holds the lock)."""
        self.draft_tokens += usage.draft_tokens
        self.accepted_draft_tokens += usage.accepted_draft_tokens
        for i, rounds in enumerate(usage.acceptance_lengths):
            for _ in range(rounds):
                self.acceptance.observe(i + 1)

    def reject(self, code: str) -> None:
        with self.lock:
            self.rejected[code] = self.rejected.get(code, 0) + 1

    def render(self, outstanding: int, available: bool, cache: Any = None) -> str:
        """`cache`: the Engine's CacheReport (None for the scoring purpose, which has no cache)."""
        with self.lock:
            gauges = [("num_requests_waiting", "Choices submitted and not yet admitted.", self.waiting),
                      ("num_requests_running", "Choices holding an active lane.", self.running),
                      ("engine_outstanding", "Engine outstanding capacity in use.", outstanding),
                      ("engine_available", "1 while the Engine serves requests.", int(available))]
            counters = [("prompt_tokens_total", "Prompt tokens of finished choices.", self.prompt_tokens),
                        ("generation_tokens_total", "Generated tokens.", self.generation_tokens),
                        ("prefix_cache_hit_tokens_total", "Prompt tokens reused from the prefix cache.",
                         self.cache_hit_tokens),
                        ("scored_tokens_total", "Tokens scored by the CausalScoring purpose.", self.scored_tokens),
                        ("spec_decode_num_draft_tokens_total", "Draft tokens a speculative backend proposed.",
                         self.draft_tokens),
                        ("spec_decode_num_accepted_tokens_total", "Draft tokens verification accepted.",
                         self.accepted_draft_tokens)]
            lines: list[str] = []
            for name, text, value in gauges:
                lines += [f"# HELP ninfer:{name} {text}", f"# TYPE ninfer:{name} gauge", f"ninfer:{name} {value}"]
            for name, text, value in counters:
                lines += [f"# HELP ninfer:{name} {text}", f"# TYPE ninfer:{name} counter", f"ninfer:{name} {value}"]
            lines += self._labelled("request_finished_total", "Finished choices by finish reason.", "reason",
                                    self.finished)
            lines += self._labelled("request_rejected_total", "Refused requests by code.", "code", self.rejected)
            for h in (self.ttft, self.tpot, self.e2e, self.acceptance):
                lines += h.render()
        if cache is not None:
            lines += cache_lines(cache)
        return "\n".join(lines) + "\n"

    @staticmethod
    def _labelled(name: str, text: str, label: str, values: dict[str, int]) -> list[str]:
        lines = [f"# HELP ninfer:{name} {text}", f"# TYPE ninfer:{name} counter"]
        return lines + [f'ninfer:{name}{{{label}="{k}"}} {v}' for k, v in sorted(values.items())]


CACHE_COUNTERS = (("lookups", "Admissions that looked up the prefix cache."),
                  ("hits", "Admissions that resumed from a checkpoint."),
                  ("hit_tokens", "Prompt tokens resumed from a checkpoint instead of prefilled."),
                  ("captures", "Checkpoints published from prompt frontiers."),
                  ("retained", "Checkpoints published from the end of a finished output."),
                  ("demotions", "Checkpoints (GDN state and KV pages) moved from the device to a host replica."),
                  ("promotions", "Host replicas brought back to the device."),
                  ("host_resumes", "Requests resumed from a host replica (copied in; the replica stays)."),
                  ("deletions", "Checkpoints deleted to make room or past the cap."))


def cache_lines(cache: Any) -> list[str]:
    """The context cache: the ResourceManager's counters, misses by cause, checkpoints and bytes per tier."""
    stats, usage = cache.stats, cache.usage
    lines: list[str] = []
    for field, text in CACHE_COUNTERS:
        name = f"ninfer:prefix_cache_{field}_total"
        lines += [f"# HELP {name} {text}", f"# TYPE {name} counter", f"{name} {getattr(stats, field)}"]
    lines += Metrics._labelled("prefix_cache_misses_total", "Admissions that reused no prompt token, by cause.",
                               "cause", stats.misses)
    tiers = {"device": (usage.checkpoints - usage.host_checkpoints, usage.checkpoint_device_bytes),
             "host": (usage.host_checkpoints, usage.checkpoint_host_bytes)}
    for name, text, i in (("prefix_cache_checkpoints", "Inactive checkpoints by the tier of their state.", 0),
                          ("prefix_cache_bytes", "Bytes held by inactive checkpoints, per tier.", 1)):
        lines += [f"# HELP ninfer:{name} {text}", f"# TYPE ninfer:{name} gauge"]
        lines += [f'ninfer:{name}{{tier="{t}"}} {v[i]}' for t, v in tiers.items()]
    return lines
