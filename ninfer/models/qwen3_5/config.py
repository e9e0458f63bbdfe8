"""Frozen text config of the Qwen3.5 family, read once from an HF ``config.json``.

Both Programs, the converter and the planner read this one object; nothing downstream writes it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ninfer.errors import ExitCode, NinferError

from .rope_config import check_rope, rope_fields, rope_pairs
from .vision_config import VisionConfig

LINEAR = "linear_attention"
FULL = "full_attention"

# model_type -> (architecture, is the text config nested under "text_config")
_MODEL_TYPES = {
    "qwen3_5": ("Qwen3_5ForCausalLM", True),
    "qwen3_5_text": ("Qwen3_5ForCausalLM", False),
    "qwen3_5_moe": ("Qwen3_5MoeForCausalLM", True),
    "qwen3_5_moe_text": ("Qwen3_5MoeForCausalLM", False),
}
ARCHITECTURES = ("Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM")
# The activations of transformers' ACT2FN that ninfer.reference.activations computes.
HIDDEN_ACTS = ("silu", "swish", "gelu", "gelu_new", "gelu_pytorch_tanh", "relu")


class ConfigError(NinferError, ValueError):
    """An HF config that ninfer cannot run, naming the offending field."""

    exit_code = ExitCode.BAD_MODEL

    def __init__(self, field: str, message: str):
        super().__init__(f"config field {field!r}: {message}")
        self.field = field


@dataclass(frozen=True)
class Qwen35Config:
    architecture: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_key_head_dim: int
    linear_num_value_heads: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    rms_norm_eps: float
    rope_theta: float
    partial_rotary_factor: float
    mrope_section: tuple[int, ...]
    mrope_interleaved: bool
    max_position_embeddings: int
    tie_word_embeddings: bool
    mtp_num_hidden_layers: int
    # Dense FFN width; 0 for MoE models.
    intermediate_size: int = 0
    # MoE geometry; all 0 for dense models.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    has_vision: bool = False
    # The vision tower's geometry (None: text-only, or an artifact converted before vision was supported).
    vision: VisionConfig | None = None
    # Scaled RoPE (ninfer.models.qwen3_5.rope_config): the type and its parameters as sorted (name, value) pairs.
    rope_type: str = "default"
    rope_scaling: tuple[tuple[str, Any], ...] = ()
    # The FFN and GDN-conv activation (transformers' ACT2FN name); silu in every released model.
    hidden_act: str = "silu"
    attention_bias: bool = False  # q/k/v/o projection biases (none in the released models)

    def __post_init__(self) -> None:
        self._validate()

    @property
    def is_moe(self) -> bool:
        return self.architecture == "Qwen3_5MoeForCausalLM"

    @property
    def conv_dim(self) -> int:
        """Channels of the GDN causal conv: q and k of all key heads, then v of all value heads."""
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def rope_dim(self) -> int:
        """transformers' ``dim = int(head_dim * partial_rotary_factor)``: the divisor of the frequency exponents."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def rotary_dim(self) -> int:
        """How many leading dims of each head rotate (2 x the frequency count; rope_dim rounded up to even)."""
        return 2 * rope_pairs(self.rope_type, self.head_dim, self.partial_rotary_factor)

    @property
    def plain_rope(self) -> bool:
        """Unscaled RoPE over an even rotary dimension: what the fast Program's kernels compute."""
        return self.rope_type == "default" and self.rope_dim == self.rotary_dim

    @property
    def silu(self) -> bool:
        """SiLU activations: what the fast Program's SwiGLU and conv kernels compute."""
        return self.hidden_act in ("silu", "swish")

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR)

    def _validate(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ConfigError("architectures", f"unknown architecture {self.architecture!r}; expected one of {ARCHITECTURES}")
        positive = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                    "head_dim", "linear_num_key_heads", "linear_key_head_dim", "linear_num_value_heads",
                    "linear_value_head_dim", "linear_conv_kernel_dim", "max_position_embeddings"]
        for name in positive:
            if int(getattr(self, name)) <= 0:
                raise ConfigError(name, f"must be a positive integer, got {getattr(self, name)!r}")
        if len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError("layer_types", f"has {len(self.layer_types)} entries for {self.num_hidden_layers} layers")
        bad = sorted({t for t in self.layer_types if t not in (LINEAR, FULL)})
        if bad:
            raise ConfigError("layer_types", f"unknown layer type(s) {bad}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError("num_key_value_heads", f"{self.num_key_value_heads} does not divide num_attention_heads={self.num_attention_heads}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ConfigError("linear_num_value_heads", f"{self.linear_num_value_heads} is not a multiple of linear_num_key_heads={self.linear_num_key_heads}")
        check_rope(self.rope_type, self.head_dim, self.partial_rotary_factor)
        if self.hidden_act not in HIDDEN_ACTS:
            raise ConfigError("hidden_act", f"{self.hidden_act!r} is not supported; ninfer runs {HIDDEN_ACTS}")
        if self.mtp_num_hidden_layers < 0:
            raise ConfigError("mtp_num_hidden_layers", "must be >= 0")
        if self.is_moe:
            for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
                if getattr(self, name) <= 0:
                    raise ConfigError(name, "must be positive for an MoE architecture")
            if self.num_experts_per_tok > self.num_experts:
                raise ConfigError("num_experts_per_tok", f"{self.num_experts_per_tok} > num_experts={self.num_experts}")
        elif self.intermediate_size <= 0:
            raise ConfigError("intermediate_size", "must be positive for a dense architecture")
        if self.vision is not None and self.vision.out_hidden_size != self.hidden_size:
            raise ConfigError("vision_config.out_hidden_size", f"{self.vision.out_hidden_size} differs from the text "
                                                               f"hidden_size={self.hidden_size}")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Qwen35Config":
        """Inverse of :meth:`to_dict` (the artifact descriptor's form, not HF's)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(unknown[0], "unknown field in ninfer config")
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        kw["rope_scaling"] = tuple(tuple(pair) for pair in kw.get("rope_scaling", ()))
        if kw.get("vision") is not None:
            kw["vision"] = VisionConfig.from_dict(kw["vision"])
        return cls(**kw)

    @classmethod
    def from_hf_file(cls, path: str | Path) -> "Qwen35Config":
        with open(path, encoding="utf-8") as f:
            return cls.from_hf(json.load(f))

    @classmethod
    def from_hf(cls, raw: Mapping[str, Any]) -> "Qwen35Config":
        return from_hf(raw)


# transformers' defaults for the geometry fields a config may leave out (Qwen3_5TextConfig, Qwen3_5MoeTextConfig).
_DEFAULTS = {
    False: dict(vocab_size=248320, hidden_size=4096, num_hidden_layers=32, num_attention_heads=16,
                num_key_value_heads=4, intermediate_size=12288),
    True: dict(vocab_size=248320, hidden_size=2048, num_hidden_layers=40, num_attention_heads=16,
               num_key_value_heads=2, num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
               shared_expert_intermediate_size=512),
}


def _geometry(text: Mapping[str, Any], moe: bool) -> dict[str, int]:
    """The geometry fields, absent ones at transformers' defaults; a null one is refused (transformers too)."""
    out = {}
    for name, default in _DEFAULTS[moe].items():
        value = text.get(name, default)
        if value is None:
            raise ConfigError(name, "is null (transformers fails on it too)")
        out[name] = int(value)
    return out


def _layer_types(text: Mapping[str, Any], n: int) -> tuple[str, ...]:
    if text.get("layer_types") is not None:
        return tuple(text["layer_types"])
    interval = int(text.get("full_attention_interval", 4))
    if interval <= 0:
        raise ConfigError("full_attention_interval", "must be positive")
    return tuple(LINEAR if (i + 1) % interval else FULL for i in range(n))


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return (int(value),) if isinstance(value, int) else tuple(int(x) for x in value)


def from_hf(raw: Mapping[str, Any]) -> Qwen35Config:
    """Parse an HF ``config.json`` dict (multimodal or text-only, dense or MoE)."""
    model_type = raw.get("model_type")
    if model_type not in _MODEL_TYPES:
        raise ConfigError("model_type", f"unknown model type {model_type!r}; expected one of {sorted(_MODEL_TYPES)}")
    arch, nested = _MODEL_TYPES[model_type]
    text = raw.get("text_config") if nested else raw
    if nested and not isinstance(text, Mapping):
        raise ConfigError("text_config", f"a {model_type!r} config must carry a text_config object")
    assert text is not None
    moe = arch == "Qwen3_5MoeForCausalLM"
    geometry = _geometry(text, moe)
    n = geometry["num_hidden_layers"]
    # A nested config is a ForConditionalGeneration checkpoint: transformers ties by the top-level flag alone.
    tie = (raw if nested else text).get("tie_word_embeddings", False)
    if text.get("head_dim", 256) is None:
        raise ConfigError("head_dim", "is null (transformers fails on it too); give the per-head size or omit it "
                                      "for the default 256")
    max_positions = int(text.get("max_position_embeddings", 32768))
    kw: dict[str, Any] = dict(
        architecture=arch,
        **geometry,
        layer_types=_layer_types(text, n),
        head_dim=int(text.get("head_dim", 256)),
        linear_num_key_heads=int(text.get("linear_num_key_heads", 16)),
        linear_key_head_dim=int(text.get("linear_key_head_dim", 128)),
        linear_num_value_heads=int(text.get("linear_num_value_heads", 32)),
        linear_value_head_dim=int(text.get("linear_value_head_dim", 128)),
        linear_conv_kernel_dim=int(text.get("linear_conv_kernel_dim", 4)),
        rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=max_positions,
        tie_word_embeddings=bool(tie),
        mtp_num_hidden_layers=int(text.get("mtp_num_hidden_layers", 0)),
        bos_token_id=text.get("bos_token_id"),
        eos_token_ids=_eos_ids(text.get("eos_token_id", raw.get("eos_token_id"))),
        pad_token_id=text.get("pad_token_id"),
        has_vision=bool(nested and raw.get("vision_config")),
        vision=VisionConfig.from_hf(raw) if nested and raw.get("vision_config") else None,
        hidden_act=str(text.get("hidden_act", "silu")),
        attention_bias=bool(text.get("attention_bias", False)),
        **rope_fields(text, max_positions),
    )
    # attn_output_gate is not read, as in transformers: Qwen3.5 attention is always gated, and a checkpoint whose
    # q_proj lacks the gate rows is refused by the converter's shape check.
    # norm_topk_prob is not read, as in transformers: its Qwen3.5 MoE router always renormalises the top-k weights.
    return Qwen35Config(**kw)
