"""What a Program holds per active sequence and per checkpoint: host bookkeeping only. The tensors live in the
Program's physical store, addressed by page ids, state slot ids and (in the fast Program) block-table row ids."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ninfer.contracts import SequenceHandle, token_digest
from ninfer.sampling import SamplingParams


@dataclass
class Checkpoint:
    """A complete, immutable continuation at frontier len(tokens): KV pages by reference plus one GDN state,
    either in a device slot or (slot None) on the host tier."""

    tokens: tuple[int, ...]
    table: list[int]  # pages covering positions < len(tokens), each holding one reference
    slot: int | None
    digest: str = field(init=False)  # resident prefix identity: token_digest(tokens), computed once

    def __post_init__(self) -> None:
        self.digest = token_digest(self.tokens)


@dataclass
class ActiveSequence:
    handle: SequenceHandle  # handle.slot is the live GDN state slot
    prompt: tuple[int, ...]
    max_new: int
    params: SamplingParams
    seed: int  # resolved, in [0, 2^64)
    row: int | None = None  # block-table row where the store has rows: data handed to the model, not an identity
    tokens: list[int] = field(default_factory=list)  # consumed tokens: the KV and GDN frontier is len(tokens)
    pending: int | None = None  # last committed output token, not yet consumed
    table: list[int] = field(default_factory=list)  # block table, covers exactly the frontier
    reserve_left: int = 0  # pages reserved for growth, not yet taken from the pool
    # Capture frontiers the ResourceManager chose and a state slot was reserved for at activation, ascending:
    # (frontier, slot), each filled when prefill reaches it.
    captures: list[tuple[int, int]] = field(default_factory=list)
    snapshots: list[Checkpoint] = field(default_factory=list)  # captured, not yet published
    media: Any = None  # contracts.PromptMedia: the prompt's images and MRoPE positions (None: a text prompt)

    @property
    def capture_slots(self) -> int:
        """State slots held for captures, reserved or filled and unpublished."""
        return len(self.captures) + len(self.snapshots)

    @property
    def frontier(self) -> int:
        return len(self.tokens)

    @property
    def prompt_pos(self) -> int:
        return min(len(self.tokens), len(self.prompt))

    @property
    def num_outputs(self) -> int:
        """len(outputs), without building the list."""
        return max(len(self.tokens) - len(self.prompt), 0) + (self.pending is not None)

    @property
    def outputs(self) -> list[int]:
        """Committed output tokens, the pending one included (the history penalties see)."""
        done = self.tokens[len(self.prompt):]
        return done + ([self.pending] if self.pending is not None else [])
