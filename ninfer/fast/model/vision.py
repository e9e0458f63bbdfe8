"""The fast vision tower: the Qwen3.5 ViT on the device, projections through cuBLAS (``torch.addmm``), attention
through the ``vision_attention`` Triton kernel over the frames of one image or video.

The math is the reference tower's (``ninfer/reference/vision.py``, docs/vision.md), written again here because
the fast and reference packages never import each other: patch embed as one GEMM over the flattened patch, the
learned table resampled bilinearly (corners aligned) by a precomputed gather of 4 taps, axial 2D rotary in fp32,
pre-LayerNorm blocks with a tanh-GELU MLP, the 2x2 merger. The per-grid index tables (resampling taps, rotary
angles) are cached by grid, since an image size repeats.

Memory: the weights are loaded once at start; activations are transients of torch's caching allocator, like the
text model's (docs/fast-model.md), budgeted by the Program before it plans its pools (``workspace_bytes``: the
largest image the processor can produce) and settled at start by ``warm`` at that size, so serving an image makes
no new device allocation from the driver.
"""

from __future__ import annotations

import math
from typing import Mapping

import torch
import torch.nn.functional as F

from ninfer.fast.ops.vision_attention import vision_attention, vision_attention_naive
from ninfer.models.qwen3_5.params import vision_parameters
from ninfer.models.qwen3_5.vision_config import VisionConfig

LN_EPS = 1e-6
_ACTS = {"gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "gelu": F.gelu, "silu": F.silu,
         "relu": F.relu, "gelu_new": lambda x: F.gelu(x, approximate="tanh")}


def _block_order(h: int, w: int, m: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) [h*w] of each patch in 2x2 merge-block order."""
    r = torch.arange(h, device=device).view(h // m, m, 1, 1).expand(h // m, m, w // m, m)
    c = torch.arange(w, device=device).view(1, 1, w // m, m).expand(h // m, m, w // m, m)
    return r.permute(0, 2, 1, 3).reshape(-1), c.permute(0, 2, 1, 3).reshape(-1)


def _taps(idx: torch.Tensor, n: int, side: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    src = idx.double() * (side - 1) / max(n - 1, 1)
    lo = src.floor().long()
    return lo, (lo + 1).clamp(max=side - 1), (src - lo).float()


class FastVisionTower:
    def __init__(self, vcfg: VisionConfig, weights: Mapping[str, torch.Tensor], dtype: torch.dtype, device,
                 kernels: str = "triton"):
        self.cfg, self.dtype, self.device = vcfg, dtype, torch.device(device)
        # "naive": the attention op's reference (CPU tests of the fast Program, as its model's kernels="naive")
        self._attend = (lambda q, k, v, cu, max_seqlen: vision_attention_naive(q, k, v, cu)) \
            if kernels == "naive" else vision_attention
        w = {}
        for spec in vision_parameters(vcfg):
            t = weights[spec.name]
            if tuple(t.shape) != spec.shape:
                raise ValueError(f"vision tower: {spec.name!r} has shape {tuple(t.shape)}, expected {spec.shape}")
            w[spec.name.removeprefix("visual.")] = t.to(device=self.device, dtype=dtype).contiguous()
        w["patch_embed.proj.weight"] = w["patch_embed.proj.weight"].reshape(vcfg.hidden_size, -1)
        self.w = w
        self.act = _ACTS[vcfg.hidden_act]
        half = vcfg.head_dim // 2
        self.inv_freq = 1.0 / vcfg.rope_theta ** (torch.arange(0, half, 2, dtype=torch.float32,
                                                               device=self.device) / half)
        self._grids: dict[tuple[int, int], tuple] = {}

    @classmethod
    def from_artifact(cls, path, dtype: torch.dtype, device, kernels: str = "triton") -> "FastVisionTower":
        from ninfer.artifact import open_artifact
        from ninfer.models.qwen3_5.params import TEXT, VISION

        with open_artifact(path, features=(TEXT, VISION)) as art:
            weights = {n: art.dequantize(n) for n, b in art.bindings.items() if b.feature == VISION}
            return cls(art.config.vision, weights, dtype, device, kernels)

    @property
    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.w.values())

    def workspace_bytes(self, max_patches: int) -> int:
        """An upper bound of the transient bytes one encode of ``max_patches`` patches holds at its peak: the
        residual, the normed input and the qkv projection in the tower's dtype, the fp32 rotary temporaries of q
        and k, the attention output, the MLP's two [N, I] activations, the merger's; the features [N/4, out]."""
        v, act = self.cfg, torch.finfo(self.dtype).bits // 8
        N, Hv = max_patches, v.hidden_size
        per_patch = act * (6 * Hv + 2 * v.intermediate_size) + 4 * 6 * Hv + 4 * v.patch_dim
        return N * per_patch + N // v.merge_unit * (v.merge_unit * Hv + v.out_hidden_size) * act * 2

    def _grid(self, h: int, w: int) -> tuple:
        """Per (h, w): the 4 resampling taps [h*w, 4] and weights, and rotary cos/sin [h*w, head_dim] (fp32)."""
        if (h, w) not in self._grids:
            v, dev = self.cfg, self.device
            rows, cols = _block_order(h, w, v.spatial_merge_size, dev)
            r0, r1, fr = _taps(rows, h, v.grid_side)
            c0, c1, fc = _taps(cols, w, v.grid_side)
            side = v.grid_side
            idx = torch.stack([r0 * side + c0, r0 * side + c1, r1 * side + c0, r1 * side + c1], 1)
            wts = torch.stack([(1 - fr) * (1 - fc), (1 - fr) * fc, fr * (1 - fc), fr * fc], 1)
            emb = torch.cat([rows.float()[:, None] * self.inv_freq, cols.float()[:, None] * self.inv_freq], -1)
            emb = torch.cat([emb, emb], -1)
            self._grids[(h, w)] = (idx, wts, emb.cos(), emb.sin())
        return self._grids[(h, w)]

    def warm(self, max_patches: int) -> None:
        """Run the largest square image once, so the caching allocator holds every activation block before
        requests arrive."""
        m = self.cfg.spatial_merge_size
        side = max(m, int(math.isqrt(max_patches)) // m * m)
        self.encode(torch.zeros(side * side, self.cfg.patch_dim, device=self.device), (1, side, side))

    def encode(self, pixels: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        """pixels [t*h*w, patch_dim] -> features [t*h*w/4, out_hidden] in the tower's dtype."""
        v, (t, h, w) = self.cfg, grid
        N, nh, d = t * h * w, v.num_heads, v.head_dim
        idx, wts, cos, sin = self._grid(h, w)
        W = self.w
        x = torch.addmm(W["patch_embed.proj.bias"], pixels.to(self.device, self.dtype),
                        W["patch_embed.proj.weight"].t())  # [N, Hv]
        pos = (W["pos_embed.weight"][idx].float() * wts[:, :, None]).sum(1)  # [h*w, Hv]
        x = (x.float() + pos.repeat(t, 1)).to(self.dtype)
        cos, sin = cos.repeat(t, 1)[:, None], sin.repeat(t, 1)[:, None]
        cu = torch.arange(0, N + 1, h * w, dtype=torch.int32, device=self.device)
        for i in range(v.depth):
            p = f"blocks.{i}."
            y = F.layer_norm(x, (v.hidden_size,), W[p + "norm1.weight"], W[p + "norm1.bias"], LN_EPS)
            qkv = torch.addmm(W[p + "attn.qkv.bias"], y, W[p + "attn.qkv.weight"].t()).view(N, 3, nh, d)
            q, k = (_rotate(qkv[:, j], cos, sin).to(self.dtype) for j in (0, 1))
            o = self._attend(q, k, qkv[:, 2], cu, max_seqlen=h * w).view(N, nh * d)
            x = x + torch.addmm(W[p + "attn.proj.bias"], o, W[p + "attn.proj.weight"].t())
            y = F.layer_norm(x, (v.hidden_size,), W[p + "norm2.weight"], W[p + "norm2.bias"], LN_EPS)
            y = self.act(torch.addmm(W[p + "mlp.linear_fc1.bias"], y, W[p + "mlp.linear_fc1.weight"].t()))
            x = x + torch.addmm(W[p + "mlp.linear_fc2.bias"], y, W[p + "mlp.linear_fc2.weight"].t())
        y = F.layer_norm(x, (v.hidden_size,), W["merger.norm.weight"], W["merger.norm.bias"], LN_EPS)
        y = y.view(N // v.merge_unit, v.merge_unit * v.hidden_size)
        y = F.gelu(torch.addmm(W["merger.linear_fc1.bias"], y, W["merger.linear_fc1.weight"].t()))
        return torch.addmm(W["merger.linear_fc2.bias"], y, W["merger.linear_fc2.weight"].t())


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """rotate_half rotary in fp32; x [N, nh, d] (a strided view), cos/sin [N, 1, d]."""
    x = x.float()
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-b, a], dim=-1) * sin
