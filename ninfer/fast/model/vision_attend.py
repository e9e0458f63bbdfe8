"""Which attention the fast vision tower runs, measured once at start.

The candidates are this project's Triton kernel (``ops/vision_attention``) at a few tile shapes, writing into the
planned workspace, and torch's fused SDPA backends over the frames as a batch (flash, cuDNN, memory-efficient;
``ops/vision_attention/sdpa.py``). Which is fastest at the tower's head dim (72, not a power of two) depends on the
GPU, torch's build and the image size, so ``measure`` times each at the largest image on random inputs (after one
untimed run that compiles it) and keeps the fastest whose output agrees with attention computed in fp32 by torch
(`reference`: a slice of queries and heads, small at any image size) within bf16 rounding. The reference is not a
candidate: on the H100 and H200 the Triton kernel's bf16 output once had wrong columns at head dim 72 (Triton 3.6),
and measured against it every correct candidate disagreed. A candidate that raises (a backend that does not
support the shape or the layout), writes NaN or disagrees is skipped with the reason recorded; when none is left
the tower does not start, and the error lists every candidate's reason. Off CUDA nothing is timed: the default
tile (or the naive op) runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

# (q, k, v [N, nh, d], cu_seqlens [F+1], frame_len, out [N, nh, d]) -> [N, nh, d] (out, or the backend's tensor)
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor], torch.Tensor]
AGREE = 2e-2  # relative RMS against fp32 math: bf16 rounding of probabilities and outputs, not a bug
REF_ROWS, REF_HEADS = 256, 2  # the reference's slice: [256 queries, 2 heads] against every key of the first frame


@dataclass(frozen=True)
class AttentionChoice:
    name: str
    # each candidate's measured ms per call at the measured size, or why it was skipped
    timings: tuple[tuple[str, float | str], ...] = ()


def _triton(tile, q, k, v, cu, frame_len, out):
    from ninfer.fast.ops.vision_attention import vision_attention

    return vision_attention(q, k, v, cu, max_seqlen=frame_len, out=out, tile=tile)


def _sdpa(backend, q, k, v, cu, frame_len, out):
    from ninfer.fast.ops.vision_attention import frames_sdpa

    return frames_sdpa(q, k, v, frame_len, backend)


def _naive(q, k, v, cu, frame_len, out):
    from ninfer.fast.ops.vision_attention import vision_attention_naive

    return vision_attention_naive(q, k, v, cu)


def candidates(kernels: str, device: torch.device) -> dict[str, Attend]:
    """The candidates in preference order (the first is the default and the agreement reference)."""
    if kernels == "naive":
        return {"naive": _naive}
    from ninfer.fast.ops.vision_attention import TILES
    from ninfer.fast.ops.vision_attention.sdpa import BACKENDS

    found: dict[str, Attend] = {f"triton {bm}x{bn} w{w} s{s}": partial(_triton, (bm, bn, w, s))
                                for bm, bn, w, s in TILES}
    if device.type == "cuda":
        found.update({f"sdpa {b}": partial(_sdpa, b) for b in BACKENDS})
    return found


def _rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    d = (a.float() - b.float()).pow(2).mean().sqrt()
    return (d / b.float().pow(2).mean().sqrt().clamp_min(1e-30)).item()


def _ms(fn: Callable[[], torch.Tensor], repeats: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, frame_len: int) -> torch.Tensor:
    """The attention of the first frame's first REF_ROWS queries at its first REF_HEADS heads, in fp32 by torch:
    [rows, heads, d]. q, k, v [N, nh, d]; scale d^-0.5, every candidate's default."""
    r, h = min(REF_ROWS, frame_len), min(REF_HEADS, q.shape[1])
    qs, ks, vs = q[:r, :h].float(), k[:frame_len, :h].float(), v[:frame_len, :h].float()
    p = torch.softmax(torch.einsum("qhd,khd->hqk", qs, ks) * q.shape[-1] ** -0.5, dim=-1)  # [h, r, frame_len]
    return torch.einsum("hqk,khd->qhd", p, vs)


def measure(found: dict[str, Attend], q, k, v, cu, frame_len: int, out: torch.Tensor, repeats: int = 3,
            timer: Callable[[Callable[[], torch.Tensor], int], float] = _ms) -> AttentionChoice:
    """Time every candidate on these inputs (``timer``: CUDA events) and return the fastest whose output agrees
    with `reference`; RuntimeError naming each candidate's reason when none does."""
    ref = reference(q, k, v, frame_len)
    r, h = ref.shape[:2]
    timings: list[tuple[str, float | str]] = []
    for name, attend in found.items():
        fn = partial(attend, q, k, v, cu, frame_len, out)
        try:
            got = fn()[:r, :h]
        # an SDPA backend that refuses this shape, layout or device (RuntimeError), a tile that does not fit
        # this GPU's shared memory (Triton's OutOfResources, not a RuntimeError): skipped, not fatal at start
        except Exception as e:  # noqa: BLE001
            timings.append((name, f"skipped: {str(e).splitlines()[0][:120]}"))
            continue
        err = _rel_rms(got, ref)
        if not err < AGREE:  # NaN too
            timings.append((name, f"skipped: relative RMS {err:.1e} against fp32 attention"))
            continue
        timings.append((name, timer(fn, repeats)))
    timed = [(ms, name) for name, ms in timings if isinstance(ms, float)]
    if not timed:
        raise RuntimeError("no vision attention candidate agrees with fp32 attention: "
                           + "; ".join(f"{n}: {t}" for n, t in timings))
    return AttentionChoice(min(timed)[1], tuple(timings))
