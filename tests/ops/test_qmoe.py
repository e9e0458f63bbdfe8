"""Routed experts with quantized stacks vs the naive oracle: the decode form (pair-mode GEMV, SwiGLU fused, routing
weight in fp32, slot-order combine) at 1..8 tokens and the prefill form (stacks dequantized, dense grouped kernels),
with repeated experts across tokens; NaN-poisoned outputs."""

import pytest
import torch

from _device import DEVICE, ON_GPU
from ninfer.fast.ops.moe.naive import moe_route_naive
from ninfer.fast.ops.qmoe import qmoe_experts_naive
from ninfer.fast.ops.qmoe.triton import qmoe_experts
from ninfer.testing.numerics import assert_close
from ninfer.testing.quant import pack_weight

# (E, H, I, top_k)
SHAPE = (16, 2048, 512, 8) if ON_GPU else (6, 64, 32, 2)
SMALL = {"fp8": {"block": [16, 32]}, "int4": {"group_size": 16}, "int5": {"group_size": 32},
         "int8": {"group_size": 16}, "int4_act": {"group_size": 16, "zero_point": True, "act_order": True},
         "nvfp4": {}, "nvfp4_rows": {"global_rows": 1, "input_scale": True}}
DTYPE = torch.bfloat16 if ON_GPU else torch.float32


@pytest.mark.parametrize("kind", list(SMALL))
@pytest.mark.parametrize("T", [1, 5, 20])
def test_qmoe_experts(kind, T):
    E, H, I, k = SHAPE
    params = None if ON_GPU else SMALL[kind]
    w_gu = pack_weight(torch.randn(E, 2 * I, H) * H ** -0.5, kind, DEVICE, params=params)
    w_down = pack_weight(torch.randn(E, H, I) * I ** -0.5, kind, DEVICE, params=params)
    x = torch.randn(T, H, device=DEVICE).to(DTYPE)
    weights, ids = moe_route_naive(torch.randn(T, E, device=DEVICE), k)
    got = qmoe_experts(x, w_gu, w_down, weights, ids)
    assert_close(f"qmoe {kind} T={T}", qmoe_experts_naive(x, w_gu, w_down, weights, ids).float(), got.float(),
                 1e-2 if DTYPE == torch.bfloat16 else 1e-5)
