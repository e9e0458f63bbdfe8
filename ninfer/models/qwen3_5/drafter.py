"""DrafterConfig: a published DFlash / DFlash2 block-diffusion drafter's config, read once from its HF
``config.json``, checked against the target it drafts for, and its logical parameters.

The published layout (z-lab's ``dflash/model.py``; DFlash2 adds the convolution and selector modules):

    architectures ["DFlashDraftModel"] or ["DFlash2DraftModel"], a Qwen3 geometry (hidden_size, layers, heads,
    head_dim, intermediate_size, rms_norm_eps, rope_theta), num_target_layers, block_size, and
    dflash_config {target_layer_ids, mask_token_id, conv_kernel_size, conv_group_size, selector_rank,
    selector_top_k} (block_size may also sit there)

and tensors without ``embed_tokens`` or ``lm_head`` (the drafter uses the target's). Inside an artifact the
drafter's bindings are the published names under ``dflash.`` with feature ``dflash`` or ``dflash2``, and this
config travels as the resource ``drafter/config.json`` (docs/artifact-format.md).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any, Mapping

from .config import ConfigError, Qwen35Config
from .params import ParamSpec


class DrafterKind(enum.StrEnum):
    """Which drafter a config describes; its value is also the artifact feature of the drafter's bindings."""
    DFLASH = "dflash"
    DFLASH2 = "dflash2"


ARCHITECTURES = {"DFlashDraftModel": DrafterKind.DFLASH, "DFlash2DraftModel": DrafterKind.DFLASH2}
PREFIX = "dflash."
RESOURCE = "drafter/config.json"


@dataclass(frozen=True)
class DrafterConfig:
    kind: DrafterKind
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int | None  # None: the config does not say (the target's is used)
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    block_size: int
    mask_token_id: int
    attention_bias: bool = False
    sliding_window: int | None = None  # a bound on the context the drafter attends to (its published window)
    conv_kernel_size: int = 0  # DFlash2 only
    conv_group_size: int = 0
    selector_rank: int = 0
    selector_top_k: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.kind, DrafterKind):
            raise ConfigError("kind", f"must be a DrafterKind, got {self.kind!r} (parse it with from_dict/from_hf)")
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                     "intermediate_size", "num_target_layers"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ConfigError(name, f"must be a positive integer, got {getattr(self, name)!r}")
        if not isinstance(self.block_size, int) or self.block_size < 2:
            raise ConfigError("block_size", f"must be an integer >= 2, got {self.block_size!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError("num_key_value_heads", f"{self.num_key_value_heads} does not divide "
                                                     f"num_attention_heads={self.num_attention_heads}")
        if self.head_dim % 2:
            raise ConfigError("head_dim", f"must be even (RoPE over the whole head), got {self.head_dim}")
        if not self.target_layer_ids:
            raise ConfigError("dflash_config.target_layer_ids", "must name at least one target layer")
        if self.kind is DrafterKind.DFLASH2:
            for name in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
                if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                    raise ConfigError(f"dflash_config.{name}", f"a DFlash2 drafter needs a positive integer, got "
                                                              f"{getattr(self, name)!r}")
            if self.hidden_size % self.conv_group_size:
                raise ConfigError("dflash_config.conv_group_size", f"{self.conv_group_size} does not divide "
                                                                   f"hidden_size={self.hidden_size}")

    @property
    def conv_groups(self) -> int:
        return self.hidden_size // self.conv_group_size if self.kind is DrafterKind.DFLASH2 else 0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["kind"] = self.kind.value
        d["target_layer_ids"] = list(self.target_layer_ids)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "DrafterConfig":
        """Inverse of :meth:`to_dict` (the artifact resource's form, not HF's)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(unknown[0], "unknown field in a ninfer drafter config")
        kind = d.get("kind")
        if kind not in {k.value for k in DrafterKind}:
            raise ConfigError("architectures", f"unknown drafter kind {kind!r}")
        return cls(**{**d, "kind": DrafterKind(kind), "target_layer_ids": tuple(d.get("target_layer_ids", ()))})

    @classmethod
    def from_hf(cls, raw: Mapping[str, Any]) -> "DrafterConfig":
        return from_hf(raw)

    def check_fits(self, target: Qwen35Config) -> None:
        """A drafter trained for another geometry cannot draft for `target`: ConfigError naming the field."""
        if self.hidden_size != target.hidden_size:
            raise ConfigError("hidden_size", f"the drafter works at {self.hidden_size}, the target's hidden size is "
                                             f"{target.hidden_size}")
        if self.vocab_size is not None and self.vocab_size != target.vocab_size:
            raise ConfigError("vocab_size", f"the drafter's vocabulary is {self.vocab_size}, the target's "
                                            f"{target.vocab_size}")
        if self.num_target_layers != target.num_hidden_layers:
            raise ConfigError("num_target_layers", f"the drafter was trained on a {self.num_target_layers}-layer "
                                                   f"target, this one has {target.num_hidden_layers}")
        bad = [i for i in self.target_layer_ids if not 0 <= i < target.num_hidden_layers]
        if bad:
            raise ConfigError("dflash_config.target_layer_ids", f"{bad} are not layers of the "
                                                                f"{target.num_hidden_layers}-layer target")
        if not 0 <= self.mask_token_id < target.vocab_size:
            raise ConfigError("dflash_config.mask_token_id", f"{self.mask_token_id} is outside the target's "
                                                             f"vocabulary of {target.vocab_size}")


def _int(raw: Mapping[str, Any], field: str, where: str = "") -> int:
    v = raw.get(field)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(where + field, f"must be an integer, got {v!r}")
    return v


def _rope_theta(raw: Mapping[str, Any]) -> float:
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        raise ConfigError("rope_scaling", f"drafters with {kind!r} RoPE are not supported (default only)")
    return float(params.get("rope_theta", raw.get("rope_theta", 1000000.0)))


def _causal(raw: Mapping[str, Any]) -> None:
    """The published rule (z-lab, vLLM): `is_causal` when given, else a sliding layer is causal. Block diffusion
    drafts are non-causal; a causal drafter is another model."""
    layers = raw.get("layer_types") or []
    declared = raw.get("is_causal")
    causal = any(t == "sliding_attention" for t in layers) if declared is None else bool(declared)
    if causal:
        raise ConfigError("is_causal", "a causal drafter is not a block-diffusion drafter (give is_causal false)")


def from_hf(raw: Mapping[str, Any]) -> DrafterConfig:
    """Parse a published drafter's ``config.json`` dict."""
    archs = raw.get("architectures") or []
    kinds = [ARCHITECTURES[a] for a in archs if a in ARCHITECTURES]
    if not kinds:
        raise ConfigError("architectures", f"{archs!r} names no drafter ({', '.join(ARCHITECTURES)})")
    extra = raw.get("dflash_config") or {}
    if not isinstance(extra, Mapping):
        raise ConfigError("dflash_config", f"must be an object, got {type(extra).__name__}")
    _causal(raw)
    n = _int(raw, "num_hidden_layers")
    heads = _int(raw, "num_attention_heads")
    hidden = _int(raw, "hidden_size")
    head_dim = raw.get("head_dim") or hidden // heads
    ids = extra.get("target_layer_ids")
    if ids is None:  # the published default: spread from layer 1 to layer L-3
        L = _int(raw, "num_target_layers")
        ids = [L // 2] if n == 1 else [int(round(1 + i * (L - 4) / (n - 1))) for i in range(n)]
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ConfigError("dflash_config.target_layer_ids", f"must be a list of layer indices, got {ids!r}")
    block = extra.get("block_size", raw.get("block_size"))
    if "mask_token_id" not in extra:
        raise ConfigError("dflash_config.mask_token_id", "required (the token the block's masked slots carry)")
    window = raw.get("sliding_window") if any(t == "sliding_attention" for t in raw.get("layer_types") or []) else None
    d2 = {k: extra.get(k, 0) for k in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")}
    return DrafterConfig(
        kind=kinds[0], hidden_size=hidden, num_hidden_layers=n, num_attention_heads=heads,
        num_key_value_heads=raw.get("num_key_value_heads", heads), head_dim=head_dim,
        intermediate_size=_int(raw, "intermediate_size"), rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(raw), vocab_size=raw.get("vocab_size"),
        num_target_layers=_int(raw, "num_target_layers"), target_layer_ids=tuple(ids), block_size=block,
        mask_token_id=_int(extra, "mask_token_id", "dflash_config."), attention_bias=bool(raw.get("attention_bias")),
        sliding_window=window, **(d2 if kinds[0] is DrafterKind.DFLASH2 else {}))


def drafter_parameters(cfg: DrafterConfig) -> dict[str, ParamSpec]:
    """Every logical parameter of the drafter (names under ``dflash.``), in execution order."""
    H, d, I = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    nh, nkv, f = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.kind.value
    specs = [ParamSpec("fc.weight", (H, len(cfg.target_layer_ids) * H), f, "linear"),
             ParamSpec("hidden_norm.weight", (H,), f, "norm")]
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}"
        specs += [ParamSpec(f"{p}.input_layernorm.weight", (H,), f, "norm"),
                  ParamSpec(f"{p}.self_attn.q_proj.weight", (nh * d, H), f, "linear"),
                  ParamSpec(f"{p}.self_attn.k_proj.weight", (nkv * d, H), f, "linear"),
                  ParamSpec(f"{p}.self_attn.v_proj.weight", (nkv * d, H), f, "linear"),
                  ParamSpec(f"{p}.self_attn.o_proj.weight", (H, nh * d), f, "linear")]
        if cfg.attention_bias:
            specs += [ParamSpec(f"{p}.self_attn.{n}_proj.bias", (s,), f, "linear")
                      for n, s in (("q", nh * d), ("k", nkv * d), ("v", nkv * d), ("o", H))]
        specs += [ParamSpec(f"{p}.self_attn.q_norm.weight", (d,), f, "norm"),
                  ParamSpec(f"{p}.self_attn.k_norm.weight", (d,), f, "norm"),
                  ParamSpec(f"{p}.post_attention_layernorm.weight", (H,), f, "norm"),
                  ParamSpec(f"{p}.mlp.gate_proj.weight", (I, H), f, "linear"),
                  ParamSpec(f"{p}.mlp.up_proj.weight", (I, H), f, "linear"),
                  ParamSpec(f"{p}.mlp.down_proj.weight", (H, I), f, "linear")]
        # base kernel [prepare/finish, taps, H]; one projection gives both sides' deltas
        if cfg.kind is DrafterKind.DFLASH2:
            for conv in ("attention_conv", "mlp_conv"):
                specs += [ParamSpec(f"{p}.{conv}.base_kernel", (2, cfg.conv_kernel_size, H), f, "conv"),
                          ParamSpec(f"{p}.{conv}.kernel_projection.weight",
                                    (2 * cfg.conv_kernel_size * cfg.conv_groups, H), f, "linear")]
    specs.append(ParamSpec("norm.weight", (H,), f, "norm"))
    if cfg.kind is DrafterKind.DFLASH2:
        V, r = cfg.vocab_size, cfg.selector_rank
        if V is None:
            raise ConfigError("vocab_size", "a DFlash2 drafter's selector codebooks need the vocabulary size")
        specs += [ParamSpec("candidate_selector.hidden_projection.weight", (r, H), f, "linear"),
                  ParamSpec("candidate_selector.predecessor_codebook", (V, r), f, "embedding"),
                  ParamSpec("candidate_selector.successor_codebook", (V, r), f, "embedding")]
    return {PREFIX + s.name: dataclasses.replace(s, name=PREFIX + s.name) for s in specs}
