"""Resident device weights of the fast model, fused so each sublayer runs one input GEMM.

Fusions (rows concatenated along the output dim, so the GEMM output splits into column views):
    GDN        in_proj = [in_proj_qkv | in_proj_z | in_proj_b | in_proj_a]      [C + HV*dv + 2*HV, H]
    attention  qkv     = [q_proj (query/gate per head) | k_proj | v_proj]        [2*nh*d + 2*nkv*d, H]
    dense FFN  gate_up = [gate_proj | up_proj]                                   [2*I, H]
    MoE        router  = [gate | shared_expert_gate]                             [E + 1, H] (E without a shared expert)
               shared_gate_up = [shared gate_proj | shared up_proj]             [2*Is, H]
The fused tensors hold exactly the logical parameters' bytes, so ``capacity.weight_bytes`` plans them.

Quantized parameters (``quant(name)`` returns a ``QuantWeight``, docs/quantization.md) fuse the same way when their
kind and column blocking agree (``concat_rows``: the planes concatenated); a fused group that mixes dense and
quantized parts, or two kinds, becomes ``Segments`` run part by part; each int4 matrix is then re-laid out into the
decode GEMV's tile order (``fastgemv.to_tiles``, exact). A quantized model's plan counts ``FastWeights.nbytes``, the
bytes actually resident.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch

from ninfer.fast.ops.qlinear import QuantWeight, Segments, concat_rows, fusable
from ninfer.fast.ops.qlinear.fastgemv import to_tiles
from ninfer.fast.ops.qlinear.layout import a8_block, dequant_transient_bytes
from ninfer.models.qwen3_5.config import FULL, Qwen35Config
from ninfer.models.qwen3_5.params import MTP, TEXT, logical_parameters
from ninfer.pipeline import StagePlan

Source = Callable[[str], torch.Tensor]
# logical name -> the parameter's quantized device form, or None where it is dense
Quant = Callable[[str], "QuantWeight | None"]
# a projection: dense [N, K], quantized, or parts of both
Linear = "torch.Tensor | QuantWeight | Segments"


@dataclass
class GdnWeights:
    in_proj: Linear
    conv: torch.Tensor  # [C, K]
    A_log: torch.Tensor  # [HV] fp32
    dt_bias: torch.Tensor  # [HV] fp32
    norm: torch.Tensor  # [dv], a plain (not 1+w) weight
    out_proj: Linear


@dataclass
class AttnWeights:
    qkv: Linear
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    o_proj: Linear


@dataclass
class FfnWeights:
    gate_up: Linear | None = None  # dense
    down: Linear | None = None
    router: Linear | None = None  # MoE
    experts_gate_up: torch.Tensor | QuantWeight | None = None  # [E, 2*Im, H]
    experts_down: torch.Tensor | QuantWeight | None = None  # [E, H, Im]
    shared_gate_up: Linear | None = None
    shared_down: Linear | None = None


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
    # "quantization": "fp8" under a draft vocabulary N: the lm_head's first N rows in FP8 [N, H], the draft's head
    head: QuantWeight | None = None


@dataclass
class FastWeights:
    embed: torch.Tensor  # [V, H]
    lm_head: Linear  # [V, H]; the embedding itself when tied
    final_norm: torch.Tensor
    layers: list[LayerWeights]
    mtp: MtpWeights | None = None

    @property
    def nbytes(self) -> int:
        seen: dict[int, int] = {}
        for t in _tensors(self):
            seen[t.data_ptr()] = t.numel() * t.element_size()
        return sum(seen.values())

    def formats(self) -> dict[str, int]:
        """Resident bytes by representation ("bfloat16", "fp8_e4m3", "int4", ...), for the benchmarks' reports."""
        out: dict[str, int] = {}
        for w in _weights(self):
            if isinstance(w, QuantWeight):
                key, n = w.kind.value, w.nbytes
            else:
                key, n = str(w.dtype).removeprefix("torch."), w.numel() * w.element_size()
            out[key] = out.get(key, 0) + n
        return out


def quant_workspace_bytes(w: FastWeights, act_bytes: int) -> int:
    """The prefill transient of the quantized weights on top of the dense plan's workspace: the largest row chunk
    dequantized for one GEMM, or one layer's two expert stacks dequantized together."""
    best = 0
    for lw in w.layers:
        f = lw.ffn
        stacks = [s for s in (f.experts_gate_up, f.experts_down) if isinstance(s, QuantWeight)]
        best = max(best, sum(dequant_transient_bytes(s, act_bytes) for s in stacks))
    for q in _weights(w):
        if isinstance(q, QuantWeight) and len(q.shape) == 2:
            best = max(best, dequant_transient_bytes(q, act_bytes))
    return best


def has_a8_weights(w: FastWeights) -> bool:
    """Whether a weight takes the A8 GEMM above the decode GEMV's rows (its activations quantized to FP8 per row
    block, ``kernels.linear``): its numerics then depend on a call's row count, which padding a prefill piece to a
    graph bucket would change for a short piece."""
    return any(isinstance(q, QuantWeight) and a8_block(q) is not None for q in _weights(w))


def _weights(w: FastWeights):
    """Every resident weight (dense tensors, QuantWeights, and each part of a Segments), the tied lm_head once."""
    yield from (w.embed, w.final_norm) if w.lm_head is w.embed else (w.embed, w.lm_head, w.final_norm)
    layers = list(w.layers)
    if w.mtp is not None:
        yield from (w.mtp.norm_embedding, w.mtp.norm_hidden, w.mtp.fc, w.mtp.norm)
        if w.mtp.head is not None:
            yield w.mtp.head
        layers.append(w.mtp.layer)
    for lw in layers:
        yield from _layer_weights(lw)


def _layer_weights(lw: LayerWeights):
    for part in (lw, lw.mixer, lw.ffn):
        for t in vars(part).values():
            if isinstance(t, Segments):
                yield from t.parts
            elif isinstance(t, (torch.Tensor, QuantWeight)):
                yield t


def rank_nbytes(w: FastWeights, stages: StagePlan) -> list[int]:
    """Resident bytes per pipeline rank: its layers', rank 0 also the embedding, head, final norm and MTP head."""
    per = [sum(t.numel() * t.element_size() for i in r for q in _layer_weights(w.layers[i])
               for t in (q.tensors() if isinstance(q, QuantWeight) else (q,))) for r in stages.ranges()]
    per[0] += w.nbytes - sum(per)
    return per


def _tensors(w: FastWeights):
    for t in _weights(w):
        yield from t.tensors() if isinstance(t, QuantWeight) else (t,)


def _no_quant(name: str) -> None:
    return None


def _fused(src: Source, specs: dict, names: list[str], dtype: torch.dtype, device, quant: Quant = _no_quant):
    """The row concatenation of 2-D parameters: one dense tensor, one QuantWeight, or Segments of runs of each."""
    qs = [quant(n) for n in names]
    if all(q is None for q in qs):
        return _fused_dense(src, specs, names, dtype, device)
    if all(q is not None for q in qs) and fusable(qs):
        return to_tiles(concat_rows(qs))
    # runs of consecutive dense parts stay fused with each other, quantized parts stay alone
    parts, run = [], []
    for n, q in zip(names, qs):
        if q is None:
            run.append(n)
            continue
        if run:
            parts.append(_fused_dense(src, specs, run, dtype, device))
            run = []
        parts.append(to_tiles(q))
    if run:
        parts.append(_fused_dense(src, specs, run, dtype, device))
    return Segments(tuple(parts))


def _fused_dense(src: Source, specs: dict, names: list[str], dtype: torch.dtype, device) -> torch.Tensor:
    """Concatenate 2-D parameters along rows into one tensor allocated up front from the parameter table, reading
    one source tensor at a time (a source that makes tensors on demand never holds more than one extra)."""
    rows = [specs[n].shape[0] for n in names]
    out = torch.empty(sum(rows), specs[names[0]].shape[1], dtype=dtype, device=device)
    r = 0
    for n, k in zip(names, rows):
        out[r:r + k].copy_(src(n))
        r += k
    return out


def _one(src: Source, name: str, dtype: torch.dtype, device, quant: Quant = _no_quant):
    q = quant(name)
    return to_tiles(q) if q is not None else src(name).to(device=device, dtype=dtype).contiguous()


def _gdn(src: Source, specs: dict, p: str, cfg: Qwen35Config, dtype: torch.dtype, device, quant: Quant) -> GdnWeights:
    names = [f"{p}.in_proj_qkv.weight", f"{p}.in_proj_z.weight", f"{p}.in_proj_b.weight", f"{p}.in_proj_a.weight"]
    K = cfg.linear_conv_kernel_dim
    return GdnWeights(
        in_proj=_fused(src, specs, names, dtype, device, quant),
        conv=_one(src, f"{p}.conv1d.weight", dtype, device).reshape(cfg.conv_dim, K),
        A_log=_one(src, f"{p}.A_log", torch.float32, device),
        dt_bias=_one(src, f"{p}.dt_bias", torch.float32, device),
        norm=_one(src, f"{p}.norm.weight", dtype, device),
        out_proj=_one(src, f"{p}.out_proj.weight", dtype, device, quant))


def _attn(src: Source, specs: dict, p: str, dtype: torch.dtype, device, quant: Quant) -> AttnWeights:
    names = [f"{p}.q_proj.weight", f"{p}.k_proj.weight", f"{p}.v_proj.weight"]
    return AttnWeights(qkv=_fused(src, specs, names, dtype, device, quant),
                       q_norm=_one(src, f"{p}.q_norm.weight", dtype, device),
                       k_norm=_one(src, f"{p}.k_norm.weight", dtype, device),
                       o_proj=_one(src, f"{p}.o_proj.weight", dtype, device, quant))


def _ffn(src: Source, specs: dict, p: str, cfg: Qwen35Config, dtype: torch.dtype, device, quant: Quant) -> FfnWeights:
    if not cfg.is_moe:
        return FfnWeights(gate_up=_fused(src, specs, [f"{p}.gate_proj.weight", f"{p}.up_proj.weight"], dtype, device,
                                         quant),
                          down=_one(src, f"{p}.down_proj.weight", dtype, device, quant))
    shared = cfg.shared_expert_intermediate_size > 0
    router = [f"{p}.gate.weight"] + ([f"{p}.shared_expert_gate.weight"] if shared else [])
    w = FfnWeights(router=_fused(src, specs, router, dtype, device, quant),
                   experts_gate_up=_one(src, f"{p}.experts.gate_up_proj", dtype, device, quant),
                   experts_down=_one(src, f"{p}.experts.down_proj", dtype, device, quant))
    if shared:
        se = f"{p}.shared_expert"
        w.shared_gate_up = _fused(src, specs, [f"{se}.gate_proj.weight", f"{se}.up_proj.weight"], dtype, device,
                                  quant)
        w.shared_down = _one(src, f"{se}.down_proj.weight", dtype, device, quant)
    return w


def _layer(src: Source, specs: dict, p: str, kind: str, cfg: Qwen35Config, dtype: torch.dtype, device,
           quant: Quant = _no_quant) -> LayerWeights:
    mixer = (_attn(src, specs, f"{p}.self_attn", dtype, device, quant) if kind == FULL
             else _gdn(src, specs, f"{p}.linear_attn", cfg, dtype, device, quant))
    return LayerWeights(input_norm=_one(src, f"{p}.input_layernorm.weight", dtype, device),
                        post_norm=_one(src, f"{p}.post_attention_layernorm.weight", dtype, device),
                        mixer=mixer, ffn=_ffn(src, specs, f"{p}.mlp", cfg, dtype, device, quant))


def _mtp(src: Source, specs: dict, cfg: Qwen35Config, dtype: torch.dtype, device, quant: Quant) -> MtpWeights:
    return MtpWeights(norm_embedding=_one(src, "mtp.pre_fc_norm_embedding.weight", dtype, device),
                      norm_hidden=_one(src, "mtp.pre_fc_norm_hidden.weight", dtype, device),
                      fc=_one(src, "mtp.fc.weight", dtype, device, quant),
                      layer=_layer(src, specs, "mtp.layers.0", FULL, cfg, dtype, device, quant),
                      norm=_one(src, "mtp.norm.weight", dtype, device))


def load_fast_weights(cfg: Qwen35Config, src: Source, dtype: torch.dtype, device, mtp: bool = False,
                      quant: Quant | None = None, stages: StagePlan | None = None,
                      mtp_quant: Quant | None = None) -> FastWeights:
    """Build the resident weights from ``src(logical_name) -> tensor`` (any device/dtype; cast and copied here),
    or ``quant(logical_name)`` where that returns a QuantWeight (text projections, experts and an untied lm_head;
    the MTP head is dense, its stored quantization dequantized, unless ``mtp_quant`` gives its projections: the
    draft's FP8, `quantized.draft_fp8`). ``A_log`` and ``dt_bias`` stay fp32; a tied lm_head is the embedding tensor
    itself. ``mtp`` also loads the MTP head (one layer: the fast Program drafts with ``mtp.layers.0``). ``stages``:
    pipeline stages (docs/pipeline.md), each rank's layer range loaded on its device (``load_layers``); the
    embedding, final norm, head and MTP head stay on ``device``, rank 0's."""
    specs = logical_parameters(cfg, (TEXT, MTP) if mtp else (TEXT,))
    quant = quant or _no_quant
    stages = stages or StagePlan((str(device),), (cfg.num_hidden_layers,))
    layers = [lw for rank, r in enumerate(stages.ranges())
              for lw in load_layers(cfg, src, specs, dtype, device if rank == 0 else stages.devices[rank], r, quant)]
    embed = _one(src, "embed_tokens.weight", dtype, device)
    lm_head = embed if cfg.tie_word_embeddings else _one(src, "lm_head.weight", dtype, device, quant)
    return FastWeights(embed=embed, lm_head=lm_head, final_norm=_one(src, "norm.weight", dtype, device), layers=layers,
                       mtp=_mtp(src, specs, cfg, dtype, device, mtp_quant or _no_quant) if mtp else None)


def load_layers(cfg: Qwen35Config, src: Source, specs: dict, dtype: torch.dtype, device, layers: range,
                quant: Quant = _no_quant) -> list[LayerWeights]:
    """The decoder layers of one pipeline stage's range on its device; a quantized parameter made elsewhere by
    ``quant`` moves there (one at a time, so the other device holds at most one extra)."""
    def placed(name: str) -> QuantWeight | None:
        q = quant(name)
        return q if q is None or q.device == torch.device(device) else _moved(q, device)
    return [_layer(src, specs, f"layers.{i}", cfg.layer_types[i], cfg, dtype, device, placed) for i in layers]


def _moved(q: QuantWeight, device) -> QuantWeight:
    return dataclasses.replace(q, **{f.name: getattr(q, f.name).to(device) for f in dataclasses.fields(q)
                                     if isinstance(getattr(q, f.name), torch.Tensor)})
