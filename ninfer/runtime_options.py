"""RuntimeOptions: the process's startup choices (vLLM spellings), frozen and checked once, and the parsers of the
options the CLI passes as text (JSON objects, the image limit). `ninfer.wiring.build_runtime` turns them into a
Runtime.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ninfer.engine.config import EngineConfig
from ninfer.errors import UsageError
from ninfer.frontend.grammar.options import JSON_WHITESPACE

PROGRAMS = ("auto", "reference", "fast")
PURPOSES = ("generation", "scoring")


class WiringError(UsageError, ValueError):
    """A startup option that cannot be honoured; the message is what the user sees."""


@dataclass(frozen=True)
class RuntimeOptions:
    """Startup choices, fixed for the process (vLLM spellings; every one has a NINFER_* variable in the CLI)."""

    model: str | None = None  # .ninfer file or HF checkpoint dir; None: the embedded random-weight model
    program: str = "auto"
    purpose: str = "generation"
    served_model_name: str | None = None
    max_model_len: int | None = None
    max_num_seqs: int = 4
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    cache_device_share: float = 1.0  # share of the KV pool inactive checkpoints may hold
    kv_offloading_size: float = 4.0  # GiB of host memory for checkpoint replicas
    concurrent_prefill: bool = False
    # launch decode rounds ahead of the host's commit (docs/engine.md "Async scheduling"); None: on for the fast
    # Program only (the reference Program has no device queue to overlap)
    async_scheduling: bool | None = None
    # the fast Program captures no CUDA graphs: every step runs eagerly (vLLM's escape hatch for a driver or GPU
    # where capture fails, and for debugging); the reference Program captures none anyway
    enforce_eager: bool = False
    speculative_config: Mapping[str, Any] | None = None
    default_chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    seed: int | None = None
    dtype: str = "float32"
    warmup: bool = True
    score_window: int | None = None  # scoring purpose: tokens per window (default: DEFAULT_SCORE_WINDOW)
    score_stride: int | None = None  # scoring purpose: tokens between window starts (default: half a window)
    max_queued_requests: int = EngineConfig.queue_bound  # waiting choices beyond the lanes before 429
    queue_timeout: float | None = None  # seconds a choice may wait for a lane; None: unbounded
    grammar_compile_timeout: float | None = None  # seconds per structured-output grammar; None: unbounded
    generation_config: str = "auto"  # sampling defaults: auto (the artifact's), none / vllm, or a path
    json_whitespace: str = "compact"  # the final JSON's layout where a request names none
    thinking_token_budget: int | None = None  # reasoning tokens before a forced </think>, where a request sets none
    # Images (docs/vision.md): per prompt at most (0: the Vision feature is not prepared), where local files may be
    # read from (None: nowhere), whether http(s) URLs are fetched, and the limits of one image.
    limit_mm_per_prompt: int = 8
    allowed_local_media_path: str | None = None
    allow_remote_media: bool = False
    media_max_bytes: int = 20 << 20
    media_max_pixels: int = 64 << 20
    media_fetch_timeout: float = 10.0
    # pipeline stages (docs/pipeline.md): one torch device per stage (None: the Program's one device) and the layers
    # per stage (None: balanced by bytes), parsed by `ninfer.pipeline.parse_devices` / `parse_stage_layers`
    devices: tuple[str, ...] | None = None
    stage_layers: tuple[int, ...] | None = None

    def check(self) -> None:
        if self.program not in PROGRAMS:
            raise WiringError(f"--program must be one of {', '.join(PROGRAMS)}, got {self.program!r}")
        if self.purpose not in PURPOSES:
            raise WiringError(f"--purpose must be one of {', '.join(PURPOSES)}, got {self.purpose!r}")
        if not 1 <= self.max_num_seqs <= 8:
            raise WiringError(f"--max-num-seqs must be in 1..8, got {self.max_num_seqs}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise WiringError(f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if not 0.0 < self.cache_device_share <= 1.0:
            raise WiringError(f"--cache-device-share must be in (0, 1], got {self.cache_device_share}")
        if self.kv_offloading_size < 0:
            raise WiringError(f"--kv-offloading-size must be >= 0 GiB, got {self.kv_offloading_size}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise WiringError(f"--max-model-len must be >= 2, got {self.max_model_len}")
        if self.max_queued_requests < 0:
            raise WiringError(f"--max-queued-requests must be >= 0, got {self.max_queued_requests}")
        for flag, value in (("--queue-timeout", self.queue_timeout),
                            ("--grammar-compile-timeout", self.grammar_compile_timeout)):
            if value is not None and not value > 0:
                raise WiringError(f"{flag} must be positive, got {value}")
        if self.dtype not in ("float32", "float64"):
            raise WiringError(f"--dtype must be float32 or float64 for the reference Program, got {self.dtype!r}")
        if self.json_whitespace not in JSON_WHITESPACE:
            raise WiringError(f"--json-whitespace must be one of {', '.join(JSON_WHITESPACE)}, "
                              f"got {self.json_whitespace!r}")
        if self.thinking_token_budget is not None and self.thinking_token_budget < 0:
            raise WiringError(f"--thinking-token-budget must be >= 0, got {self.thinking_token_budget}")
        if self.limit_mm_per_prompt < 0:
            raise WiringError(f"--limit-mm-per-prompt must be >= 0 images, got {self.limit_mm_per_prompt}")
        for flag, value in (("--media-max-bytes", self.media_max_bytes), ("--media-max-pixels", self.media_max_pixels),
                            ("--media-fetch-timeout", self.media_fetch_timeout)):
            if not value > 0:
                raise WiringError(f"{flag} must be positive, got {value}")
        if self.allowed_local_media_path is not None and not Path(self.allowed_local_media_path).is_dir():
            raise WiringError(f"--allowed-local-media-path {self.allowed_local_media_path!r} is not a directory")


def parse_image_limit(text: str | None) -> int:
    """--limit-mm-per-prompt: a count, or vLLM's JSON '{"image": N}' (video and audio are refused anyway)."""
    if text is None:
        return RuntimeOptions.limit_mm_per_prompt
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    value = parse_json_option(text, "--limit-mm-per-prompt")
    extra = sorted(set(value or {}) - {"image", "video", "audio"})
    if not isinstance(value, dict) or extra or not isinstance(value.get("image", 0), int):
        raise WiringError(f"--limit-mm-per-prompt must be a count or {{\"image\": N}}, got {text!r}")
    return int(value.get("image", RuntimeOptions.limit_mm_per_prompt))


def parse_json_option(text: str | None, name: str) -> dict | None:
    """A JSON-object option (--speculative-config, --default-chat-template-kwargs); None when unset."""
    if text is None or text == "":
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise WiringError(f"{name} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise WiringError(f"{name} must be a JSON object, got {type(value).__name__}")
    return value
