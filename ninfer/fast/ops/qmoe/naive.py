"""Routed MoE experts with quantized expert stacks, in plain fp32 torch: dequantize by the format's math, then the
dense MoE oracle (``ninfer.fast.ops.moe.naive``)."""

from __future__ import annotations

import torch

from ninfer.fast.ops.moe.naive import moe_experts_naive
from ninfer.fast.ops.qlinear import QuantWeight, dequantize_naive


def _dense(w):
    return dequantize_naive(w) if isinstance(w, QuantWeight) else w


def qmoe_experts_naive(x: torch.Tensor, w_gate_up, w_down, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``moe_experts_naive``'s contract with w_gate_up [E, 2I, H] and/or w_down [E, H, I] quantized."""
    return moe_experts_naive(x, _dense(w_gate_up), _dense(w_down), weights, ids)
