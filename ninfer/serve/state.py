"""What every route shares: the Runtime (Frontend + Engine or scoring core), names, limits and metrics."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ninfer.contracts import RequestRejected
from ninfer.wiring import Runtime

from .errors import APIError
from .metrics import Metrics

MAX_BODY_BYTES = 8 << 20  # a request body beyond this is refused (413) before it is parsed


@dataclass
class ServerState:
    runtime: Runtime  # loaded before the port opens (ninfer.serve.server)
    model_name: str
    api_key: str | None = None
    max_body_bytes: int = MAX_BODY_BYTES
    metrics: Metrics = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = Metrics(self.model_name)

    @property
    def fingerprint(self) -> str:
        rt = self.runtime
        key = f"{self.model_name}|{rt.model_path.name}|{rt.program_kind}"
        return "fp_" + hashlib.sha256(key.encode()).hexdigest()[:12]

    def ready(self) -> Runtime:
        if not self.runtime.available:
            raise APIError(503, f"the engine is unavailable: {self.runtime.failure or 'shut down'}",
                           code="engine_unavailable")
        return self.runtime

    def check_model(self, model: str | None) -> None:
        """An absent model means the served one (vLLM's behaviour); another name is 404."""
        self.ready()
        if model is not None and model != self.model_name:
            raise APIError(404, f"The model `{model}` does not exist (this server serves `{self.model_name}`).",
                           param="model", code="model_not_found")

    def require_generation(self) -> None:
        if self.ready().engine is None:
            raise APIError(400, "this server runs the scoring purpose: only /v1/completions with echo and "
                           "max_tokens 0 or 1 is served (start it with --purpose generation to generate)",
                           code="wrong_purpose")

    def submit_choices(self, submit_one: Callable, params: Sequence) -> list:
        """Submit every choice or none: a refusal of choice j closes the j already submitted."""
        handles = []
        try:
            for p in params:
                handles.append(submit_one(p))
        except RequestRejected as e:
            for h in handles:
                h.close()
            self.metrics.reject(e.reason.value)
            raise APIError.from_rejection(e) from None
        except BaseException:
            for h in handles:
                h.close()
            raise
        return handles
