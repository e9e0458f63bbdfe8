"""Per-request sampling parameters, validated once at construction.

Field names and ranges follow vLLM's ``SamplingParams`` (a superset of the OpenAI request fields);
where the two differ the wider vLLM range is accepted and the Gateway may narrow it. The table of
ranges and the reason for each choice is in docs/sampling.md.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

# vLLM treats temperatures below this as greedy: the noise could no longer change the argmax.
GREEDY_TEMPERATURE = 1e-5
# OpenAI caps top_logprobs at 20 and vLLM's default max_logprobs is 20.
MAX_LOGPROBS = 20
MAX_LOGIT_BIAS = 100.0
MAX_OPENAI_PENALTY = 2.0
# vLLM's repetition range is (0, 2]. The sampler divides positive logits by it in float32, so a tiny penalty turns
# them into +inf (1e-300 rounds to 0); at 1e-6 a logit would have to exceed 3e32 to overflow.
MIN_REPETITION_PENALTY = 1e-6
MAX_REPETITION_PENALTY = 2.0
SEED_MIN = -(1 << 63)
SEED_END = 1 << 64
INT64_MAX = (1 << 63) - 1  # every count and id travels in int64 tensors


class SamplingParamsError(ValueError):
    """A sampling parameter out of range, naming the offending field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"sampling field {field!r}: {message}")
        self.field = field


def _check_int(field: str, value: Any, low: int, high: int = INT64_MAX) -> None:
    # bool is an int subclass; True as a token count is always a caller bug
    if isinstance(value, bool) or not isinstance(value, int):
        raise SamplingParamsError(field, f"must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise SamplingParamsError(field, f"must be in [{low}, {high}], got {value}")


def _check_float(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SamplingParamsError(field, f"must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise SamplingParamsError(field, f"must be finite, got {value}")
    return float(value)


def _check_token_ids(field: str, ids: Any) -> None:
    if not isinstance(ids, tuple):
        raise SamplingParamsError(field, f"must be a tuple of token ids, got {type(ids).__name__}"
                                         " (SamplingParams.create accepts any iterable)")
    for token in ids:
        _check_int(field, token, 0)


def _check_logit_bias(bias: Any) -> None:
    if not isinstance(bias, tuple):
        raise SamplingParamsError("logit_bias", "must be a tuple of (token_id, bias) pairs, got "
                                  f"{type(bias).__name__} (SamplingParams.create accepts a dict)")
    seen: set[int] = set()
    for pair in bias:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise SamplingParamsError("logit_bias", f"entries must be (token_id, bias) pairs, got {pair!r}")
        token, value = pair
        _check_int("logit_bias", token, 0)
        value = _check_float("logit_bias", value)
        if abs(value) > MAX_LOGIT_BIAS:
            raise SamplingParamsError("logit_bias", f"bias of token {token} must be in [-100, 100], got {value}")
        if token in seen:
            raise SamplingParamsError("logit_bias", f"token {token} appears twice")
        seen.add(token)


@dataclass(frozen=True)
class SamplingParams:
    """What a request asks of the sampler. Token ids are checked against the vocabulary at
    sampling time, since the parameters do not know the model."""

    temperature: float = 1.0
    # 0 or -1 disable top-k (vLLM accepts both)
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # (token_id, bias) pairs, sorted by token id when built through ``create``
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    # None: the Engine picks a fresh seed per request (``resolve_seed``)
    seed: int | None = None
    # None: generate until a stop condition or the context limit
    max_tokens: int | None = None
    n: int = 1
    # None: no logprobs; k: the chosen token's logprob plus the k most likely alternatives
    logprobs: int | None = None

    def __post_init__(self) -> None:
        self._check_distribution_fields()
        self._check_penalty_fields()
        self._check_length_fields()
        _check_logit_bias(self.logit_bias)
        _check_token_ids("stop_token_ids", self.stop_token_ids)
        if not isinstance(self.ignore_eos, bool):
            raise SamplingParamsError("ignore_eos", f"must be a bool, got {type(self.ignore_eos).__name__}")
        if self.seed is not None:
            _check_int("seed", self.seed, SEED_MIN, SEED_END - 1)
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, 0, MAX_LOGPROBS)

    def _check_distribution_fields(self) -> None:
        if _check_float("temperature", self.temperature) < 0.0:
            raise SamplingParamsError("temperature", f"must be >= 0, got {self.temperature}")
        _check_int("top_k", self.top_k, -1)
        if not 0.0 < _check_float("top_p", self.top_p) <= 1.0:
            raise SamplingParamsError("top_p", f"must be in (0, 1], got {self.top_p}")
        if not 0.0 <= _check_float("min_p", self.min_p) <= 1.0:
            raise SamplingParamsError("min_p", f"must be in [0, 1], got {self.min_p}")

    def _check_penalty_fields(self) -> None:
        if not MIN_REPETITION_PENALTY <= _check_float("repetition_penalty", self.repetition_penalty) \
                <= MAX_REPETITION_PENALTY:
            raise SamplingParamsError("repetition_penalty", f"must be in [{MIN_REPETITION_PENALTY:g}, "
                                      f"{MAX_REPETITION_PENALTY:g}], got {self.repetition_penalty}")
        for field in ("presence_penalty", "frequency_penalty"):
            value = _check_float(field, getattr(self, field))
            if abs(value) > MAX_OPENAI_PENALTY:
                raise SamplingParamsError(field, f"must be in [-2, 2], got {value}")

    def _check_length_fields(self) -> None:
        _check_int("n", self.n, 1)
        _check_int("min_tokens", self.min_tokens, 0)
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens, 1)
            if self.min_tokens > self.max_tokens:
                raise SamplingParamsError(
                    "min_tokens", f"must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}")

    def check_vocabulary(self, vocab_size: int) -> None:
        """The checks that need the model: every named token id inside the vocabulary, top_k at most its size.
        The Gateway runs them before admission; a sampler that meets a bad id anyway fails only that row."""
        if self.top_k > vocab_size:
            raise SamplingParamsError("top_k", f"must be -1, 0 (off) or in [1, {vocab_size}] (the vocabulary), "
                                      f"got {self.top_k}")
        for field, ids in (("logit_bias", [t for t, _ in self.logit_bias]), ("stop_token_ids", self.stop_token_ids)):
            bad = next((t for t in ids if t >= vocab_size), None)
            if bad is not None:
                raise SamplingParamsError(field, f"token id {bad} is outside the vocabulary (0..{vocab_size - 1})")

    @classmethod
    def create(cls, *, logit_bias: Mapping[int, float] | None = None,
               stop_token_ids: Iterable[int] | None = None, **fields: Any) -> SamplingParams:
        """Build from request-shaped values: a dict for logit_bias, any iterable of stop ids."""
        bias = tuple(sorted((logit_bias or {}).items()))
        stops = tuple(stop_token_ids or ())
        return cls(logit_bias=bias, stop_token_ids=stops, **fields)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def effective_top_k(self) -> int:
        """top_k with both "off" spellings folded to 0."""
        return max(self.top_k, 0)

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)


def resolve_seed(seed: int | None, choice_index: int = 0) -> int:
    """The RNG seed of one choice of a request, in [0, 2^64).

    A given seed gives choice j the seed (seed + j) mod 2^64, as vLLM does for n > 1, so the n
    choices differ yet replay exactly. Without a seed each choice draws 64 fresh random bits.
    """
    if seed is None:
        return secrets.randbits(64)
    return (seed + choice_index) % SEED_END
