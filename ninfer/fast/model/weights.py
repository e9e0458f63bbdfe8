"""Resident device weights of the fast model, fused so each sublayer runs one input GEMM.

Fusions (rows concatenated along the output dim, so the GEMM output splits into column views):
    GDN        in_proj = [in_proj_qkv | in_proj_z | in_proj_b | in_proj_a]      [C + HV*dv + 2*HV, H]
    attention  qkv     = [q_proj (query/gate per head) | k_proj | v_proj]        [2*nh*d + 2*nkv*d, H]
    dense FFN  gate_up = [gate_proj | up_proj]                                   [2*I, H]
    MoE        router  = [gate | shared_expert_gate]                             [E + 1, H] (E without a shared expert)
               shared_gate_up = [shared gate_proj | shared up_proj]             [2*Is, H]
The fused tensors hold exactly the logical parameters' bytes, so ``capacity.weight_bytes`` plans them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ninfer.models.qwen3_5.config import FULL, Qwen35Config
from ninfer.models.qwen3_5.params import MTP, TEXT, logical_parameters

Source = Callable[[str], torch.Tensor]


@dataclass
class GdnWeights:
    in_proj: torch.Tensor
    conv: torch.Tensor  # [C, K]
    A_log: torch.Tensor  # [HV] fp32
    dt_bias: torch.Tensor  # [HV] fp32
    norm: torch.Tensor  # [dv], a plain (not 1+w) weight
    out_proj: torch.Tensor


@dataclass
class AttnWeights:
    qkv: torch.Tensor
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    o_proj: torch.Tensor


@dataclass
class FfnWeights:
    gate_up: torch.Tensor | None = None  # dense
    down: torch.Tensor | None = None
    router: torch.Tensor | None = None  # MoE
    experts_gate_up: torch.Tensor | None = None  # [E, 2*Im, H]
    experts_down: torch.Tensor | None = None  # [E, H, Im]
    shared_gate_up: torch.Tensor | None = None
    shared_down: torch.Tensor | None = None


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    mixer: GdnWeights | AttnWeights
    ffn: FfnWeights


@dataclass
class MtpWeights:
    """The MTP head (``mtp.*``): u = fc([norm_emb(Embed[x]) | norm_hid(h)]), one full-attention decoder layer,
    the final norm; embedding and lm_head are the target's."""
    norm_embedding: torch.Tensor  # [H]
    norm_hidden: torch.Tensor  # [H]
    fc: torch.Tensor  # [H, 2H], embedding half first
    layer: LayerWeights
    norm: torch.Tensor  # [H]


@dataclass
class FastWeights:
    embed: torch.Tensor  # [V, H]
    lm_head: torch.Tensor  # [V, H]; the embedding itself when tied
    final_norm: torch.Tensor
    layers: list[LayerWeights]
    mtp: MtpWeights | None = None

    @property
    def nbytes(self) -> int:
        seen: dict[int, int] = {}
        for t in _tensors(self):
            seen[t.data_ptr()] = t.numel() * t.element_size()
        return sum(seen.values())


def _tensors(w: FastWeights):
    yield from (w.embed, w.lm_head, w.final_norm)
    layers = list(w.layers)
    if w.mtp is not None:
        yield from (w.mtp.norm_embedding, w.mtp.norm_hidden, w.mtp.fc, w.mtp.norm)
        layers.append(w.mtp.layer)
    for lw in layers:
        for part in (lw, lw.mixer, lw.ffn):
            yield from (t for t in vars(part).values() if isinstance(t, torch.Tensor))


def _fused(src: Source, specs: dict, names: list[str], dtype: torch.dtype, device) -> torch.Tensor:
    """Concatenate 2-D parameters along rows into one tensor allocated up front from the parameter table, reading
    one source tensor at a time (a source that makes tensors on demand never holds more than one extra)."""
    rows = [specs[n].shape[0] for n in names]
    out = torch.empty(sum(rows), specs[names[0]].shape[1], dtype=dtype, device=device)
    r = 0
    for n, k in zip(names, rows):
        out[r:r + k].copy_(src(n))
        r += k
    return out


def _one(src: Source, name: str, dtype: torch.dtype, device) -> torch.Tensor:
    return src(name).to(device=device, dtype=dtype).contiguous()


def _gdn(src: Source, specs: dict, p: str, cfg: Qwen35Config, dtype: torch.dtype, device) -> GdnWeights:
    names = [f"{p}.in_proj_qkv.weight", f"{p}.in_proj_z.weight", f"{p}.in_proj_b.weight", f"{p}.in_proj_a.weight"]
    K = cfg.linear_conv_kernel_dim
    return GdnWeights(
        in_proj=_fused(src, specs, names, dtype, device),
        conv=_one(src, f"{p}.conv1d.weight", dtype, device).reshape(cfg.conv_dim, K),
        A_log=_one(src, f"{p}.A_log", torch.float32, device),
        dt_bias=_one(src, f"{p}.dt_bias", torch.float32, device),
        norm=_one(src, f"{p}.norm.weight", dtype, device),
        out_proj=_one(src, f"{p}.out_proj.weight", dtype, device))


def _attn(src: Source, specs: dict, p: str, dtype: torch.dtype, device) -> AttnWeights:
    names = [f"{p}.q_proj.weight", f"{p}.k_proj.weight", f"{p}.v_proj.weight"]
    return AttnWeights(qkv=_fused(src, specs, names, dtype, device),
                       q_norm=_one(src, f"{p}.q_norm.weight", dtype, device),
                       k_norm=_one(src, f"{p}.k_norm.weight", dtype, device),
                       o_proj=_one(src, f"{p}.o_proj.weight", dtype, device))


def _ffn(src: Source, specs: dict, p: str, cfg: Qwen35Config, dtype: torch.dtype, device) -> FfnWeights:
    if not cfg.is_moe:
        return FfnWeights(gate_up=_fused(src, specs, [f"{p}.gate_proj.weight", f"{p}.up_proj.weight"], dtype, device),
                          down=_one(src, f"{p}.down_proj.weight", dtype, device))
    shared = cfg.shared_expert_intermediate_size > 0
    router = [f"{p}.gate.weight"] + ([f"{p}.shared_expert_gate.weight"] if shared else [])
    w = FfnWeights(router=_fused(src, specs, router, dtype, device),
                   experts_gate_up=_one(src, f"{p}.experts.gate_up_proj", dtype, device),
                   experts_down=_one(src, f"{p}.experts.down_proj", dtype, device))
    if shared:
        se = f"{p}.shared_expert"
        w.shared_gate_up = _fused(src, specs, [f"{se}.gate_proj.weight", f"{se}.up_proj.weight"], dtype, device)
        w.shared_down = _one(src, f"{se}.down_proj.weight", dtype, device)
    return w


def _layer(src: Source, specs: dict, p: str, kind: str, cfg: Qwen35Config, dtype: torch.dtype, device
           ) -> LayerWeights:
    mixer = (_attn(src, specs, f"{p}.self_attn", dtype, device) if kind == FULL
             else _gdn(src, specs, f"{p}.linear_attn", cfg, dtype, device))
    return LayerWeights(input_norm=_one(src, f"{p}.input_layernorm.weight", dtype, device),
                        post_norm=_one(src, f"{p}.post_attention_layernorm.weight", dtype, device),
                        mixer=mixer, ffn=_ffn(src, specs, f"{p}.mlp", cfg, dtype, device))


def _mtp(src: Source, specs: dict, cfg: Qwen35Config, dtype: torch.dtype, device) -> MtpWeights:
    return MtpWeights(norm_embedding=_one(src, "mtp.pre_fc_norm_embedding.weight", dtype, device),
                      norm_hidden=_one(src, "mtp.pre_fc_norm_hidden.weight", dtype, device),
                      fc=_one(src, "mtp.fc.weight", dtype, device),
                      layer=_layer(src, specs, "mtp.layers.0", FULL, cfg, dtype, device),
                      norm=_one(src, "mtp.norm.weight", dtype, device))


def load_fast_weights(cfg: Qwen35Config, src: Source, dtype: torch.dtype, device, mtp: bool = False) -> FastWeights:
    """Build the resident weights from ``src(logical_name) -> tensor`` (any device/dtype; cast and copied here).
    ``A_log`` and ``dt_bias`` stay fp32; a tied lm_head is the embedding tensor itself. ``mtp`` also loads the
    MTP head (one layer: the fast Program drafts with ``mtp.layers.0``)."""
    specs = logical_parameters(cfg, (TEXT, MTP) if mtp else (TEXT,))
    layers = [_layer(src, specs, f"layers.{i}", kind, cfg, dtype, device) for i, kind in enumerate(cfg.layer_types)]
    embed = _one(src, "embed_tokens.weight", dtype, device)
    lm_head = embed if cfg.tie_word_embeddings else _one(src, "lm_head.weight", dtype, device)
    return FastWeights(embed=embed, lm_head=lm_head, final_norm=_one(src, "norm.weight", dtype, device), layers=layers,
                       mtp=_mtp(src, specs, cfg, dtype, device) if mtp else None)
