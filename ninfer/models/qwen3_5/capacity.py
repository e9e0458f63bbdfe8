"""Capacity queries shared by both Programs and the planner: bytes of weights, KV and GDN state.

All answers are pure functions of the config (and of the dtypes chosen at start), so the reference
Program's accounting and the fast Program's memory plan agree by construction.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import FULL, Qwen35Config
from .params import MTP, TEXT, ParamSpec, layer_of, logical_parameters

DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(DTYPE_BYTES)}") from None


def param_bytes(spec: ParamSpec, weight_dtype: str) -> int:
    """fp32-kind parameters (A_log, dt_bias) stay fp32 whatever the weight dtype."""
    return spec.numel * (4 if spec.kind == "fp32" else dtype_bytes(weight_dtype))


def weight_bytes_per_layer(cfg: Qwen35Config, weight_dtype: str = "bfloat16") -> list[int]:
    """Dense-representation bytes of each main decoder layer's parameters, index = layer."""
    out = [0] * cfg.num_hidden_layers
    for spec in logical_parameters(cfg, (TEXT,)).values():
        i = layer_of(spec.name)
        if i is not None:
            out[i] += param_bytes(spec, weight_dtype)
    return out


def weight_bytes(cfg: Qwen35Config, weight_dtype: str = "bfloat16", features: tuple[str, ...] = (TEXT,)) -> int:
    """All logical parameters of the features; a tied lm_head shares the embedding and is not counted twice."""
    total = 0
    for spec in logical_parameters(cfg, features).values():
        if spec.name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        total += param_bytes(spec, weight_dtype)
    return total


def kv_bytes_per_token(cfg: Qwen35Config, kv_dtype: str = "bfloat16") -> int:
    """K and V of one token in ONE attention layer."""
    return 2 * cfg.num_key_value_heads * cfg.head_dim * dtype_bytes(kv_dtype)


def kv_bytes_per_token_all_layers(cfg: Qwen35Config, kv_dtype: str = "bfloat16", with_mtp: bool = False) -> int:
    layers = len(cfg.attention_layers) + (cfg.mtp_num_hidden_layers if with_mtp else 0)
    return layers * kv_bytes_per_token(cfg, kv_dtype)


@dataclass(frozen=True)
class GdnStateBytes:
    conv: int  # last K-1 pre-conv inputs, [conv_dim, K-1]
    recurrent: int  # S, [HV, dk, dv], always fp32

    @property
    def total(self) -> int:
        return self.conv + self.recurrent


def gdn_state_bytes_per_layer(cfg: Qwen35Config, conv_dtype: str = "bfloat16") -> GdnStateBytes:
    conv = cfg.conv_dim * (cfg.linear_conv_kernel_dim - 1) * dtype_bytes(conv_dtype)
    rec = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4
    return GdnStateBytes(conv=conv, recurrent=rec)


def gdn_state_bytes_per_sequence(cfg: Qwen35Config, conv_dtype: str = "bfloat16") -> int:
    """The whole fixed-size (position-independent) state of one sequence: every GDN layer."""
    return len(cfg.linear_layers) * gdn_state_bytes_per_layer(cfg, conv_dtype).total


def kv_pages_for_tokens(tokens: int, page_size: int) -> int:
    """Pages needed to hold `tokens` positions; ceil division, 0 tokens need 0 pages.

    pre: tokens >= 0 and page_size > 0
    post: __return__ * page_size >= tokens
    post: __return__ == 0 or (__return__ - 1) * page_size < tokens
    """
    if tokens < 0 or page_size <= 0:
        raise ValueError(f"tokens={tokens} must be >= 0 and page_size={page_size} > 0")
    return -(-tokens // page_size)


__all__ = ["FULL", "MTP", "GdnStateBytes", "dtype_bytes", "gdn_state_bytes_per_layer", "gdn_state_bytes_per_sequence",
           "kv_bytes_per_token", "kv_bytes_per_token_all_layers", "kv_pages_for_tokens", "param_bytes",
           "weight_bytes", "weight_bytes_per_layer"]
