"""The context cache's cost model: from the Program's physical facts (`CostFacts`: replica copy bandwidth and
latency, prefill throughput) it says whether a host replica is worth copying back or its tokens are cheaper to
recompute, and whether a checkpoint leaving the device is worth a host replica or should be deleted.

Pure Python over the facts the Program reported at start; the ResourceManager acts on the verdicts
(docs/context-cache.md). Prefill time grows with depth as `retention.recompute` says (linear, plus attention's
quadratic share), so a long prefix is worth more per token than a short one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ninfer.contracts import CheckpointInfo, CostFacts

from .retention import recompute


class Verdict(enum.Enum):
    PROMOTE = "promote"  # copy the host replica in (resume from it, or bring it back to the device)
    RECOMPUTE = "recompute"  # prefill its tokens again from a shallower device checkpoint (or root)
    DEMOTE = "demote"  # keep a host replica of a checkpoint leaving the device
    DELETE = "delete"  # let it go: a replica would cost more to use than recomputing it


@dataclass(frozen=True)
class CostModel:
    facts: CostFacts = CostFacts()

    def prefill_s(self, start: int, end: int) -> float:
        """Seconds to prefill positions [start, end) on top of a `start`-token prefix."""
        return (recompute(end) - recompute(start)) / self.facts.prefill_tokens_per_s

    def copy_s(self, nbytes: int) -> float:
        """Seconds to copy one replica of `nbytes` between host and device."""
        return self.facts.copy_latency_s + nbytes / self.facts.copy_bytes_per_s

    def resume(self, replica: CheckpointInfo, below: int) -> Verdict:
        """A host replica at `replica.tokens` against the device checkpoint at `below` (0: root): copy the replica
        in, or prefill the tokens between the two."""
        if self.copy_s(replica.host_bytes) < self.prefill_s(below, replica.tokens):
            return Verdict.PROMOTE
        return Verdict.RECOMPUTE

    def leave_device(self, info: CheckpointInfo) -> Verdict:
        """A device checkpoint that must give way: a replica is worth it when copying it out now and back at its
        next hit costs less than recomputing it from root."""
        if 2 * self.copy_s(info.device_bytes) < self.prefill_s(0, info.tokens):
            return Verdict.DEMOTE
        return Verdict.DELETE
