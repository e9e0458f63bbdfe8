"""Request records: the Engine worker's private view of each accepted request.

Only the worker mutates a record, except the two consumer-side facts (`cancel_requested`, `consumer_released`),
which are plain flags the worker reads at its next boundary.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Any

from ninfer.contracts import FinishReason, RequestState, RowFailure, SequenceHandle, check_request_transition

from .frontend_api import OutputSession


@dataclass(frozen=True)
class GenerationRequest:
    """What a Gateway submits: an owning prompt (token ids) and a request-owned OutputSession."""

    prompt: tuple[int, ...]
    session: OutputSession
    max_tokens: int  # the output budget; the session ends the request with LENGTH when it is spent
    sampling: Any = None  # ninfer.sampling.SamplingParams; None means greedy
    seed: int | None = None
    session_key: str | None = None  # a lookup hint for prefix reuse, never an owner of state
    # Prompt lengths the Frontend marks as turn boundaries (message ends, the point before dropped reasoning):
    # frontiers a later request of the conversation is likely to share, so the ResourceManager may capture them.
    capture_hints: tuple[int, ...] = ()
    deadline: float | None = None  # absolute time.monotonic() after which the request ends
    queue_timeout: float | None = None  # seconds it may wait before admission
    media: Any = None  # ninfer.contracts.PromptMedia of a prompt with images (its pads are placeholder ids)


@dataclass(eq=False)
class RequestRecord:
    rid: int
    request: GenerationRequest
    publication_order: int
    enqueued_at: float
    seed: int
    state: RequestState = RequestState.WAITING
    lane: int | None = None
    handle: SequenceHandle | None = None
    reused_tokens: int = 0
    output_tokens: list[int] = field(default_factory=list)
    drafted: int = 0  # speculative drafts proposed for this request (Usage.draft_tokens)
    accepted_drafts: int = 0  # of which verification accepted (Usage.accepted_draft_tokens)
    blocks: list[int] = field(default_factory=list)  # rounds by emitted tokens - 1 (Usage.acceptance_lengths)
    finish_reason: FinishReason | None = None
    error: str | None = None
    failure: RowFailure | None = None  # the typed reason when the Program could not draw this request's token
    capture_pending: bool = False  # checkpoints captured during prefill wait to be published
    boundary: int | None = None  # absolute Frontend boundary of the last commit that carried one
    final: Any = None  # a terminal row's CommittedOutput, published once the terminal result is adopted
    output_ended: bool = False  # the OutputSession ended (terminal commit or end()): its result() is valid
    events: "queue.SimpleQueue[Any]" = field(default_factory=queue.SimpleQueue)
    cancel_requested: bool = False
    consumer_released: bool = False
    response_done: bool = False
    capacity_released: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.request.prompt

    def move(self, state: RequestState) -> None:
        check_request_transition(self.state, state)
        self.state = state

    @property
    def frontier(self) -> int:
        """Tokens the sequence has consumed once the last Program-committed output token is fed back (a terminal
        row's tokens count before they are accounted)."""
        committed = len(self.output_tokens) + (len(self.final.tokens) if self.final is not None else 0)
        return len(self.prompt) + max(0, committed - 1)
