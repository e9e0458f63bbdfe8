"""gdn_chunk kernels vs the token-by-token recurrence: partial last chunks, T < C, initial state or none, GVA
grouping, odd head dims, every chunk-boundary state, chunks restarting at cuts (the state at a cut equals a call
split there); and the prefill conv vs its naive form, continuing from a
window, with an in-place window update."""

import pytest
import torch

from _device import DEVICE, IO_DTYPES, ON_GPU
from ninfer.fast.ops.gdn_chunk import (chunk_ends, conv_window_at, gdn_chunk, gdn_chunk_naive, gdn_conv_prefill,
                                       gdn_conv_prefill_naive)
from ninfer.testing.numerics import assert_close

# (T, HK, HV, dk, dv, chunk): the GPU checks Qwen3.5-9B GDN dims at real chunk size 64
SHAPES = ([(1, 16, 32, 128, 128, 64), (63, 16, 32, 128, 128, 64), (1000, 16, 32, 128, 128, 64),
           (200, 16, 48, 128, 128, 64)] if ON_GPU
          else [(37, 1, 2, 20, 12, 16), (5, 2, 4, 100, 16, 16), (130, 1, 1, 16, 16, 64)])


def _inputs(T, HK, HV, dk, dv, dtype):
    C = 2 * HK * dk + HV * dv
    mk = lambda *s, scale=1.0: (scale * torch.randn(*s, device=DEVICE)).to(dtype)  # noqa: E731
    x = dict(qkv=mk(T, C), z=mk(T, HV * dv), a=mk(T, HV), b=mk(T, HV))
    w = dict(A_log=torch.randn(HV, device=DEVICE).clamp(-3, 0.5), dt_bias=torch.randn(HV, device=DEVICE),
             norm_weight=mk(dv, scale=0.2) + 1)
    return x, w


def _tol(dtype):
    # GPU dots on fp32 operands run as TF32; bf16 io rounds the inputs and the output
    return 2e-2 if dtype == torch.bfloat16 else (5e-3 if ON_GPU else 1e-5)


@pytest.mark.parametrize("dtype", IO_DTYPES, ids=str)
@pytest.mark.parametrize("with_state", [False, True], ids=["zero_state", "initial_state"])
@pytest.mark.parametrize("T,HK,HV,dk,dv,chunk", SHAPES)
def test_gdn_chunk(T, HK, HV, dk, dv, chunk, with_state, dtype):
    x, w = _inputs(T, HK, HV, dk, dv, dtype)
    s0 = 0.2 * torch.randn(HV, dk, dv, device=DEVICE) if with_state else None
    y_ref, st_ref = gdn_chunk_naive(**x, **w, initial_state=s0, num_k_heads=HK, head_k_dim=dk, head_v_dim=dv,
                                    chunk_size=chunk)
    y, st = gdn_chunk(**x, **w, initial_state=s0, num_k_heads=HK, head_k_dim=dk, head_v_dim=dv, chunk_size=chunk)
    assert_close("gdn_chunk.y", y_ref, y, _tol(dtype))
    assert_close("gdn_chunk.states", st_ref, st, _tol(dtype))


def test_gdn_chunk_correlated_keys_no_decay():
    # the hard case for the triangular inverse: nearly parallel keys, beta near 1, almost no decay
    T, HK, HV, dk, dv = (128, 16, 32, 128, 128) if ON_GPU else (64, 1, 1, 16, 16)
    x, w = _inputs(T, HK, HV, dk, dv, torch.float32)
    base = torch.randn(1, HK * dk, device=DEVICE)
    x["qkv"][:, HK * dk:2 * HK * dk] = base + 0.1 * torch.randn(T, HK * dk, device=DEVICE)
    x["b"].fill_(6.0)
    w["A_log"].fill_(-8.0)
    kw = dict(num_k_heads=HK, head_k_dim=dk, head_v_dim=dv, chunk_size=64)
    y_ref, st_ref = gdn_chunk_naive(**x, **w, initial_state=None, **kw)
    y, st = gdn_chunk(**x, **w, initial_state=None, **kw)
    # TF32 dots on an ill-conditioned WY system: measured 3e-3 (y) and 4e-3 (S) on the H200
    tol = 1e-2 if ON_GPU else 1e-5
    assert_close("gdn_chunk.correlated_y", y_ref, y, tol)
    assert_close("gdn_chunk.correlated_states", st_ref, st, tol)


def test_gdn_chunk_resumes_from_its_own_checkpoint():
    # prefill split at a chunk boundary, the second call starting from the first call's last state, equals one call
    T, split, HK, HV, dk, dv = 40, 16, 1, 2, 16, 16
    x, w = _inputs(T, HK, HV, dk, dv, torch.float32)
    kw = dict(num_k_heads=HK, head_k_dim=dk, head_v_dim=dv, chunk_size=16)
    y_ref, st_ref = gdn_chunk_naive(**x, **w, initial_state=None, **kw)
    head = {n: t[:split] for n, t in x.items()}
    tail = {n: t[split:] for n, t in x.items()}
    y1, st1 = gdn_chunk(**head, **w, initial_state=None, **kw)
    y2, st2 = gdn_chunk(**tail, **w, initial_state=st1[-1].contiguous(), **kw)
    assert_close("gdn_chunk.resumed_y", y_ref, torch.cat([y1, y2]), _tol(torch.float32))
    assert_close("gdn_chunk.resumed_states", st_ref, torch.cat([st1, st2]), _tol(torch.float32))


# (T, chunk, cuts): a cut on and off the chunk grid, at the first and the last token, two cuts in one chunk
CUT_SHAPES = ([(1000, 64, (1, 64, 100, 999)), (200, 64, (130, 131))] if ON_GPU
              else [(37, 16, (1, 5, 36)), (40, 16, (16, 17, 30)), (70, 64, (63,))])


def test_chunk_ends():
    assert chunk_ends(130, 64) == [64, 128, 130]
    assert chunk_ends(130, 64, (10, 64)) == [10, 64, 128, 130]
    assert chunk_ends(40, 16, (16, 17, 30)) == [16, 17, 30, 40]
    for bad in ((0,), (40,), (5, 5), (9, 3)):
        with pytest.raises(ValueError, match="cuts"):
            chunk_ends(40, 16, bad)


@pytest.mark.parametrize("T,chunk,cuts", CUT_SHAPES)
def test_gdn_chunk_cuts(T, chunk, cuts):
    # one call with cuts: y as without cuts, one state per chunk of the restarted grid, and the state at each cut
    # equal to the final state of a call that ends there (the checkpoint a cut piece would have captured)
    HK, HV, dk, dv = (16, 32, 128, 128) if ON_GPU else (1, 2, 20, 12)
    x, w = _inputs(T, HK, HV, dk, dv, torch.float32)
    kw = dict(num_k_heads=HK, head_k_dim=dk, head_v_dim=dv, chunk_size=chunk)
    s0 = 0.2 * torch.randn(HV, dk, dv, device=DEVICE)
    ends = chunk_ends(T, chunk, cuts)
    y_ref, st_ref = gdn_chunk_naive(**x, **w, initial_state=s0, cuts=cuts, **kw)
    y, st = gdn_chunk(**x, **w, initial_state=s0, cuts=cuts, **kw)
    assert st.shape[0] == st_ref.shape[0] == len(ends)
    assert_close("gdn_chunk.cut_y", y_ref, y, _tol(torch.float32))
    assert_close("gdn_chunk.cut_states", st_ref, st, _tol(torch.float32))
    for c in cuts:
        _, st_head = gdn_chunk(**{n: t[:c] for n, t in x.items()}, **w, initial_state=s0, **kw)
        assert_close(f"gdn_chunk.state_at_{c}", st_head[-1], st[ends.index(c)], _tol(torch.float32))


@pytest.mark.parametrize("dtype", IO_DTYPES, ids=str)
@pytest.mark.parametrize("window_out", ["in_place", "new", "given"])
@pytest.mark.parametrize("T,C", [(1, 40), (2, 70), (37, 130), (100, 136)] if not ON_GPU
                         else [(1, 8192), (1000, 8192), (8192, 8192)])
def test_gdn_conv_prefill(T, C, window_out, dtype):
    # m is a strided view of a wider projection row, like in_proj's [qkv | z | b | a] output; T=100 spans four
    # row blocks, so the halo rows come from the previous block and only the first reads the window
    m = torch.randn(T, C + 24, device=DEVICE).to(dtype)[:, :C]
    window = torch.randn(C, 3, device=DEVICE).to(dtype)
    weight = (0.5 * torch.randn(C, 1, 4, device=DEVICE)).to(dtype)
    out_ref, win_ref = gdn_conv_prefill_naive(m, window, weight)
    old = window.clone()
    dest = {"in_place": window, "new": None, "given": torch.full_like(window, float("nan"))}[window_out]
    out, win = gdn_conv_prefill(m, window, weight, window_out=dest)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    assert_close("gdn_conv_prefill.out", out_ref, out, tol)
    assert_close("gdn_conv_prefill.window", win_ref, win, tol)
    if window_out == "in_place":
        assert win.data_ptr() == window.data_ptr()
    else:
        assert torch.equal(window, old) and win.data_ptr() != window.data_ptr()


@pytest.mark.parametrize("end", [1, 2, 3, 7])
def test_conv_window_at_matches_a_split_prefill(end):
    # inside the incoming window's reach (end < K-1) and past it
    m = torch.randn(9, 6, device=DEVICE)
    window = torch.randn(6, 3, device=DEVICE)
    weight = torch.randn(6, 1, 4, device=DEVICE)
    out_ref, _ = gdn_conv_prefill_naive(m, window, weight)
    _, win_head = gdn_conv_prefill_naive(m[:end], window, weight)
    mid = conv_window_at(m, window, end)
    assert torch.equal(mid, win_head)
    out_tail, _ = gdn_conv_prefill(m[end:].contiguous(), mid, weight)
    assert_close("gdn_conv_prefill.resumed", out_ref[end:], out_tail, 1e-5)


# (T real rows, padded rows, chunk): a short last chunk, chunks wholly of padding, one real row
PAD_SHAPES = ([(100, 512, 64), (64, 128, 64), (1, 64, 64)] if ON_GPU else [(37, 64, 16), (16, 64, 16), (1, 16, 16)])


@pytest.mark.parametrize("T,padded,chunk", PAD_SHAPES)
def test_padded_rows_change_nothing(T, padded, chunk):
    """A piece padded to a graph bucket, its real length a device value: the real rows' outputs, the states of the
    real chunks, the final state (written by the state pass into `final_state`) and the conv window equal the
    unpadded call's bit for bit; the padding rows hold NaN, so reading one would show."""
    HK, HV, dk, dv = (16, 32, 128, 128) if ON_GPU else (1, 2, 20, 12)
    x, w = _inputs(T, HK, HV, dk, dv, torch.float32)
    pad = {n: torch.cat([t, torch.full((padded - T, t.shape[1]), float("nan"), device=DEVICE)]) for n, t in x.items()}
    length = torch.tensor([T], dtype=torch.int32, device=DEVICE)
    kw = dict(num_k_heads=HK, head_k_dim=dk, head_v_dim=dv, chunk_size=chunk)
    s0 = 0.2 * torch.randn(HV, dk, dv, device=DEVICE)
    for op in (gdn_chunk, gdn_chunk_naive):
        y_ref, st_ref = op(**x, **w, initial_state=s0, **kw)
        final = torch.full_like(s0, float("nan"))
        y, st = op(**pad, **w, initial_state=s0, length=length, final_state=final, **kw)
        assert torch.equal(y[:T], y_ref) and torch.equal(st[:st_ref.shape[0]], st_ref)
        assert torch.equal(final, st_ref[-1])
    C = x["qkv"].shape[1]
    window, weight = torch.randn(C, 3, device=DEVICE), 0.5 * torch.randn(C, 1, 4, device=DEVICE)
    for op in (gdn_conv_prefill, gdn_conv_prefill_naive):
        out_ref, win_ref = op(x["qkv"], window, weight)
        out, win = op(pad["qkv"], window, weight, length=length)
        assert torch.equal(out[:T], out_ref) and torch.equal(win, win_ref)
