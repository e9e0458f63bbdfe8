"""The fast vision tower alone (issue 15): one 1024x1024 image (64 x 64 = 4096 patches, 1024 merged tokens) through
``FastVisionTower`` at the 9B checkpoint's tower geometry (depth 27, hidden 1152, 16 heads of 72, MLP 4304, out
4096), random bf16 weights. Prints ms per encode (median of timed runs after a warm-up), the matrix FLOPs, the FLOP
floor at the measured bf16 GEMM rate (perf-anchors.md: ~790 TFLOP/s on the H200) and the ratio to it (issue 15's
target: within 2x), and the same for a 512x512 and a 1536x1024 image. Not through the Engine: the fast Program's
image prefill is not built yet (docs/vision.md).

Run: python benchmarks/gpu/bench_vision.py [--out DIR]
     python benchmarks/gpu/bench_vision.py --smoke     # a tiny tower on the CPU (Triton interpreter)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from ninfer.fast.model.vision import FastVisionTower  # noqa: E402
from ninfer.models.qwen3_5.params import vision_parameters  # noqa: E402
from ninfer.models.qwen3_5.vision_config import VisionConfig  # noqa: E402

GEMM_TFLOPS = 790.0  # measured bf16 GEMM rate on the H200 (perf-anchors.md)
TOWER_9B = dict(depth=27, hidden_size=1152, hidden_act="gelu_pytorch_tanh", intermediate_size=4304, num_heads=16,
                in_channels=3, patch_size=16, spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=4096,
                num_position_embeddings=2304, rope_theta=10000.0, image_token_id=248056, video_token_id=248057,
                vision_start_token_id=248053, vision_end_token_id=248054)
TINY = dict(TOWER_9B, depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
            num_position_embeddings=36)
IMAGES_9B = ((1024, 1024), (512, 512), (1536, 1024))
IMAGES_TINY = ((64, 96),)


def flops(v: VisionConfig, n: int) -> float:
    """Matrix FLOPs of one encode of n patches (one frame): GEMMs and the two attention products."""
    H, I, m = v.hidden_size, v.intermediate_size, v.merge_unit * v.hidden_size
    block = 2 * n * H * (3 * H + H + 2 * I) + 4 * n * n * H
    return 2 * n * v.patch_dim * H + v.depth * block + 2 * (n // v.merge_unit) * m * (m + v.out_hidden_size)


def random_tower(v: VisionConfig, device: str, dtype: torch.dtype) -> FastVisionTower:
    gen = torch.Generator().manual_seed(0)
    weights = {s.name: torch.randn(s.shape, generator=gen) * 0.02 + (1.0 if s.name.endswith("norm.weight")
               or s.name.endswith(("norm1.weight", "norm2.weight")) else 0.0) for s in vision_parameters(v)}
    return FastVisionTower(v, weights, dtype, device)


def time_encode(tower: FastVisionTower, grid: tuple[int, int, int], repeats: int, device: str) -> float:
    t, h, w = grid
    pixels = torch.randn(t * h * w, tower.cfg.patch_dim, device=device)
    tower.encode(pixels, grid)  # warm-up: the grid's tables, kernel compilation, allocator blocks
    samples = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        tower.encode(pixels, grid)
        if device == "cuda":
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    v = VisionConfig(**(TINY if args.smoke else TOWER_9B))
    tower = random_tower(v, device, torch.float32 if args.smoke else torch.bfloat16)
    rows = []
    for w_px, h_px in (IMAGES_TINY if args.smoke else IMAGES_9B):
        grid = (1, h_px // v.patch_size, w_px // v.patch_size)
        n = grid[1] * grid[2]
        ms = time_encode(tower, grid, 1 if args.smoke else 10, device)
        floor = flops(v, n) / (GEMM_TFLOPS * 1e12) * 1e3
        rows.append({"image": f"{w_px}x{h_px}", "patches": n, "tokens": n // 4, "ms": ms,
                     "gflop": flops(v, n) / 1e9, "floor_ms": floor, "x_floor": ms / floor})
    print(f"{'image':>10} {'patches':>8} {'tokens':>7} {'ms':>9} {'GFLOP':>8} {'floor ms':>9} {'x floor':>8}")
    for r in rows:
        print(f"{r['image']:>10} {r['patches']:>8} {r['tokens']:>7} {r['ms']:>9.2f} {r['gflop']:>8.1f} "
              f"{r['floor_ms']:>9.3f} {r['x_floor']:>8.2f}")
    result = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "rows": rows,
              "target": "1024x1024 within 2x of the floor",
              "pass": None if args.smoke else rows[0]["x_floor"] <= 2.0}
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "bench_vision.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
