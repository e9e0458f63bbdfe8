"""Tiny (CPU) and small (GPU) Qwen3.5 configs, and a fast model beside the reference model on the same weights,
with sequences placed at scrambled slots, block-table rows and pages of the shared pools."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from _fast_env import DEVICE, ON_GPU
from ninfer.fast.memory import plan_memory
from ninfer.fast.model import FastModel
from ninfer.models.qwen3_5.config import FULL, LINEAR, Qwen35Config
from ninfer.models.qwen3_5.params import MTP, TEXT, logical_parameters
from ninfer.reference import ReferenceModel

L, F = LINEAR, FULL


def tiny_config(moe: bool = False, layers: tuple[str, ...] = (L, L, L, F), top_k: int = 2, mtp: int = 0
                ) -> Qwen35Config:
    """hidden 32, vocab 64; on the GPU real head dims (256 attention, 128 GDN) at a small width. MoE: 8 experts."""
    big = ON_GPU
    raw = {
        "model_type": "qwen3_5_moe_text" if moe else "qwen3_5_text", "vocab_size": 1000 if big else 64,
        "hidden_size": 256 if big else 32, "num_hidden_layers": len(layers), "layer_types": list(layers),
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 256 if big else 32,
        "linear_num_key_heads": 2, "linear_key_head_dim": 128 if big else 16, "linear_num_value_heads": 4,
        "linear_value_head_dim": 128 if big else 16, "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                            "mrope_section": [11, 11, 10] if big else [2, 1, 1], "mrope_interleaved": True},
        "max_position_embeddings": 4096, "tie_word_embeddings": not moe, "mtp_num_hidden_layers": mtp,
    }
    if moe:
        raw.update(num_experts=8, num_experts_per_tok=top_k, moe_intermediate_size=128 if big else 16,
                   shared_expert_intermediate_size=128 if big else 16)
    else:
        raw["intermediate_size"] = 512 if big else 64
    return Qwen35Config.from_hf(raw)


def tiny_weights(cfg: Qwen35Config, seed: int = 3, gain: float = 0.25) -> dict[str, torch.Tensor]:
    """Random weights (bf16 values; A_log, dt_bias fp32) in the default model's ranges, except that projections get
    std gain/sqrt(fan_in): at hidden 32 the default 0.02 leaves the sublayers nearly invisible next to the
    embedding. At gain 0.25 dropping the attention layer moves the logits by ~35% and one GDN layer by ~20%, while
    the bf16 reference stays within ~1% of the fp32 one, so the tolerances separate rounding from wiring mistakes.
    (Made here rather than by ``convert.default_model`` so the GPU machine needs no tokenizer packages.)"""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, spec in logical_parameters(cfg, (TEXT, MTP) if cfg.mtp_num_hidden_layers else (TEXT,)).items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        noise = torch.randn(spec.shape, generator=g)
        if spec.kind == "fp32":
            a_log = torch.empty(spec.shape).uniform_(1.0, 16.0, generator=g).log()
            out[name] = a_log if name.endswith("A_log") else noise * 0.1
            continue
        if spec.kind == "norm":
            # the GDN gated norm multiplies by w, every other norm by (1 + w)
            t = noise * 0.02 + (1.0 if name.endswith("linear_attn.norm.weight") else 0.0)
        elif spec.kind in ("embedding", "conv"):
            t = noise * 0.02
        else:
            t = noise * gain / spec.shape[-1] ** 0.5
        out[name] = t.to(torch.bfloat16)
    return out


@dataclass
class Pair:
    cfg: Qwen35Config
    fast: FastModel
    ref: ReferenceModel


def build_pair(cfg: Qwen35Config, dtype: torch.dtype, kernels: str = "triton", max_seqs: int = 4,
               max_context: int = 96, page_size: int = 4, max_prefill_tokens: int = 8192,
               verify_width: int = 0) -> Pair:
    """With cfg.mtp_num_hidden_layers the MTP head too (its weights, KV layer and stored hidden); `verify_width`
    (k + 1) plans the speculative round's buffers and k step slots per row."""
    w = tiny_weights(cfg)
    plan = plan_memory(cfg, 1 << 30, max_seqs=max_seqs, max_context=max_context, page_size=page_size, dtype=dtype,
                       max_prefill_tokens=max_prefill_tokens, max_kv_pages=max_seqs * (max_context // page_size + 1),
                       mtp=cfg.mtp_num_hidden_layers > 0, verify_width=verify_width)
    fast = FastModel.build(cfg, lambda n: w[n], plan, DEVICE, kernels)
    return Pair(cfg, fast, ReferenceModel(cfg, w, torch.float32))


def place_sequences(fast: FastModel, n: int, gen_seed: int = 0) -> tuple[list[int], list[int]]:
    """Give n sequences scrambled slots, rows and pages (disjoint, enough for the planned context); returns
    (slots, rows)."""
    plan = fast.plan
    g = torch.Generator().manual_seed(gen_seed)
    slots = torch.randperm(plan.slots, generator=g)[:n].tolist()
    rows = torch.randperm(plan.max_seqs, generator=g)[:n].tolist()
    pages = torch.randperm(plan.num_pages, generator=g)
    per = plan.max_pages_per_seq
    for i, r in enumerate(rows):
        fast.pools.block_tables[r] = pages[i * per:(i + 1) * per].to(torch.int32).to(DEVICE)
    return slots, rows
