"""SpeculativeConfig: `--speculative-config` in vLLM's JSON shape, parsed once at start into a frozen value.

    {"method": "mtp", "num_speculative_tokens": k}                                   k in 1..7
    {"method": "dflash" | "dflash2", "num_speculative_tokens": k, "draft_window_size": W}   k in 1..15 (block k + 1)

`draft_window_size` (DFlash methods only, optional) bounds the drafter's context KV to the last W committed
positions. `adaptive` (any method, default true) lets each round take fewer drafts, down to none, where the
Program's measured round costs and the acceptance seen so far say a narrower round gives more tokens per second
(`draft_policy.py`); false drafts the full block every round. `draft_vocab_size` N (any method, optional) draws
drafts from the token ids below N alone: the draft's lm_head reads N rows instead of the whole vocabulary (Qwen's
byte-level BPE ids follow merge order, so the lowest ids are the most frequent pieces; FR-Spec's observation that a
small hot vocabulary keeps most accepted drafts), and acceptance stays lossless (a draft distribution with less
support is still a distribution). `quantization` "fp8" (MTP only, vLLM's field for the draft model's weights)
drafts with the MTP head's projections (and, under a draft vocabulary, its draft head) in FP8, one scale per row
(`ninfer.models.qwen3_5.draft_quant`): half the bytes each draft step reads, and acceptance stays lossless (the
target verifies). Unknown keys, an unknown method or a value out of
range are start-up errors naming the field; whether the artifact carries the backend's weights (and a drafter
trained for that block) is the Program's check.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any, Mapping

from ninfer.models.qwen3_5.drafter import DrafterKind


class SpeculativeMethod(enum.StrEnum):
    MTP = "mtp"
    DFLASH = "dflash"
    DFLASH2 = "dflash2"

    @property
    def drafter(self) -> DrafterKind | None:
        """The drafter kind a DFlash method runs (None: MTP drafts with the model's own head)."""
        return None if self is SpeculativeMethod.MTP else DrafterKind(self.value)

    @property
    def feature(self) -> str:
        """The artifact feature whose bindings the method's backend needs."""
        return self.value

    @property
    def needs(self) -> str:
        """What the artifact must carry, for MissingBackendWeights."""
        if self is SpeculativeMethod.MTP:
            return "the MTP head's weights (mtp.*)"
        return f"a {self.value} drafter (dflash.* weights; convert with --drafter)"


MAX_SPECULATIVE_TOKENS = {SpeculativeMethod.MTP: 7, SpeculativeMethod.DFLASH: 15, SpeculativeMethod.DFLASH2: 15}
FIELDS = ("method", "num_speculative_tokens", "draft_window_size", "adaptive", "draft_vocab_size", "quantization")
DRAFT_QUANTIZATIONS = ("fp8",)


class SpeculativeConfigError(ValueError):
    """A bad --speculative-config, naming the offending field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"--speculative-config: {field}: {message}")
        self.field = field


class MissingBackendWeights(SpeculativeConfigError):
    """The artifact lacks the weights of the asked-for backend (e.g. no `mtp.*` for method "mtp")."""

    def __init__(self, method: str, what: str):
        super().__init__("method", f"{str(method)!r} needs {what}, and this model has none; convert a checkpoint "
                                   "that carries them or start without --speculative-config")


@dataclass(frozen=True)
class SpeculativeConfig:
    method: SpeculativeMethod
    num_speculative_tokens: int
    draft_window_size: int | None = None  # DFlash: context positions the drafter keeps (None: all)
    adaptive: bool = True  # each round's width from the measured costs and acceptance (DraftPolicy)
    draft_vocab_size: int | None = None  # drafts from token ids < this (None: the whole vocabulary)
    quantization: str | None = None  # "fp8": the MTP head's projections in FP8 (None: as the model stores them)

    def __post_init__(self) -> None:
        if not isinstance(self.method, SpeculativeMethod):
            raise SpeculativeConfigError("method", f"must be a SpeculativeMethod, got {self.method!r} (parse it "
                                                   "with SpeculativeConfig.parse)")
        k, most = self.num_speculative_tokens, MAX_SPECULATIVE_TOKENS[self.method]
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= most:
            raise SpeculativeConfigError("num_speculative_tokens", f"must be an int in 1..{most}, got {k!r}")
        w = self.draft_window_size
        if w is not None:
            if self.method.drafter is None:
                raise SpeculativeConfigError("draft_window_size", f"bounds a DFlash drafter's context; method "
                                                                  f"{self.method.value!r} has none")
            if isinstance(w, bool) or not isinstance(w, int) or w < 1:
                raise SpeculativeConfigError("draft_window_size", f"must be a positive int, got {w!r}")
        if not isinstance(self.adaptive, bool):
            raise SpeculativeConfigError("adaptive", f"must be true or false, got {self.adaptive!r}")
        n = self.draft_vocab_size
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise SpeculativeConfigError("draft_vocab_size", f"must be a positive int, got {n!r}")
        q = self.quantization
        if q is not None:
            if q not in DRAFT_QUANTIZATIONS:
                raise SpeculativeConfigError("quantization", f"must be one of {', '.join(DRAFT_QUANTIZATIONS)}, "
                                                             f"got {q!r}")
            if self.method is not SpeculativeMethod.MTP:
                raise SpeculativeConfigError("quantization", f"quantizes the MTP head; method "
                                                             f"{self.method.value!r} drafts with its own drafter")

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | None) -> "SpeculativeConfig | None":
        """None (or an empty object) when speculation is off."""
        if not raw:
            return None
        if not isinstance(raw, Mapping):
            raise SpeculativeConfigError("(root)", f"must be a JSON object, got {type(raw).__name__}")
        unknown = sorted(set(raw) - set(FIELDS))
        if unknown:
            raise SpeculativeConfigError(unknown[0], f"unknown field (this build reads {', '.join(FIELDS)})")
        for field in ("method", "num_speculative_tokens"):
            if field not in raw:
                raise SpeculativeConfigError(field, "required")
        method = raw["method"]
        known = [m.value for m in SpeculativeMethod]
        if method not in known:
            raise SpeculativeConfigError("method", f"unknown method {method!r} (known: {', '.join(known)})")
        return cls(SpeculativeMethod(method), raw["num_speculative_tokens"], raw.get("draft_window_size"),
                   raw.get("adaptive", True), raw.get("draft_vocab_size"), raw.get("quantization"))

    @property
    def name(self) -> str:
        """What the ready line and /v1/models report."""
        window = "" if self.draft_window_size is None else f", window {self.draft_window_size}"
        fixed = "" if self.adaptive else ", fixed width"
        vocab = "" if self.draft_vocab_size is None else f", draft vocab {self.draft_vocab_size}"
        quant = "" if self.quantization is None else f", {self.quantization} draft weights"
        return f"{self.method} (k={self.num_speculative_tokens}{window}{fixed}{vocab}{quant})"

    def for_vocab(self, vocab_size: int) -> "SpeculativeConfig":
        """This config against a model of `vocab_size` ids: a draft vocabulary of the whole vocabulary is none, one
        larger than it the start-up error naming the field."""
        n = self.draft_vocab_size
        if n is not None and n > vocab_size:
            raise SpeculativeConfigError("draft_vocab_size", f"{n} is past the model's {vocab_size} token ids")
        return dataclasses.replace(self, draft_vocab_size=None) if n == vocab_size else self


def drafter_fit(spec: SpeculativeConfig, drafter: Any | None) -> tuple[int, int | None]:
    """A DFlash method's (block size, draft window) over the model's drafter (a `DrafterConfig` or None), or the
    start-up error naming the field: no drafter of that kind, or a block longer than it was trained for. The window
    is the smaller of `draft_window_size` and the drafter's own `sliding_window` (None: neither is set)."""
    if drafter is None or drafter.kind is not spec.method.drafter:
        has = "" if drafter is None else f" (this model carries a {drafter.kind} drafter)"
        raise MissingBackendWeights(spec.method, spec.method.needs + has)
    block = spec.num_speculative_tokens + 1
    if block > drafter.block_size:
        raise SpeculativeConfigError("num_speculative_tokens", f"{spec.num_speculative_tokens} drafts need a block "
                                                               f"of {block}; the drafter was trained for blocks of "
                                                               f"{drafter.block_size}")
    windows = [w for w in (spec.draft_window_size, drafter.sliding_window) if w is not None]
    return block, min(windows) if windows else None
