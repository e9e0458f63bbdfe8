"""Numerical comparison and NaN poisoning for kernel tests.

``assert_close`` is the one tolerance rule: relative RMS error ``rms(out - ref) / rms(ref) < ratio``, with an
absolute short-circuit for refs that are (nearly) all zeros, and hard failures on NaN/Inf. ``nan_poisoning`` makes
``torch.empty``-style allocations made from inside ``ninfer.fast`` return NaN-filled tensors, so a kernel that leaves
part of its output unwritten fails the comparison instead of passing on lucky leftover memory.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

import torch


def assert_close(name: str, ref: torch.Tensor, out: torch.Tensor, ratio: float, atol: float = 1e-6) -> None:
    """Fail unless ``out`` matches ``ref`` to relative RMS error ``ratio``; ``name`` names the op in the message."""
    assert ref.shape == out.shape, f"{name}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    r = ref.detach().to("cpu", torch.float64)
    o = out.detach().to("cpu", torch.float64)
    assert torch.isfinite(r).all(), f"{name}: the reference itself has NaN/Inf"
    bad = (~torch.isfinite(o)).sum().item()
    assert bad == 0, f"{name}: {bad} of {o.numel()} output elements are NaN/Inf (unwritten or overflow)"
    diff = o - r
    max_abs = diff.abs().max().item() if diff.numel() else 0.0
    # all-zero (or tiny) references make the ratio meaningless; judge them by absolute error alone.
    if max_abs <= atol:
        return
    ref_rms = r.pow(2).mean().sqrt().item()
    err = diff.pow(2).mean().sqrt().item() / max(ref_rms, 1e-30)
    assert err < ratio, (f"{name}: relative RMS error {err:.3e} >= {ratio:.1e} "
                         f"(max abs diff {max_abs:.3e}, ref rms {ref_rms:.3e}, shape {tuple(r.shape)})")


def _poisoned(fn, owner: str):
    def wrapper(*args, **kwargs):
        t = fn(*args, **kwargs)
        # only allocations made by the code under test are poisoned; torch and triton internals are left alone.
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith(owner) and t.is_floating_point():
            t.fill_(float("nan"))
        return t
    return wrapper


@contextlib.contextmanager
def nan_poisoning(owner: str = "ninfer.fast") -> Iterator[None]:
    """Within the block, floating ``torch.empty``/``empty_like``/``Tensor.new_empty`` called from ``owner`` return
    NaN-filled tensors."""
    saved = (torch.empty, torch.empty_like, torch.Tensor.new_empty)
    torch.empty = _poisoned(saved[0], owner)
    torch.empty_like = _poisoned(saved[1], owner)
    torch.Tensor.new_empty = _poisoned(saved[2], owner)
    try:
        yield
    finally:
        torch.empty, torch.empty_like, torch.Tensor.new_empty = saved


def nan_like(t: torch.Tensor) -> torch.Tensor:
    """A NaN-filled tensor shaped like ``t``, for output buffers that tests hand to a kernel."""
    return torch.full_like(t, float("nan"))
