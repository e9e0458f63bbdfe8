"""Per-stage breakdown of one fast vision tower encode (issue 15), for bench_vision.py: the tower calls
``marks(stage)`` after each stage's launches; this records a CUDA event there (a host clock on a CPU) and sums the
intervals per stage name over the blocks. Each stage's floor is its matrix FLOPs at the bf16 GEMM rate or its
minimal bytes at the copy bandwidth, whichever is larger (perf-anchors.md: ~790 TFLOP/s, 4.29 TB/s on the H200),
so a stage far above its floor says where an encode's time goes."""

from __future__ import annotations

import time

import torch

from ninfer.models.qwen3_5.vision_config import VisionConfig

GEMM_TFLOPS = 790.0  # measured bf16 GEMM rate on the H200 (perf-anchors.md)
COPY_TBPS = 4.29  # measured device copy bandwidth on the H200, read + write counted (perf-anchors.md)
# stage -> what its launches are, in encode order
STAGES = {"embed": "pixels to the tower's dtype, patch-embed GEMM (+bias), 4 position taps",
          "norm": "LayerNorm (+ the previous projection's bias into the residual), 2 a block",
          "qkv": "qkv GEMM, bias in the epilogue", "rotary": "2D rotary of q and k in place (fp32 math)",
          "attention": "non-causal attention per frame", "proj": "out-projection GEMM into the residual",
          "fc1": "MLP up GEMM, bias and tanh-GELU in the epilogue", "fc2": "MLP down GEMM into the residual",
          "merger": "LayerNorm, 2x2 merge, GEMM, exact GELU, GEMM"}


def stage_work(v: VisionConfig, n: int, frame_len: int, act: int = 2) -> dict[str, tuple[float, float]]:
    """stage -> (matrix FLOPs, minimal device bytes) of one encode of n patches (frames of frame_len)."""
    H, I, P, D = v.hidden_size, v.intermediate_size, v.patch_dim, v.depth
    m, rows, out = v.merge_unit * H, n // v.merge_unit, v.out_hidden_size
    act_nh = n * H * act
    return {
        "embed": (2 * n * P * H, n * P * 4 + n * P * act + act_nh),
        "norm": (0, 2 * D * 3 * act_nh),
        "qkv": (D * 2 * n * H * 3 * H, D * (act_nh + 3 * act_nh + 3 * H * H * act)),
        "rotary": (0, D * 4 * act_nh),  # read and write q and k
        "attention": (D * 4 * n * frame_len * H, D * 4 * act_nh),
        "proj": (D * 2 * n * H * H, D * (3 * act_nh + H * H * act)),
        "fc1": (D * 2 * n * H * I, D * (act_nh + n * I * act + H * I * act)),
        "fc2": (D * 2 * n * I * H, D * (n * I * act + 2 * act_nh + H * I * act)),
        "merger": (2 * rows * m * (m + out), 3 * act_nh + 2 * rows * m * act + rows * out * act),
    }


def floor_ms(flops: float, nbytes: float) -> float:
    return max(flops / (GEMM_TFLOPS * 1e12), nbytes / (COPY_TBPS * 1e12)) * 1e3


class StageTimer:
    """``tower.marks = timer.mark``: per stage name, the summed time from the previous mark to this one."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self.marks: list[tuple[str, object]] = []

    def _now(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def start(self) -> None:
        self.marks = [("start", self._now())]

    def mark(self, stage: str) -> None:
        self.marks.append((stage, self._now()))

    def totals_ms(self) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
        out: dict[str, float] = {}
        for (_, a), (stage, b) in zip(self.marks, self.marks[1:]):
            ms = a.elapsed_time(b) if self.cuda else (b - a) * 1e3
            out[stage] = out.get(stage, 0.0) + ms
        return out


def breakdown(tower, pixels: torch.Tensor, grid: tuple[int, int, int], repeats: int, device: str) -> list[dict]:
    """One row per stage: ms per encode (mean of `repeats` marked encodes), FLOPs, bytes, floor and ratio."""
    t, h, w = grid
    timer = StageTimer(device)
    tower.marks = timer.mark
    sums: dict[str, float] = {}
    try:
        for _ in range(repeats):
            timer.start()
            tower.encode(pixels, grid)
            for stage, ms in timer.totals_ms().items():
                sums[stage] = sums.get(stage, 0.0) + ms / repeats
    finally:
        tower.marks = None
    work = stage_work(tower.cfg, t * h * w, h * w, torch.finfo(tower.dtype).bits // 8)
    rows = []
    for stage, what in STAGES.items():
        flops, nbytes = work[stage]
        floor = floor_ms(flops, nbytes)
        ms = sums.get(stage, 0.0)
        rows.append({"stage": stage, "what": what, "ms": ms, "gflop": flops / 1e9, "gbytes": nbytes / 1e9,
                     "floor_ms": floor, "x_floor": ms / floor if floor else None,
                     "tflops": flops / ms / 1e9 if ms and flops else None,
                     "tbps": nbytes / ms / 1e9 if ms else None})
    return rows


def print_breakdown(image: str, rows: list[dict], total_ms: float, flop_floor_ms: float) -> None:
    print(f"  per stage, {image} (marked encodes; the unmarked encode took {total_ms:.2f} ms, its FLOP floor "
          f"{flop_floor_ms:.2f} ms):")
    print(f"  {'stage':>9} {'ms':>8} {'floor ms':>9} {'x floor':>8} {'TFLOP/s':>8} {'TB/s':>6}  what")
    for r in rows:
        xf = f"{r['x_floor']:.2f}" if r["x_floor"] is not None else "-"
        tf = f"{r['tflops']:.0f}" if r["tflops"] else "-"
        tb = f"{r['tbps']:.2f}" if r["tbps"] else "-"
        print(f"  {r['stage']:>9} {r['ms']:>8.3f} {r['floor_ms']:>9.3f} {xf:>8} {tf:>8} {tb:>6}  {r['what']}")
    s, f = sum(r["ms"] for r in rows), sum(r["floor_ms"] for r in rows)
    print(f"  {'sum':>9} {s:>8.3f} {f:>9.3f} {s / f:>8.2f}  (the stage floors' sum: FLOPs or bytes, each stage)")
