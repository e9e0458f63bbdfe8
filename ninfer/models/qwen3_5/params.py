"""Logical parameters of a Qwen3.5 text decoder (and its MTP head): names, shapes, feature group.

Logical names are the HF ``Qwen3_5ForCausalLM`` state-dict names without the ``model.`` prefix
(``layers.3.self_attn.q_proj.weight``), plus ``lm_head.weight`` and ``mtp.*``. MoE experts are always
the fused 3-D form (``mlp.experts.gate_up_proj`` [E, 2*Im, H], ``mlp.experts.down_proj`` [E, H, Im]);
the converter fuses per-expert checkpoints into it. This table is the contract between the converter,
the artifact binder and both Programs.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import FULL, Qwen35Config
from .vision_config import VisionConfig

TEXT = "text"
MTP = "mtp"
VISION = "vision"

# Kinds decide numeric policy: "fp32" parameters are kept (and computed) in fp32 whatever the source.
KINDS = ("embedding", "linear", "norm", "conv", "fp32", "router", "experts", "vision")


@dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    feature: str
    kind: str

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def _attention(cfg: Qwen35Config, prefix: str, feature: str) -> list[ParamSpec]:
    H, d = cfg.hidden_size, cfg.head_dim
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    p = f"{prefix}.self_attn"
    return [
        ParamSpec(f"{p}.q_proj.weight", (2 * nh * d, H), feature, "linear"),  # query and gate, per-head interleaved
        ParamSpec(f"{p}.k_proj.weight", (nkv * d, H), feature, "linear"),
        ParamSpec(f"{p}.v_proj.weight", (nkv * d, H), feature, "linear"),
        ParamSpec(f"{p}.o_proj.weight", (H, nh * d), feature, "linear"),
        ParamSpec(f"{p}.q_norm.weight", (d,), feature, "norm"),
        ParamSpec(f"{p}.k_norm.weight", (d,), feature, "norm"),
    ] + ([  # attention_bias: transformers' q/k/v/o Linear layers then carry biases
        ParamSpec(f"{p}.q_proj.bias", (2 * nh * d,), feature, "linear"),
        ParamSpec(f"{p}.k_proj.bias", (nkv * d,), feature, "linear"),
        ParamSpec(f"{p}.v_proj.bias", (nkv * d,), feature, "linear"),
        ParamSpec(f"{p}.o_proj.bias", (H,), feature, "linear"),
    ] if cfg.attention_bias else [])


def _linear_attention(cfg: Qwen35Config, prefix: str) -> list[ParamSpec]:
    H, HV, dv, K = cfg.hidden_size, cfg.linear_num_value_heads, cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim
    p = f"{prefix}.linear_attn"
    return [
        ParamSpec(f"{p}.in_proj_qkv.weight", (cfg.conv_dim, H), TEXT, "linear"),
        ParamSpec(f"{p}.in_proj_z.weight", (HV * dv, H), TEXT, "linear"),
        ParamSpec(f"{p}.in_proj_b.weight", (HV, H), TEXT, "linear"),
        ParamSpec(f"{p}.in_proj_a.weight", (HV, H), TEXT, "linear"),
        ParamSpec(f"{p}.conv1d.weight", (cfg.conv_dim, 1, K), TEXT, "conv"),
        ParamSpec(f"{p}.dt_bias", (HV,), TEXT, "fp32"),
        ParamSpec(f"{p}.A_log", (HV,), TEXT, "fp32"),
        ParamSpec(f"{p}.norm.weight", (dv,), TEXT, "norm"),
        ParamSpec(f"{p}.out_proj.weight", (H, HV * dv), TEXT, "linear"),
    ]


def _ffn(cfg: Qwen35Config, prefix: str, feature: str) -> list[ParamSpec]:
    H = cfg.hidden_size
    p = f"{prefix}.mlp"
    if not cfg.is_moe:
        I = cfg.intermediate_size
        return [
            ParamSpec(f"{p}.gate_proj.weight", (I, H), feature, "linear"),
            ParamSpec(f"{p}.up_proj.weight", (I, H), feature, "linear"),
            ParamSpec(f"{p}.down_proj.weight", (H, I), feature, "linear"),
        ]
    E, Im, Is = cfg.num_experts, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
    specs = [
        ParamSpec(f"{p}.gate.weight", (E, H), feature, "router"),
        ParamSpec(f"{p}.experts.gate_up_proj", (E, 2 * Im, H), feature, "experts"),
        ParamSpec(f"{p}.experts.down_proj", (E, H, Im), feature, "experts"),
    ]
    if Is > 0:
        specs += [
            ParamSpec(f"{p}.shared_expert.gate_proj.weight", (Is, H), feature, "linear"),
            ParamSpec(f"{p}.shared_expert.up_proj.weight", (Is, H), feature, "linear"),
            ParamSpec(f"{p}.shared_expert.down_proj.weight", (H, Is), feature, "linear"),
            ParamSpec(f"{p}.shared_expert_gate.weight", (1, H), feature, "linear"),
        ]
    return specs


def _decoder_layer(cfg: Qwen35Config, prefix: str, layer_type: str, feature: str) -> list[ParamSpec]:
    H = cfg.hidden_size
    mixer = _attention(cfg, prefix, feature) if layer_type == FULL else _linear_attention(cfg, prefix)
    return [
        ParamSpec(f"{prefix}.input_layernorm.weight", (H,), feature, "norm"),
        *mixer,
        ParamSpec(f"{prefix}.post_attention_layernorm.weight", (H,), feature, "norm"),
        *_ffn(cfg, prefix, feature),
    ]


def text_parameters(cfg: Qwen35Config) -> list[ParamSpec]:
    """Every logical parameter of the main decoder, in execution order."""
    V, H = cfg.vocab_size, cfg.hidden_size
    specs = [ParamSpec("embed_tokens.weight", (V, H), TEXT, "embedding")]
    for i, t in enumerate(cfg.layer_types):
        specs += _decoder_layer(cfg, f"layers.{i}", t, TEXT)
    specs.append(ParamSpec("norm.weight", (H,), TEXT, "norm"))
    # Tied checkpoints bind lm_head to the embedding's object; the logical parameter exists either way.
    specs.append(ParamSpec("lm_head.weight", (V, H), TEXT, "embedding"))
    return specs


def mtp_parameters(cfg: Qwen35Config) -> list[ParamSpec]:
    """The MTP head: two pre-fc norms, fc [H, 2H], full-attention decoder layers, final norm."""
    H = cfg.hidden_size
    specs = [
        ParamSpec("mtp.pre_fc_norm_embedding.weight", (H,), MTP, "norm"),
        ParamSpec("mtp.pre_fc_norm_hidden.weight", (H,), MTP, "norm"),
        ParamSpec("mtp.fc.weight", (H, 2 * H), MTP, "linear"),
    ]
    for j in range(cfg.mtp_num_hidden_layers):
        specs += _decoder_layer(cfg, f"mtp.layers.{j}", FULL, MTP)
    specs.append(ParamSpec("mtp.norm.weight", (H,), MTP, "norm"))
    return specs


def vision_parameters(v: VisionConfig) -> list[ParamSpec]:
    """Every logical parameter of the tower, in execution order (HF names under ``model.visual.``). All are of kind
    ``vision``: stored as the source gives them, never quantized."""
    Hv, I, m = v.hidden_size, v.intermediate_size, v.merge_unit * v.hidden_size

    def linear(name: str, out: int, inp: int) -> list[ParamSpec]:
        return [ParamSpec(f"{name}.weight", (out, inp), VISION, "vision"), ParamSpec(f"{name}.bias", (out,), VISION, "vision")]

    def layer_norm(name: str, n: int) -> list[ParamSpec]:
        return [ParamSpec(f"{name}.weight", (n,), VISION, "vision"), ParamSpec(f"{name}.bias", (n,), VISION, "vision")]

    specs = [ParamSpec("visual.patch_embed.proj.weight",
                       (Hv, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size), VISION, "vision"),
             ParamSpec("visual.patch_embed.proj.bias", (Hv,), VISION, "vision"),
             ParamSpec("visual.pos_embed.weight", (v.num_position_embeddings, Hv), VISION, "vision")]
    for i in range(v.depth):
        p = f"visual.blocks.{i}"
        specs += [*layer_norm(f"{p}.norm1", Hv), *layer_norm(f"{p}.norm2", Hv), *linear(f"{p}.attn.qkv", 3 * Hv, Hv),
                  *linear(f"{p}.attn.proj", Hv, Hv), *linear(f"{p}.mlp.linear_fc1", I, Hv),
                  *linear(f"{p}.mlp.linear_fc2", Hv, I)]
    specs += [*layer_norm("visual.merger.norm", Hv), *linear("visual.merger.linear_fc1", m, m),
              *linear("visual.merger.linear_fc2", v.out_hidden_size, m)]
    return specs


def logical_parameters(cfg: Qwen35Config, features: tuple[str, ...] = (TEXT, MTP)) -> dict[str, ParamSpec]:
    specs: list[ParamSpec] = []
    if TEXT in features:
        specs += text_parameters(cfg)
    if MTP in features and cfg.mtp_num_hidden_layers > 0:
        specs += mtp_parameters(cfg)
    if VISION in features and cfg.vision is not None:
        specs += vision_parameters(cfg.vision)
    return {s.name: s for s in specs}


def layer_of(name: str) -> int | None:
    """Main-decoder layer index of a logical parameter, or None for global / MTP parameters."""
    parts = name.split(".")
    if parts[0] == "layers":
        return int(parts[1])
    return None
