"""The reference Qwen3.5 vision tower (transformers' ``Qwen3_5VisionModel``) in plain torch, fp32 or fp64.

Input: one image's (or video's) flattened patches ``pixels`` [t*h*w, C*Tp*P*P] in the processor's order, i.e.
frame-major and, inside a frame, in 2x2 merge-block order (block row, block column, row in block, column in
block), and its patch grid (t, h, w). Output: [t*h*w / 4, text H], one row per ``<|image_pad|>`` token.

Per patch: Conv3d patch embed (kernel = stride, so a matmul over the flattened patch) + the learned square
position table resampled bilinearly (align_corners) to the h x w grid; then ``depth`` pre-LayerNorm blocks of
non-causal attention inside each frame, with axial 2D rotary (head_dim/4 frequencies for the row, as many for the
column, rotate_half over the whole head), and a tanh-GELU MLP; then the merger: LayerNorm, four consecutive patches
concatenated, Linear, exact GELU, Linear into the text hidden size.
"""

from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F

from ninfer.models.qwen3_5.params import vision_parameters
from ninfer.models.qwen3_5.vision_config import VisionConfig

from .activations import ACTIVATIONS
from .attention import rotate_half
from .scope import Scope

LN_EPS = 1e-6


def block_order(h: int, w: int, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) [h*w] of each patch of one frame in merge-block order."""
    rows = torch.arange(h).view(h // merge, merge, 1, 1).expand(h // merge, merge, w // merge, merge)
    cols = torch.arange(w).view(1, 1, w // merge, merge).expand(h // merge, merge, w // merge, merge)
    # (block row, row in block, block col, col in block) -> (block row, block col, row in block, col in block)
    return rows.permute(0, 2, 1, 3).reshape(-1), cols.permute(0, 2, 1, 3).reshape(-1)


def resampled_positions(table: torch.Tensor, side: int, h: int, w: int) -> torch.Tensor:
    """The [side*side, D] learned table resampled bilinearly to an h x w grid, corners aligned: [h, w, D]."""
    grid = table.view(side, side, -1)

    def taps(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        src = torch.arange(n, dtype=torch.float64) * (side - 1) / max(n - 1, 1)
        lo = src.floor().long()
        hi = (lo + 1).clamp(max=side - 1)
        return lo, hi, (src - lo).to(table.dtype)

    r0, r1, fr = taps(h)
    c0, c1, fc = taps(w)
    fr, fc = fr[:, None, None], fc[None, :, None]
    top = grid[r0][:, c0] * (1 - fc) + grid[r0][:, c1] * fc  # [h, w, D]
    bottom = grid[r1][:, c0] * (1 - fc) + grid[r1][:, c1] * fc
    return top * (1 - fr) + bottom * fr


def rotary_cos_sin(rows: torch.Tensor, cols: torch.Tensor, head_dim: int, theta: float,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [N, head_dim]: angles of the row then of the column (head_dim/4 frequencies each), twice."""
    angle_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    half = head_dim // 2
    inv = 1.0 / theta ** (torch.arange(0, half, 2, dtype=angle_dtype) / half)  # [head_dim / 4]
    emb = torch.cat([rows.to(angle_dtype)[:, None] * inv, cols.to(angle_dtype)[:, None] * inv], dim=-1)
    emb = torch.cat([emb, emb], dim=-1)  # [N, head_dim]
    return emb.cos(), emb.sin()


class VisionTower:
    """The tower over logical ``visual.*`` weights (names and shapes checked against ``vision_parameters``)."""

    def __init__(self, vcfg: VisionConfig, weights: Mapping[str, torch.Tensor], dtype: torch.dtype = torch.float32):
        self.cfg = vcfg
        self.dtype = dtype
        out = {}
        for spec in vision_parameters(vcfg):
            t = weights.get(spec.name)
            if t is None:
                raise KeyError(f"vision tower: missing weight {spec.name!r}")
            if tuple(t.shape) != spec.shape:
                raise ValueError(f"vision tower: weight {spec.name!r} has shape {tuple(t.shape)}, expected {spec.shape}")
            out[spec.name] = t.to(dtype)
        self.w = Scope(out, "visual")
        self.act = ACTIVATIONS[vcfg.hidden_act]

    def encode(self, pixels: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        """pixels [t*h*w, patch_dim] of one image or video, grid (t, h, w) in patches -> [t*h*w/4, out_hidden]."""
        v, (t, h, w) = self.cfg, grid
        m = v.spatial_merge_size
        if h % m or w % m or t < 1:
            raise ValueError(f"vision tower: grid {grid} is not a whole number of {m}x{m} merge blocks")
        if tuple(pixels.shape) != (t * h * w, v.patch_dim):
            raise ValueError(f"vision tower: pixels of shape {tuple(pixels.shape)} for grid {grid}; expected "
                             f"[{t * h * w}, {v.patch_dim}]")
        x = F.linear(pixels.to(self.dtype), self.w["patch_embed.proj.weight"].reshape(v.hidden_size, -1),
                     self.w["patch_embed.proj.bias"])  # [N, Hv]
        rows, cols = block_order(h, w, m)
        pos = resampled_positions(self.w["pos_embed.weight"], v.grid_side, h, w)[rows, cols]  # [h*w, Hv]
        x = x + pos.repeat(t, 1)
        cos, sin = rotary_cos_sin(rows.repeat(t), cols.repeat(t), v.head_dim, v.rope_theta, self.dtype)
        for i in range(v.depth):
            x = self._block(x, self.w.sub(f"blocks.{i}"), cos, sin, h * w)
        return self._merge(x)

    def _block(self, x: torch.Tensor, w: Scope, cos: torch.Tensor, sin: torch.Tensor, frame: int) -> torch.Tensor:
        x = x + self._attention(_layer_norm(x, w, "norm1"), w.sub("attn"), cos, sin, frame)
        y = _layer_norm(x, w, "norm2")
        y = F.linear(self.act(F.linear(y, w["mlp.linear_fc1.weight"], w["mlp.linear_fc1.bias"])),
                     w["mlp.linear_fc2.weight"], w["mlp.linear_fc2.bias"])
        return x + y

    def _attention(self, x: torch.Tensor, w: Scope, cos: torch.Tensor, sin: torch.Tensor, frame: int) -> torch.Tensor:
        """Full (non-causal) attention within each frame of ``frame`` patches; x [N, Hv] -> [N, Hv]."""
        N, nh, d = x.shape[0], self.cfg.num_heads, self.cfg.head_dim
        q, k, v = F.linear(x, w["qkv.weight"], w["qkv.bias"]).view(N, 3, nh, d).unbind(1)  # [N, nh, d] each
        wide = cos.dtype
        q = (q.to(wide) * cos[:, None] + rotate_half(q.to(wide)) * sin[:, None]).to(x.dtype)
        k = (k.to(wide) * cos[:, None] + rotate_half(k.to(wide)) * sin[:, None]).to(x.dtype)
        out = torch.empty_like(q)
        for s in range(0, N, frame):
            qs, ks, vs = (z[s:s + frame].transpose(0, 1) for z in (q, k, v))  # [nh, frame, d]
            probs = torch.softmax((qs @ ks.transpose(1, 2)).to(wide) * d ** -0.5, dim=-1).to(x.dtype)
            out[s:s + frame] = (probs @ vs).transpose(0, 1)
        return F.linear(out.reshape(N, nh * d), w["proj.weight"], w["proj.bias"])

    def _merge(self, x: torch.Tensor) -> torch.Tensor:
        w = self.w.sub("merger")
        x = _layer_norm(x, w, "norm").reshape(-1, self.cfg.merge_unit * self.cfg.hidden_size)  # [N/4, 4*Hv]
        x = F.gelu(F.linear(x, w["linear_fc1.weight"], w["linear_fc1.bias"]))
        return F.linear(x, w["linear_fc2.weight"], w["linear_fc2.bias"])


def _layer_norm(x: torch.Tensor, w: Scope, name: str) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], w[f"{name}.weight"], w[f"{name}.bias"], LN_EPS)
