"""Programmatic dependent launch (PDL, sm_90 and later) for the decode path's Triton kernels.

A kernel launched with PDL may be placed on the SMs while the kernel before it in the stream still drains; it calls
``enter`` first, which lets the kernel after it be placed likewise (``gdc_launch_dependents``) and then waits until
the kernel before it has finished and its writes are visible (``gdc_wait``). Nothing is read or written before that
wait, so the order of the stream holds for every buffer, through chains of PDL kernels too (each one's wait covers
the one before, which waited for its own). Launches that are not PDL (cuBLAS, torch ops) wait for the whole kernel
before them as always. The launches inside the CUDA graphs keep the attribute.

One switch for every kernel that takes it: ``ENABLED``, read once from ``NINFER_PDL`` (``0`` turns it off; the
benchmarks' A/B). Off a CUDA device (CPU, the Triton interpreter) there is nothing to launch this way.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

ENABLED = os.environ.get("NINFER_PDL", "1") != "0"


@functools.cache
def _capable(index: int) -> bool:
    # griddepcontrol is PTX for sm_90 and later; a ROCm build reports its gfx arch as a "capability" too
    return torch.version.hip is None and torch.cuda.get_device_capability(index)[0] >= 9


def active(t: torch.Tensor) -> bool:
    """Whether a kernel over t launches with PDL: the switch on, t on a CUDA device of sm_90 or later."""
    return ENABLED and t.is_cuda and _capable(t.device.index if t.device.index is not None else 0)


def launch(on: bool) -> dict:
    """The launch options of a kernel whose ``PDL`` constexpr is ``on``."""
    return {"launch_pdl": True} if on else {}


@triton.jit
def enter(PDL: tl.constexpr):
    """A PDL kernel's first statement: the next kernel may be placed now; this one waits for the one before."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
