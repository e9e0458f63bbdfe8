"""Which host replica comes back to the device: the placement verdicts of the context cache.

A replica that earned a hit (a request resumed from it on the host) queues for promotion, oldest first; it is
brought back when the cost model says copying it in beats recomputing it, and leaves the queue once it is back on
the device, deleted, or judged not worth the copy. After a promotion did not fit (no free slot or pages) the
replica keeps serving hits from the host and none is tried again before the Program's resource revision moves.
"""

from __future__ import annotations

from ninfer.contracts import CheckpointId, ResourceChoice, TransitionKind

from .cost_model import CostModel, Verdict


class Placement:
    def __init__(self, costs: CostModel):
        self.costs = costs
        self.queue: list[CheckpointId] = []  # host-resident checkpoints that earned a hit
        self.deferred_at: int | None = None  # the Program revision at which the last promotion did not fit

    def earned(self, cid: CheckpointId) -> None:
        """A request resumed from this host replica."""
        if cid not in self.queue:
            self.queue.append(cid)

    def placed(self, cid: CheckpointId) -> None:
        """The Program brought it back to the device."""
        self.queue = [c for c in self.queue if c != cid]

    def choice(self, revision: int, catalog: dict) -> ResourceChoice | None:
        """The PLACE transition of the first queued replica still worth it, or None."""
        if revision == self.deferred_at:
            return None
        while self.queue:
            cid = self.queue[0]
            entry = catalog.get(cid)
            if entry is not None and not entry.info.on_device and entry.pins == 0 and \
                    self.costs.resume(entry.info, 0) is Verdict.PROMOTE:
                return ResourceChoice(TransitionKind.PLACE, source=cid)
            self.queue.pop(0)
        return None

    def defer(self, revision: int) -> None:
        """The promotion did not fit: retried once the Program's resources change."""
        self.deferred_at = revision

    def clear(self) -> None:
        self.queue.clear()
