"""The MTP head's projections in FP8 for drafting (`--speculative-config` ``"quantization": "fp8"``).

A draft step reads the MTP layer's projections once per drafted token (about 0.47 GB at the 9B shape in bf16,
three times a k = 3 round) and the draft head, the lm_head's first `draft_vocab_size` rows (0.27 GB at 32,768), so
the draft is bandwidth bound like a decode step; e4m3 with one fp32 scale per row halves those bytes. The draft
head is quantized only under a draft vocabulary (an FP8 copy of the whole head would be 1 GB more at 9B). The
drafts only propose: the target verifies every one, so acceptance stays lossless and only the acceptance rate can
move. Both Programs quantize the same way (the artifact format's FP8 pack, per-row scales), so the reference
Program, drafting with these values dequantized exactly, stays the fast Program's oracle.
"""

from __future__ import annotations

import numpy as np
import torch

from ninfer.artifact.formats.fp8 import FP8E4M3

from .config import Qwen35Config
from .params import MTP, logical_parameters

FORMAT, DTYPE, PARAMS = FP8E4M3(), "float8_e4m3fn", {}  # one scale per row: any shape, any fusion of parts


def draft_linears(cfg: Qwen35Config) -> list[str]:
    """The MTP head's 2-D projection weights (``fc`` and the layer's attention and dense MLP projections; norms,
    the router and expert stacks stay as stored)."""
    return [p.name for p in logical_parameters(cfg, (MTP,)).values()
            if p.name.startswith("mtp.") and p.kind == "linear" and len(p.shape) == 2
            and not p.name.endswith("shared_expert_gate.weight")]  # [1, H], fused with the router


def fp8_planes(weight: torch.Tensor) -> dict[str, np.ndarray]:
    """weight [N, K] -> the FP8 planes (``data`` e4m3 bits [N, K] uint8, ``scales`` fp32 [N])."""
    return FORMAT.pack(weight.detach().float().cpu().numpy(), DTYPE, PARAMS)


def fp8_values(weight: torch.Tensor) -> torch.Tensor:
    """What the FP8 planes of `weight` decode to, in its dtype and on its device (the reference's draft weights)."""
    planes = fp8_planes(weight)
    values = FORMAT.unpack(planes, tuple(weight.shape), DTYPE, PARAMS)
    return torch.from_numpy(values).to(device=weight.device, dtype=weight.dtype)


def head_rows_values(lm_head: torch.Tensor, draft_vocab: int) -> torch.Tensor:
    """lm_head [V, H] with its first `draft_vocab` rows (the draft head) replaced by their FP8 values, the rest as
    they are: the reference's drafting lm_head (rows past the draft vocabulary are never drawn)."""
    return torch.cat([fp8_values(lm_head[:draft_vocab]), lm_head[draft_vocab:]])

