"""SpeculativeConfig: `--speculative-config` in vLLM's JSON shape, parsed once at start into a frozen value.

    {"method": "mtp", "num_speculative_tokens": k}     k in 1..7

Unknown keys, an unknown method or k out of range are start-up errors naming the field; whether the artifact
carries the backend's weights is the Program's check (it knows the model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

METHODS = ("mtp",)
MAX_SPECULATIVE_TOKENS = 7


class SpeculativeConfigError(ValueError):
    """A bad --speculative-config, naming the offending field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"--speculative-config: {field}: {message}")
        self.field = field


class MissingBackendWeights(SpeculativeConfigError):
    """The artifact lacks the weights of the asked-for backend (e.g. no `mtp.*` for method "mtp")."""

    def __init__(self, method: str, what: str):
        super().__init__("method", f"{method!r} needs {what}, and this model has none; convert a checkpoint that "
                                   "carries them or start without --speculative-config")


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise SpeculativeConfigError("method", f"unknown method {self.method!r} (known: {', '.join(METHODS)})")
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise SpeculativeConfigError("num_speculative_tokens",
                                         f"must be an int in 1..{MAX_SPECULATIVE_TOKENS}, got {k!r}")

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | None) -> "SpeculativeConfig | None":
        """None (or an empty object) when speculation is off."""
        if not raw:
            return None
        if not isinstance(raw, Mapping):
            raise SpeculativeConfigError("(root)", f"must be a JSON object, got {type(raw).__name__}")
        unknown = sorted(set(raw) - {"method", "num_speculative_tokens"})
        if unknown:
            raise SpeculativeConfigError(unknown[0], "unknown field (this build reads method and "
                                                     "num_speculative_tokens)")
        for field in ("method", "num_speculative_tokens"):
            if field not in raw:
                raise SpeculativeConfigError(field, "required")
        return cls(raw["method"], raw["num_speculative_tokens"])

    @property
    def name(self) -> str:
        """What the ready line and /v1/models report."""
        return f"{self.method} (k={self.num_speculative_tokens})"
