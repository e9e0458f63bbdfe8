"""Attention input preparation in one launch: program (token, head) normalises (zero-centred RMSNorm, optional) and
rotates one q or k head (partial NeoX RoPE from fp32 angles), writes q back and stores k, plus the matching v head,
into the token's KV-cache slot. Used by decode (one token per sequence) and prefill alike. With 3-row MRoPE
positions (a prompt with images) each rotary dim loads its frequency's row (``MROPE``); the text path is unchanged.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.fast.ops import pdl

from .naive import mrope_rows, rope_inv_freq


@triton.jit
def _norm_rope(x_ptr, w_ptr, inv_ptr, pos, eps, HAS_NORM: tl.constexpr, D: tl.constexpr, RD: tl.constexpr,
               BD: tl.constexpr):
    d = tl.arange(0, BD)
    md = d < D
    half = RD // 2
    rot = d < RD
    # rotate_half([a, b]) = [-b, a]: each rotary dim pairs with the one half a rotary width away
    partner = tl.where(d < half, d + half, d - half)
    x = tl.load(x_ptr + d, mask=md, other=0.0).to(tl.float32)
    xp = tl.load(x_ptr + partner, mask=rot, other=0.0).to(tl.float32)
    if HAS_NORM:
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
        x = x * rstd * (1.0 + tl.load(w_ptr + d, mask=md, other=0.0).to(tl.float32))
        xp = xp * rstd * (1.0 + tl.load(w_ptr + partner, mask=rot, other=0.0).to(tl.float32))
    ang = pos * tl.load(inv_ptr + d % half, mask=rot, other=0.0)  # pos: a scalar, or [BD] per dim (MRoPE)
    return tl.where(rot, x * tl.cos(ang) + tl.where(d < half, -xp, xp) * tl.sin(ang), x)


@triton.jit
def _rope_kv_write_kernel(q_ptr, k_ptr, v_ptr, qo_ptr, pos_ptr, slot_ptr, kp_ptr, vp_ptr, qw_ptr, kw_ptr, inv_ptr,
                          rows_ptr, eps, sq0, sq1, sk0, sk1, sv0, sv1, so0, so1, sp0,
                          NH: tl.constexpr, NKV: tl.constexpr, D: tl.constexpr, RD: tl.constexpr,
                          HAS_QN: tl.constexpr, HAS_KN: tl.constexpr, BD: tl.constexpr, MROPE: tl.constexpr,
                          PDL: tl.constexpr = False):
    pdl.enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    d = tl.arange(0, BD)
    if MROPE:  # positions [3, T]: dim d rotates by its frequency's row
        row = tl.load(rows_ptr + d % (RD // 2), mask=d < RD, other=0)
        pos = tl.load(pos_ptr + row * sp0 + t, mask=d < RD, other=0).to(tl.float32)
    else:
        pos = tl.load(pos_ptr + t).to(tl.float32)
    if h < NH:
        y = _norm_rope(q_ptr + t * sq0 + h * sq1, qw_ptr, inv_ptr, pos, eps, HAS_QN, D, RD, BD)
        tl.store(qo_ptr + t * so0 + h * so1 + d, y.to(qo_ptr.dtype.element_ty), mask=d < D)
    else:
        kh = h - NH
        y = _norm_rope(k_ptr + t * sk0 + kh * sk1, kw_ptr, inv_ptr, pos, eps, HAS_KN, D, RD, BD)
        slot = tl.load(slot_ptr + t).to(tl.int64)
        # slot -1 (a padding row) writes nothing; the limit keeps the mask a tensor for the interpreter
        live = d < tl.where(slot >= 0, D, 0)
        dst = slot * NKV * D + kh * D + d
        tl.store(kp_ptr + dst, y.to(kp_ptr.dtype.element_ty), mask=live)
        v = tl.load(v_ptr + t * sv0 + kh * sv1 + d, mask=d < D, other=0.0)
        tl.store(vp_ptr + dst, v.to(vp_ptr.dtype.element_ty), mask=live)


_INV_FREQ: dict[tuple, torch.Tensor] = {}
_ROWS: dict[tuple, torch.Tensor] = {}


def _inv_freq(rotary_dim: int, theta: float, device: torch.device) -> torch.Tensor:
    key = (rotary_dim, theta, str(device))
    if key not in _INV_FREQ:
        _INV_FREQ[key] = rope_inv_freq(rotary_dim, theta, device)
    return _INV_FREQ[key]


def rope_kv_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                  slot_mapping: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, rotary_dim: int,
                  theta: float, q_norm_weight: torch.Tensor | None = None, k_norm_weight: torch.Tensor | None = None,
                  eps: float = 1e-6, q_out: torch.Tensor | None = None, mrope_section=None) -> torch.Tensor:
    """Same contract as ``rope_kv_write_naive``. q, k, v may be strided views (last dim contiguous), e.g. q taken
    out of q_proj's [T, nh, 2d] query/gate rows; ``q_out`` may be q itself (in place). Returns the rotated q.
    positions [3, T] (contiguous rows) need ``mrope_section``; the row table is made once per section and device,
    so the first MRoPE call must not be under graph capture (image prefill is never captured)."""
    T, NH, D = q.shape
    NKV = k.shape[1]
    assert q.stride(2) == 1 and k.stride(2) == 1 and v.stride(2) == 1 and rotary_dim % 2 == 0 and rotary_dim <= D
    assert k_pages.is_contiguous() and v_pages.is_contiguous() and k_pages.shape[2:] == (NKV, D)
    q_out = torch.empty_like(q) if q_out is None else q_out
    inv = _inv_freq(rotary_dim, theta, q.device)
    qw = q_norm_weight if q_norm_weight is not None else inv
    kw = k_norm_weight if k_norm_weight is not None else inv
    mrope = positions.ndim == 2
    rows = inv
    if mrope:
        assert positions.shape == (3, T) and positions.stride(1) == 1 and mrope_section is not None
        key = (rotary_dim, tuple(mrope_section), str(q.device))
        if key not in _ROWS:
            _ROWS[key] = mrope_rows(rotary_dim // 2, mrope_section).to(device=q.device, dtype=torch.int32)
        rows = _ROWS[key]
    on = pdl.active(q)
    _rope_kv_write_kernel[(T, NH + NKV)](
        q, k, v, q_out, positions, slot_mapping, k_pages, v_pages, qw, kw, inv, rows, eps,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), q_out.stride(0),
        q_out.stride(1), positions.stride(0) if mrope else 0, NH=NH, NKV=NKV, D=D, RD=rotary_dim,
        HAS_QN=q_norm_weight is not None, HAS_KN=k_norm_weight is not None, BD=triton.next_power_of_2(D),
        MROPE=mrope, PDL=on, **pdl.launch(on))
    return q_out
