"""The RoPE fields of a Qwen3.5 text config, read with HF transformers' semantics (its `RotaryEmbeddingConfigMixin`
and `Qwen3_5TextRotaryEmbedding`), so a config transformers loads and runs is read the same way here.

- ``rope_scaling`` (old name), when present and non-empty, replaces ``rope_parameters`` whole; ``rope_theta`` and
  ``partial_rotary_factor`` inside it win over the top-level fields, which win over the defaults (10000.0, 0.25).
- ``rope_type`` falls back to the old ``type`` key, then ``default``; ``mrope`` is read as ``default`` (text
  positions are 1D).
- ``mrope_section`` defaults to [11, 11, 10] and is never checked against the rotary dimension: transformers'
  interleaved layout takes frequency ``i`` from the H grid when ``i % 3 == 1`` and ``i < 3 * section[1]``, from W
  when ``i % 3 == 2`` and ``i < 3 * section[2]``, else from T, and slicing truncates at the rotary width. With
  text-only positions the three grids are equal, so any section reduces to 1D RoPE. It needs three entries
  (transformers indexes sections 1 and 2 on every forward). ``mrope_interleaved`` is stored and, as in
  transformers, not read.
- Scaled RoPE: ``linear``, ``yarn``, ``llama3`` and ``proportional`` change the frequencies once, at load, and are
  supported (the reference Program computes them, `ninfer.reference.rope`). ``dynamic`` and ``longrope`` are
  refused: transformers recomputes their frequencies from the longest position of each forward call, which a
  chunked, cached engine cannot reproduce.
"""

from __future__ import annotations

from typing import Any, Mapping

DEFAULT_THETA = 10000.0  # RotaryEmbeddingConfigMixin.default_theta
DEFAULT_PARTIAL_ROTARY_FACTOR = 0.25  # Qwen3_5TextConfig.__post_init__
DEFAULT_MROPE_SECTION = (11, 11, 10)  # Qwen3_5TextRotaryEmbedding
STATIC_ROPE_TYPES = ("default", "linear", "yarn", "llama3", "proportional")
REFUSED_ROPE_TYPES = ("dynamic", "longrope")
# The scaling parameters each type reads (transformers' `_validate_<type>_rope_parameters`), required first.
_REQUIRED = {"linear": ("factor",), "yarn": ("factor", "original_max_position_embeddings"),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
             "proportional": (), "default": ()}
_OPTIONAL = {"yarn": ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"),
             "proportional": ("factor",)}
# Types whose original_max_position_embeddings defaults to max_position_embeddings (standardize_rope_params).
_TAKES_ORIGINAL_MAX = ("llama3", "yarn", "longrope")


def _error(field: str, message: str) -> Exception:
    from .config import ConfigError

    return ConfigError(field, message)


def rope_fields(text: Mapping[str, Any], max_position_embeddings: int) -> dict[str, Any]:
    """Qwen35Config keyword arguments for RoPE from an HF text config dict."""
    params = dict(text.get("rope_scaling") or text.get("rope_parameters") or {})
    if any(key in ("linear_attention", "full_attention") for key in params):
        raise _error("rope_parameters", "per-layer-type RoPE parameters are not read by Qwen3.5 (transformers fails "
                                        "on them too)")
    params.setdefault("rope_theta", text.get("rope_theta", DEFAULT_THETA))
    params.setdefault("partial_rotary_factor", text.get("partial_rotary_factor", DEFAULT_PARTIAL_ROTARY_FACTOR))
    rope_type = params.get("rope_type", params.get("type", "default"))
    rope_type = "default" if rope_type == "mrope" else rope_type
    if rope_type in REFUSED_ROPE_TYPES:
        raise _error("rope_parameters.rope_type", f"{rope_type!r} is not supported: its frequencies depend on the "
                                                  "longest position of each forward call")
    if rope_type not in STATIC_ROPE_TYPES:
        raise _error("rope_parameters.rope_type", f"unknown RoPE type {rope_type!r}; expected one of "
                                                  f"{STATIC_ROPE_TYPES}")
    if rope_type in _TAKES_ORIGINAL_MAX:
        params.setdefault("original_max_position_embeddings", text.get("original_max_position_embeddings",
                                                                       max_position_embeddings))
    missing = [k for k in _REQUIRED[rope_type] if k not in params]
    if missing:
        raise _error(f"rope_parameters.{missing[0]}", f"missing for rope_type {rope_type!r}")
    if rope_type == "yarn" and params["factor"] is None:  # transformers' DeepSeek-V3 rule
        params["factor"] = max_position_embeddings / params["original_max_position_embeddings"]
    wanted = _REQUIRED[rope_type] + _OPTIONAL.get(rope_type, ())
    scaling = tuple((k, params[k]) for k in wanted if params.get(k) is not None)
    section = params.get("mrope_section", DEFAULT_MROPE_SECTION)
    if not isinstance(section, (list, tuple)) or len(section) < 3 or not all(isinstance(s, int) for s in section):
        raise _error("rope_parameters.mrope_section", f"{section!r} must list at least three integers (T, H, W)")
    return dict(rope_theta=float(params["rope_theta"]), partial_rotary_factor=float(params["partial_rotary_factor"]),
                rope_type=rope_type, rope_scaling=scaling, mrope_section=tuple(section),
                mrope_interleaved=bool(params.get("mrope_interleaved", True)))


def rope_pairs(rope_type: str, head_dim: int, partial_rotary_factor: float) -> int:
    """How many (i, i + width/2) dimension pairs rotate: transformers' ``len(inv_freq)``. ``int(head_dim *
    factor)`` may be odd; its frequencies are then ``arange(0, dim, 2)``, one more than dim // 2."""
    if rope_type == "proportional":
        return head_dim // 2  # the unrotated tail is zero frequencies over the full head
    return (int(head_dim * partial_rotary_factor) + 1) // 2


def check_rope(rope_type: str, head_dim: int, partial_rotary_factor: float) -> None:
    """What transformers itself fails on: a rotated width beyond the head, or an odd yarn dimension."""
    dim = int(head_dim * partial_rotary_factor)
    if dim <= 0:
        raise _error("partial_rotary_factor", f"head_dim*factor={head_dim * partial_rotary_factor} leaves no rotary "
                                              "dimension")
    width = 2 * rope_pairs(rope_type, head_dim, partial_rotary_factor)
    if width > head_dim:
        raise _error("partial_rotary_factor", f"a rotary width of {width} exceeds head_dim={head_dim}")
    if rope_type == "yarn" and dim % 2:
        raise _error("partial_rotary_factor", f"yarn needs an even rotary dimension, got {dim} (transformers' yarn "
                                              "ramp has dim // 2 entries)")
