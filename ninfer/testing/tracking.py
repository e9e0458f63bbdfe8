"""What the property harness keeps of each accepted request: its handle and request, its events as they were
published (through `Stamped`, the request's event queue, which lets the harness check each event at the moment
the worker publishes it), and the solo-run oracle of schedule invariance."""

from __future__ import annotations

import queue
from dataclasses import dataclass, field
from typing import Any, Callable

from ninfer.contracts import FinishReason, GenerationResult
from ninfer.engine.config import EngineConfig
from ninfer.engine.engine import Engine, GenerationHandle
from ninfer.engine.records import GenerationRequest

from .sessions import TokenSession

ProgramFactory = Callable[[], Any]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass(eq=False)
class Tracked:
    handle: GenerationHandle
    request: GenerationRequest
    order: int  # the harness's own submit order
    submitted_at: float
    events: list = field(default_factory=list)  # every event, in publication order, as it was published
    finished_at: int | None = None  # boundary that published the result
    abandoned: bool = False
    cancelled: bool = False
    consumed: bool = False  # the result was taken through the handle (consumer_released)

    @property
    def rid(self) -> int:
        return self.handle.request_id

    @property
    def result(self) -> GenerationResult | None:
        return self.events[-1] if self.events and isinstance(self.events[-1], GenerationResult) else None


class Stamped(queue.SimpleQueue):
    """The request's event queue: checks each event against the Program's view at the moment it is published."""

    def __init__(self, model: Any, t: Tracked):
        super().__init__()
        self.model, self.t = model, t  # the harness's RequestModel

    def put(self, item, block=True, timeout=None):
        self.model.on_publish(self.t, item)
        super().put(item, block, timeout)


def solo_tokens(factory: ProgramFactory, request: GenerationRequest, think_budget: int | None) -> tuple[int, ...]:
    """The oracle for schedule invariance: the same request alone, no prefix caching, one lane."""
    engine = Engine(factory(), EngineConfig(max_concurrency=1, prefix_caching=False), threaded=False)
    session = TokenSession(request.max_tokens, think_budget=think_budget, mask=getattr(request.session, "mask", None),
                           stop_ids=getattr(request.session, "stop_ids", (0,)))
    solo = GenerationRequest(request.prompt, session, request.max_tokens, request.sampling, request.seed)
    handle = engine.submit(solo)
    engine.run_until_idle()
    result = handle.result(timeout=0)
    assert result.finish_reason in (FinishReason.STOP, FinishReason.LENGTH), result
    return result.token_ids
