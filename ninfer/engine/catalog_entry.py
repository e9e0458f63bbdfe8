"""What the ResourceManager records of each published checkpoint, and of each SessionIndex binding."""

from __future__ import annotations

from dataclasses import dataclass

from ninfer.contracts import CheckpointId, CheckpointInfo

from .retention import Retention


@dataclass
class CatalogEntry:
    info: CheckpointInfo
    retention: Retention
    last_used: int  # logical clock of the last hit or publication
    hits: int = 0
    pins: int = 0  # materializations currently reading this checkpoint as their source
    superseded: bool = False  # a request resumed from it and published a deeper checkpoint
    origin: int | None = None  # the request that published it
    continued: bool = False  # that request resumed from the end of an earlier prompt or output (see _supersede)


@dataclass(frozen=True)
class SessionBinding:
    checkpoint: CheckpointId
    publication_order: int
