"""Resource transactions: logical choice -> sealed ResourcePlan -> RunningTransaction -> complete ResourceResult.

The ResourceManager makes the logical choice; the Program seals an opaque plan bound to its current
resource_revision, runs the one physical transition, and returns a result complete enough (also on abort) for the
ResourceManager to update its logical catalog without mirroring any physical byte count.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from .batch import SequenceHandle


class TransitionKind(enum.Enum):
    MATERIALIZE = "materialize"  # a waiting request becomes an active sequence, from root or a checkpoint
    CAPTURE = "capture"  # an active sequence's frontier is copied into a checkpoint
    RETAIN = "retain"  # a terminal sequence publishes one complete checkpoint and releases the rest
    RELEASE = "release"  # a terminal sequence releases everything
    PLACE = "place"  # an inactive checkpoint replica moves between tiers
    DELETE = "delete"  # inactive checkpoints are released


@dataclass(frozen=True)
class CheckpointId:
    value: int


@dataclass(frozen=True)
class CheckpointInfo:
    """What the Program reports of a published checkpoint: immutable, complete at `tokens`."""

    id: CheckpointId
    tokens: int  # frontier: the checkpoint continues after this many tokens
    digest: str  # content identity of tokens[0:frontier]
    device_bytes: int
    host_bytes: int

    @property
    def on_device(self) -> bool:
        """Resumable without a host-to-device copy of its state."""
        return self.host_bytes == 0


@dataclass(frozen=True)
class ResourceChoice:
    """The ResourceManager's logical choice, handed to the Program for feasibility and sealing."""

    kind: TransitionKind
    request_id: int | None = None
    handle: SequenceHandle | None = None
    prompt: tuple[int, ...] = ()
    max_new_tokens: int = 0
    source: CheckpointId | None = None  # materialize from this checkpoint (a prefix of the prompt)
    victims: tuple[CheckpointId, ...] = ()  # inactive checkpoints this transition may displace, lowest value first
    # The leading victims that may also make room for the optional `captures` (the rest only for what is required).
    capture_victims: int = 0
    # Victims to keep as a host replica when they leave the device (the others are deleted), where the host fits.
    demote: frozenset[CheckpointId] = frozenset()
    # MATERIALIZE: prompt frontiers the ResourceManager wants captured during prefill, most valuable first; the
    # Program reserves a state slot for as many as it can and reports them in ResourceResult.captures.
    captures: tuple[int, ...] = ()
    capture_at: int | None = None  # frontier to capture (CAPTURE / RETAIN)
    sampling: Any = None  # MATERIALIZE: the request's ninfer.sampling.SamplingParams, kept with the sequence
    seed: int = 0  # MATERIALIZE: the request's resolved sampling seed
    media: Any = None  # MATERIALIZE: the prompt's contracts.PromptMedia (images, MRoPE positions), None for text


@dataclass(frozen=True)
class Infeasible:
    reason: str
    # True when even root with every inactive checkpoint released cannot fit: a request-level rejection.
    permanent: bool


@dataclass(frozen=True)
class ResourcePlan:
    """Opaque to the Engine. Valid only while the Program's resource_revision equals `resource_revision`."""

    choice: ResourceChoice
    resource_revision: int
    plan_id: int
    payload: Any = None


@dataclass(frozen=True)
class RunningTransaction:
    plan: ResourcePlan
    txn_id: int


@dataclass(frozen=True)
class ResourceResult:
    txn_id: int
    kind: TransitionKind
    succeeded: bool
    resource_revision: int  # the Program's revision after the transition
    handle: SequenceHandle | None = None  # MATERIALIZE: the new active sequence
    reused_tokens: int = 0  # MATERIALIZE: prompt tokens covered by the source checkpoint
    captures: tuple[int, ...] = ()  # MATERIALIZE: the capture frontiers a state slot was reserved for
    published: tuple[CheckpointInfo, ...] = ()
    released: tuple[CheckpointId, ...] = ()
    placed: tuple[CheckpointInfo, ...] = ()  # checkpoints that changed tier (demoted to host or promoted back)
    detail: str = ""
