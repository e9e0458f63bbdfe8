"""Engine configuration, resolved once at start and never written afterwards."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineConfig:
    max_concurrency: int = 4  # active lanes, 1..8, fixed at start
    queue_bound: int = 64  # waiting requests beyond the lanes before submit says "overloaded"
    # prompt tokens per prefill unit (one lane's chunk per worker boundary); None: sized from the Program's
    # measured PrefillCosts so decoding rows keep their inter-token time within prefill_itl_ratio plain steps
    # (engine/chunking.py; 512 without measured costs)
    prefill_chunk: int | None = None
    prefill_itl_ratio: float = 2.5
    concurrent_prefill: bool = False  # admit while another request is still in staged prefill
    # A staged prefill's chunk rides on the decode round (one model pass reading every weight once for both) when
    # the Program runs it so (`ProgramLimits.mixed_steps`); False, or a Program without: the two alternate
    mixed_prefill: bool = True
    prefix_caching: bool = True
    queue_timeout: float | None = None  # default seconds a request may wait before admission
    max_cached_checkpoints: int | None = None  # inactive checkpoints kept at most (None: only pressure evicts)
    # Share of the Program's KV pages inactive checkpoints may hold; past it the lowest-valued are deleted
    # (1.0: only admissions displace them).
    cache_device_share: float = 1.0
    # Launch the next plain decode round before the host settles this one (docs/engine.md "Async scheduling"),
    # when the Program supports it (`launch_ahead`)
    async_scheduling: bool = False
    check_invariants: bool = False  # run every check_invariants() after each boundary (tests, debugging)

    def __post_init__(self) -> None:
        if not 1 <= self.max_concurrency <= 8:
            raise ValueError(f"max_concurrency must be in 1..8, got {self.max_concurrency}")
        if self.queue_bound < 0:
            raise ValueError(f"queue_bound must be >= 0, got {self.queue_bound}")
        if self.prefill_chunk is not None and self.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1 (or None: from the Program's costs), got "
                             f"{self.prefill_chunk}")
        if not self.prefill_itl_ratio > 1.0:
            raise ValueError(f"prefill_itl_ratio must be > 1 (a decode step plus a chunk), got "
                             f"{self.prefill_itl_ratio}")
        if self.max_cached_checkpoints is not None and self.max_cached_checkpoints < 0:
            raise ValueError(f"max_cached_checkpoints must be >= 0, got {self.max_cached_checkpoints}")
        if not 0.0 < self.cache_device_share <= 1.0:
            raise ValueError(f"cache_device_share must be in (0, 1], got {self.cache_device_share}")
        if self.queue_timeout is not None and self.queue_timeout <= 0:
            raise ValueError(f"queue_timeout must be positive, got {self.queue_timeout}")

    @property
    def max_outstanding(self) -> int:
        return self.max_concurrency + self.queue_bound
