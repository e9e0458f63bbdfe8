"""Counters of the context cache, kept by the ResourceManager and read by the Gateway's /metrics.

Only the Engine worker writes them; every field is an int or a dict whose keys are fixed at construction, so a
reader on another thread sees each number whole.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ninfer.contracts import ResourceUsage


class Miss(enum.Enum):
    """Why an admitted request reused no prompt token."""

    DISABLED = "disabled"  # prefix caching is off
    COLD = "cold"  # no checkpoint ever held a prefix of this prompt
    EVICTED = "evicted"  # a checkpoint that held a prefix was deleted before this request came


@dataclass
class CacheStats:
    lookups: int = 0  # materializations adopted
    hits: int = 0  # of them, resumed from a checkpoint
    hit_tokens: int = 0  # prompt tokens resumed instead of prefilled
    misses: dict[str, int] = field(default_factory=lambda: {m.value: 0 for m in Miss})
    captures: int = 0  # checkpoints published from prompt frontiers
    retained: int = 0  # checkpoints published from a finished output
    demotions: int = 0  # device checkpoint (state and KV pages) moved to a host replica
    promotions: int = 0  # host replica brought back to the device (a slot and its KV pages)
    host_resumes: int = 0  # hits resumed from a host replica (copied into the sequence, the replica stays)
    deletions: int = 0  # checkpoints released

    def miss(self, cause: Miss) -> None:
        self.misses[cause.value] += 1

    def lookup(self, reused: int, cause: Miss) -> None:
        """One adopted materialization: a hit of `reused` prompt tokens, or (none reused) a miss for `cause`."""
        self.lookups += 1
        if reused:
            self.hits += 1
            self.hit_tokens += reused
        else:
            self.miss(cause)


@dataclass(frozen=True)
class CacheReport:
    """What /metrics shows of the cache: the ResourceManager's counters and the Program's occupancy."""

    stats: CacheStats
    usage: ResourceUsage
