"""Routed experts of the Qwen3.5 sparse MoE block in plain fp32 torch (qwen35-architecture.md section 2.7):
softmax over all experts in fp32, top-k, renormalise, then the weighted sum of the chosen SwiGLU experts.
The shared expert and its sigmoid gate are dense and live outside this op."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def moe_route_naive(logits: torch.Tensor, top_k: int, renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (weights [T, k] fp32, expert ids [T, k] int32), highest probability first."""
    probs = torch.softmax(logits.float(), dim=-1)
    w, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    return w, ids.to(torch.int32)


def moe_experts_naive(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, weights: torch.Tensor,
                      ids: torch.Tensor) -> torch.Tensor:
    """x [T, H]; w_gate_up [E, 2I, H] (gate rows first, then up); w_down [E, H, I]; weights/ids [T, k].
    Returns sum_j weights[t, j] * down_e(silu(gate_e x) * up_e x) [T, H] in x's dtype."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate, up = (w_gate_up[e].float() @ x[t].float()).chunk(2)
            out[t] += weights[t, j].float() * (w_down[e].float() @ (F.silu(gate) * up))
    return out.to(x.dtype)
