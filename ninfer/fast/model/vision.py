"""The fast vision tower: the Qwen3.5 ViT on the device in the tower's dtype (bf16 when serving), projections
through cuBLAS, attention through the kernel measured fastest at start (``vision_attend.py``), activations in a
workspace planned at start (``vision_workspace.py``).

The math is the reference tower's (``ninfer/reference/vision.py``, docs/vision.md), written again here because
the fast and reference packages never import each other: patch embed as one GEMM over the flattened patch, the
learned table resampled bilinearly (corners aligned) by 4 gathered taps, axial 2D rotary in fp32, pre-LayerNorm
blocks with a tanh-GELU MLP, the 2x2 merger. A block is seven launches:

  norm1 (+ the previous fc2's bias) -> qkv GEMM (bias in cuBLASLt's epilogue) -> rotary of q and k in place ->
  attention -> proj GEMM accumulated into the residual (``addmm_``, beta 1) -> norm2 (+ proj's bias) ->
  fc1 GEMM (bias and tanh-GELU in the epilogue, on CUDA) -> fc2 GEMM accumulated into the residual

so the residual stream costs no elementwise pass of its own: each projection's bias is added by the next norm,
which reads the residual anyway (``ops/layer_norm``). The per-grid tables (resampling taps, rotary angles) are
cached for the last ``GRID_CACHE`` grids, and on CUDA the encode of a grid seen before replays its CUDA graph
(``vision_graphs.py``).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Callable, Mapping, NamedTuple

import torch
import torch.nn.functional as F

from ninfer.fast.model.vision_attend import AttentionChoice, candidates, measure
from ninfer.fast.model.vision_graphs import VisionGraphs
from ninfer.fast.model.vision_workspace import VisionWorkspace
from ninfer.models.qwen3_5.params import vision_parameters
from ninfer.models.qwen3_5.vision_config import VisionConfig

LN_EPS = 1e-6
GRID_CACHE = 4  # grids whose tables (and CUDA graphs) stay cached (workspace_bytes counts them at the largest size)
_INPLACE_ACTS = {"gelu_pytorch_tanh": lambda h: torch._C._nn.gelu_(h, approximate="tanh"),
                 "gelu_new": lambda h: torch._C._nn.gelu_(h, approximate="tanh"),
                 "gelu": lambda h: torch._C._nn.gelu_(h), "silu": lambda h: F.silu(h, inplace=True),
                 "relu": lambda h: F.relu(h, inplace=True)}
# cuBLASLt's GELU epilogue is the tanh approximation (torch._addmm_activation on CUDA; its CPU path is exact GELU)
_TANH_GELU = ("gelu_pytorch_tanh", "gelu_new")


def _block_order(h: int, w: int, m: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) [h*w] of each patch in 2x2 merge-block order."""
    r = torch.arange(h, device=device).view(h // m, m, 1, 1).expand(h // m, m, w // m, m)
    c = torch.arange(w, device=device).view(1, 1, w // m, m).expand(h // m, m, w // m, m)
    return r.permute(0, 2, 1, 3).reshape(-1), c.permute(0, 2, 1, 3).reshape(-1)


def _taps(idx: torch.Tensor, n: int, side: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    src = idx.double() * (side - 1) / max(n - 1, 1)
    lo = src.floor().long()
    return lo, (lo + 1).clamp(max=side - 1), (src - lo).float()


def _ops(kernels: str):
    """(layer_norm, vision_rotary) of the kernel set: the Triton kernels or their naive references."""
    if kernels == "naive":
        from ninfer.fast.ops.layer_norm import layer_norm_naive
        from ninfer.fast.ops.vision_rotary import vision_rotary_naive
        return layer_norm_naive, vision_rotary_naive
    from ninfer.fast.ops.layer_norm import layer_norm
    from ninfer.fast.ops.vision_rotary import vision_rotary
    return layer_norm, vision_rotary


class Frames(NamedTuple):
    """The frames of the encode in progress: their length (h * w), their bounds [t + 1] for the packed attention
    kernel, the grid's rotary cos/sin [h * w, head_dim / 2]."""
    length: int
    cu_seqlens: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor


class FastVisionTower:
    def __init__(self, vcfg: VisionConfig, weights: Mapping[str, torch.Tensor], dtype: torch.dtype, device,
                 kernels: str = "triton", use_graphs: bool | None = None):
        """use_graphs: capture each grid's encode (`vision_graphs.py`; None: on CUDA; never elsewhere)."""
        self.cfg, self.dtype, self.device = vcfg, dtype, torch.device(device)
        on_cuda = self.device.type == "cuda" and torch.cuda.is_available()
        self.graphs = VisionGraphs(on_cuda if use_graphs is None else bool(use_graphs) and on_cuda, GRID_CACHE)
        self._norm, self._rotary = _ops(kernels)
        self._candidates = candidates(kernels, self.device)
        # the default until `warm` measures the candidates (CUDA)
        self.attention = AttentionChoice(next(iter(self._candidates)))
        w = {}
        for spec in vision_parameters(vcfg):
            t = weights[spec.name]
            if tuple(t.shape) != spec.shape:
                raise ValueError(f"vision tower: {spec.name!r} has shape {tuple(t.shape)}, expected {spec.shape}")
            w[spec.name.removeprefix("visual.")] = t.to(device=self.device, dtype=dtype).contiguous()
        w["patch_embed.proj.weight"] = w["patch_embed.proj.weight"].reshape(vcfg.hidden_size, -1)
        self.w = w
        self._act = _INPLACE_ACTS[vcfg.hidden_act]
        # the epilogue's tanh is not the reference's to fp32's last bits: fused in bf16/fp16 only (fp32 mode is the
        # tight check against the reference tower)
        self._fused_gelu = self.device.type == "cuda" and dtype != torch.float32 and vcfg.hidden_act in _TANH_GELU
        half = vcfg.head_dim // 2
        self.inv_freq = 1.0 / vcfg.rope_theta ** (torch.arange(0, half, 2, dtype=torch.float32,
                                                               device=self.device) / half)
        self._grids: OrderedDict[tuple[int, int], tuple] = OrderedDict()
        self.workspace: VisionWorkspace | None = None
        # the benchmark's stage timer (bench_vision.py): called with a stage's name after its launches
        self.marks: Callable[[str], None] | None = None

    @classmethod
    def from_artifact(cls, path, dtype: torch.dtype, device, kernels: str = "triton",
                      use_graphs: bool | None = None) -> "FastVisionTower":
        from ninfer.artifact import open_artifact
        from ninfer.models.qwen3_5.params import TEXT, VISION

        with open_artifact(path, features=(TEXT, VISION)) as art:
            weights = {n: art.dequantize(n) for n, b in art.bindings.items() if b.feature == VISION}
            return cls(art.config.vision, weights, dtype, device, kernels, use_graphs)

    @property
    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.w.values())

    def workspace_bytes(self, max_patches: int) -> int:
        """The device bytes encodes of at most ``max_patches`` patches hold besides the weights: the planned
        workspace, ``GRID_CACHE`` grids' tables, an SDPA backend's output and log-sum-exp, and the features one
        encode returns; with CUDA graphs also each kept graph's output and its capture's SDPA transients, in the
        graphs' pool."""
        v, act, N = self.cfg, torch.finfo(self.dtype).bits // 8, max_patches
        tables = N * (4 * 8 + 4 * 4 + v.head_dim * 4)  # taps (int64), their weights, cos and sin [d/2] (fp32)
        sdpa = N * v.hidden_size * act + v.num_heads * N * 4
        features = N // v.merge_unit * v.out_hidden_size * act
        graphs = self.graphs.limit * features + sdpa if self.graphs.enabled else 0
        return VisionWorkspace.nbytes(v, N, self.dtype) + GRID_CACHE * tables + sdpa + features + graphs

    def plan(self, max_patches: int) -> None:
        """Allocate the workspace for images of at most ``max_patches`` patches (the Program does at start); the
        graphs captured over the old one go."""
        self.graphs.clear()
        self.workspace = VisionWorkspace(self.cfg, max_patches, self.dtype, self.device)

    def _grid(self, h: int, w: int) -> tuple:
        """Per (h, w): the 4 resampling taps [h*w, 4] and weights, and rotary cos/sin [h*w, head_dim/2] (fp32)."""
        if (h, w) not in self._grids:
            v, dev = self.cfg, self.device
            rows, cols = _block_order(h, w, v.spatial_merge_size, dev)
            r0, r1, fr = _taps(rows, h, v.grid_side)
            c0, c1, fc = _taps(cols, w, v.grid_side)
            side = v.grid_side
            idx = torch.stack([r0 * side + c0, r0 * side + c1, r1 * side + c0, r1 * side + c1], 1)
            wts = torch.stack([(1 - fr) * (1 - fc), (1 - fr) * fc, fr * (1 - fc), fr * fc], 1)
            emb = torch.cat([rows.float()[:, None] * self.inv_freq, cols.float()[:, None] * self.inv_freq], -1)
            self._grids[(h, w)] = (idx, wts, emb.cos().contiguous(), emb.sin().contiguous())
            while len(self._grids) > GRID_CACHE:
                self._grids.popitem(last=False)
        self._grids.move_to_end((h, w))
        return self._grids[(h, w)]

    def warm(self, max_patches: int) -> None:
        """Plan the workspace if not yet planned, measure the attention candidates at the largest square image
        (CUDA) and run that image twice, so kernels are compiled, tables built and (with graphs) its graph captured
        before requests arrive."""
        if self.workspace is None or self.workspace.patches < max_patches:
            self.plan(max_patches)
        m, v = self.cfg.spatial_merge_size, self.cfg
        side = max(m, int(math.isqrt(max_patches)) // m * m)
        N = side * side
        if self.device.type == "cuda" and len(self._candidates) > 1:
            qkv = self.workspace.take("qkv", (N, 3, v.num_heads, v.head_dim)).normal_()
            out = self.workspace.take("o", (N, v.num_heads, v.head_dim))
            cu = torch.tensor([0, N], dtype=torch.int32, device=self.device)
            self.attention = measure(self._candidates, qkv[:, 0], qkv[:, 1], qkv[:, 2], cu, N, out)
        pixels = torch.zeros(N, v.patch_dim, device=self.device)
        for _ in range(2 if self.graphs.enabled else 1):
            self.encode(pixels, (1, side, side))

    def encode(self, pixels: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        """pixels [t*h*w, patch_dim] (fp32, on the host or the device) -> features [t*h*w/4, out_hidden] in the
        tower's dtype (a tensor of the caller's). An encode larger than the plan (or without one: tests,
        benchmarks) plans for its size. The pixels are staged into the workspace, then the grid's graph replays or
        the launches run (`VisionGraphs.run`; eagerly while the benchmark's stage timer is set)."""
        v, (t, h, w) = self.cfg, grid
        N = t * h * w
        if self.workspace is None or self.workspace.patches < N:
            self.plan(N)
        ws = self.workspace
        ws.take("qkv", (N, v.patch_dim), torch.float32).copy_(pixels)  # the host's pixels straight into the plan
        if self.marks is not None:
            return self._encode(ws, grid)
        return self.graphs.run(grid, lambda: self._encode(ws, grid))

    def _encode(self, ws: VisionWorkspace, grid: tuple[int, int, int]) -> torch.Tensor:
        """The encode after the pixels are staged: every launch, no host read (a CUDA graph's body)."""
        v, (t, h, w) = self.cfg, grid
        N = t * h * w
        self._embed(ws, grid)
        self._mark("embed")
        cos, sin = self._grid(h, w)[2:]
        frames = Frames(h * w, torch.arange(0, N + 1, h * w, dtype=torch.int32, device=self.device), cos, sin)
        pending = None
        for i in range(v.depth):
            pending = self.block(ws, i, N, frames, pending)
        return self.merge(ws, N, pending)

    def _embed(self, ws: VisionWorkspace, grid: tuple[int, int, int]) -> None:
        """Patch embed of the staged pixels plus the resampled position table into the residual ``x``; no bias is
        left pending (the patch embed's is in its GEMM)."""
        v, (t, h, w) = self.cfg, grid
        N, hw, H = t * h * w, h * w, v.hidden_size
        staged = ws.take("qkv", (N, v.patch_dim), torch.float32)
        px = ws.take("mlp", (N, v.patch_dim))
        px.copy_(staged)
        W = self.w
        x = ws.take("x", (N, H))
        torch.addmm(W["patch_embed.proj.bias"], px, W["patch_embed.proj.weight"].t(), out=x)
        idx, wts = self._grid(h, w)[:2]
        pos, tap = ws.take("y", (hw, H)), ws.take("o", (hw, H))
        table = W["pos_embed.weight"]
        torch.index_select(table, 0, idx[:, 0], out=pos)
        pos.mul_(wts[:, :1])
        for j in range(1, 4):
            torch.index_select(table, 0, idx[:, j], out=tap)
            pos.addcmul_(tap, wts[:, j:j + 1])
        x.view(t, hw, H).add_(pos)

    def block(self, ws: VisionWorkspace, i: int, N: int, frames: Frames,
              pending: torch.Tensor | None) -> torch.Tensor:
        """ViT block i over the residual ``x`` [N, H] in place; ``pending`` is the previous projection's bias, not
        yet in ``x`` (None before the first block). Returns this block's pending bias (fc2's)."""
        v, W, p = self.cfg, self.w, f"blocks.{i}."
        H, nh, d = v.hidden_size, v.num_heads, v.head_dim
        x, y = ws.take("x", (N, H)), ws.take("y", (N, H))
        self._norm(x, W[p + "norm1.weight"], W[p + "norm1.bias"], LN_EPS, add=pending, out=y)
        self._mark("norm")
        qkv = ws.take("qkv", (N, 3 * H))
        torch.addmm(W[p + "attn.qkv.bias"], y, W[p + "attn.qkv.weight"].t(), out=qkv)
        self._mark("qkv")
        q3 = qkv.view(N, 3, nh, d)
        self._rotary(q3, frames.cos, frames.sin)
        self._mark("rotary")
        o = self.attend(ws, q3, N, frames)
        self._mark("attention")
        x.addmm_(o.reshape(N, H), W[p + "attn.proj.weight"].t())
        self._mark("proj")
        self._norm(x, W[p + "norm2.weight"], W[p + "norm2.bias"], LN_EPS, add=W[p + "attn.proj.bias"], out=y)
        self._mark("norm")
        hid = ws.take("mlp", (N, v.intermediate_size))
        self.fc1(y, p, hid)
        self._mark("fc1")
        x.addmm_(hid, W[p + "mlp.linear_fc2.weight"].t())
        self._mark("fc2")
        return W[p + "mlp.linear_fc2.bias"]

    def attend(self, ws: VisionWorkspace, q3: torch.Tensor, N: int, frames: Frames) -> torch.Tensor:
        v = self.cfg
        out = ws.take("o", (N, v.num_heads, v.head_dim))
        return self._candidates[self.attention.name](q3[:, 0], q3[:, 1], q3[:, 2], frames.cu_seqlens, frames.length,
                                                     out)

    def fc1(self, y: torch.Tensor, p: str, out: torch.Tensor) -> None:
        b, w = self.w[p + "mlp.linear_fc1.bias"], self.w[p + "mlp.linear_fc1.weight"]
        if self._fused_gelu:
            torch._addmm_activation(b, y, w.t(), use_gelu=True, out=out)
        else:
            self._act(torch.addmm(b, y, w.t(), out=out))

    def merge(self, ws: VisionWorkspace, N: int, pending: torch.Tensor) -> torch.Tensor:
        """The 2x2 merger: norm (+ the last fc2's bias), four consecutive patches as one row, Linear, exact GELU,
        Linear -> features [N/4, out_hidden] (a new tensor: the caller holds it)."""
        v, W = self.cfg, self.w
        x, y = ws.take("x", (N, v.hidden_size)), ws.take("y", (N, v.hidden_size))
        self._norm(x, W["merger.norm.weight"], W["merger.norm.bias"], LN_EPS, add=pending, out=y)
        rows, width = N // v.merge_unit, v.merge_unit * v.hidden_size
        hid = ws.take("o", (rows, width))
        torch._C._nn.gelu_(torch.addmm(W["merger.linear_fc1.bias"], y.view(rows, width),
                                       W["merger.linear_fc1.weight"].t(), out=hid))
        out = torch.addmm(W["merger.linear_fc2.bias"], hid, W["merger.linear_fc2.weight"].t())
        self._mark("merger")
        return out

    def _mark(self, stage: str) -> None:
        if self.marks is not None:
            self.marks(stage)
