"""Feed-forward blocks: the SwiGLU MLP (dense models) and the sparse MoE block with a gated shared expert."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ninfer.models.qwen3_5.config import Qwen35Config

from .activations import activation
from .scope import Scope


def swiglu(x: torch.Tensor, gate_w: torch.Tensor, up_w: torch.Tensor, down_w: torch.Tensor,
           act: Callable[[torch.Tensor], torch.Tensor] = F.silu) -> torch.Tensor:
    """``down(act(gate x) * up x)`` (act: silu unless the config's hidden_act says otherwise); x [T, H],
    gate_w/up_w [I, H], down_w [H, I]."""
    return F.linear(act(F.linear(x, gate_w)) * F.linear(x, up_w), down_w)


def route(x: torch.Tensor, router_w: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over all experts (at least fp32), top-k, optional renormalisation.

    Returns (weights [T, k] in x's dtype, expert ids [T, k]).
    """
    logits = F.linear(x, router_w)  # [T, E]
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32
    probs = torch.softmax(logits.to(ct), dim=-1)
    top_p, top_i = torch.topk(probs, top_k, dim=-1)  # [T, k]
    if renormalize:
        top_p = top_p / top_p.sum(dim=-1, keepdim=True)
    return top_p.to(x.dtype), top_i


def moe(x: torch.Tensor, w: Scope, cfg: Qwen35Config) -> torch.Tensor:
    """Sparse MoE block; x [T, H]. Experts are fused: gate_up [E, 2*Im, H] (gate rows first), down [E, H, Im]."""
    act = activation(cfg)
    top_p, top_i = route(x, w["gate.weight"], cfg.num_experts_per_tok, cfg.norm_topk_prob)
    gate_up, down = w["experts.gate_up_proj"], w["experts.down_proj"]
    routed = torch.zeros_like(x)  # [T, H]
    for e in torch.unique(top_i).tolist():
        tok, slot = torch.where(top_i == e)  # tokens that picked expert e, and in which top-k slot
        gate, up = F.linear(x[tok], gate_up[e]).chunk(2, dim=-1)  # [n, Im] each
        y = F.linear(act(gate) * up, down[e])  # [n, H]
        routed.index_add_(0, tok, y * top_p[tok, slot, None])
    if cfg.shared_expert_intermediate_size > 0:
        shared = swiglu(x, w["shared_expert.gate_proj.weight"], w["shared_expert.up_proj.weight"],
                        w["shared_expert.down_proj.weight"], act)
        routed = routed + torch.sigmoid(F.linear(x, w["shared_expert_gate.weight"])) * shared
    return routed


def ffn(x: torch.Tensor, w: Scope, cfg: Qwen35Config) -> torch.Tensor:
    """The layer's FFN (``w`` is scoped at ``<layer>.mlp``): MoE for MoE models, SwiGLU otherwise."""
    if cfg.is_moe:
        return moe(x, w, cfg)
    return swiglu(x, w["gate_proj.weight"], w["up_proj.weight"], w["down_proj.weight"], activation(cfg))
