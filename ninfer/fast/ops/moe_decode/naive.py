"""The whole Qwen3.5 sparse MoE block at decode, from the router logits on, in plain fp32 torch: the definition
``triton.py``'s two launches implement (qwen35-architecture.md section 2.7).

Routing ranks experts by their fp32 logit (softmax is monotonic), ties to the lower expert id, so the choice is
defined even where bf16 logits tie; the weights are the fp32 softmax over all experts at the chosen ids,
renormalised over the top k. The shared expert's sigmoid gate is logit column E of the fused router.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def moe_decode_route_naive(logits: torch.Tensor, num_experts: int, top_k: int,
                           renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [M, >= E] -> (weights [M, k] fp32, expert ids [M, k] int32), best first, ties to the lower id."""
    lf = logits[:, :num_experts].float()
    ids = torch.sort(lf, dim=-1, descending=True, stable=True).indices[:, :top_k]  # [M, k]
    w = torch.softmax(lf, dim=-1).gather(1, ids)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    return w, ids.to(torch.int32)


def _swiglu_expert(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    # x [H] fp32; w_gate_up [2I, H] (gate rows first); w_down [H, I] -> [H] fp32
    gate, up = (w_gate_up.float() @ x).chunk(2)
    return w_down.float() @ (F.silu(gate) * up)


def moe_decode_naive(x: torch.Tensor, logits: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                     top_k: int, renormalize: bool = True, shared_gate_up: torch.Tensor | None = None,
                     shared_down: torch.Tensor | None = None,
                     residual: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, H] (the normed stream); logits [M, E (+1 with a shared expert)]; w_gate_up [E, 2I, H]; w_down
    [E, H, I]; shared_gate_up [2Is, H] and shared_down [H, Is] or both None.

    Returns sum_j w[m, j] * expert_{id[m, j]}(x[m]) + sigmoid(logits[m, E]) * shared(x[m]) [M, H], in fp32 until one
    rounding to x's dtype; with ``residual`` [M, H] returns residual + that rounded block (the caller's add)."""
    E = w_gate_up.shape[0]
    weights, ids = moe_decode_route_naive(logits, E, top_k, renormalize)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for m in range(x.shape[0]):
        xm = x[m].float()
        for j in range(top_k):
            e = int(ids[m, j])
            out[m] += weights[m, j] * _swiglu_expert(xm, w_gate_up[e], w_down[e])
        if shared_gate_up is not None:
            out[m] += torch.sigmoid(logits[m, E].float()) * _swiglu_expert(xm, shared_gate_up, shared_down)
    y = out.to(x.dtype)
    return y if residual is None else (y.float() + residual.float()).to(residual.dtype)
