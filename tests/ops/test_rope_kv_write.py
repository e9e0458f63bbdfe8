"""rope_kv_write vs naive: partial rotary on odd head dims, with and without the fused q/k norm, strided q (the
query half of q_proj's query/gate rows), large positions, padding slots, in-place q."""

import pytest
import torch

from _device import DEVICE, IO_DTYPES, ON_GPU
from ninfer.fast.ops.rope_kv_write import rope_kv_write, rope_kv_write_naive
from ninfer.testing.numerics import assert_close

# (T, nh, nkv, d, rotary_dim, page_size): the GPU checks the 9B dims (head_dim 256, rotary 64)
CASES = ([(1, 16, 4, 256, 64, 16), (2048, 16, 4, 256, 64, 16), (300, 24, 4, 256, 64, 32)] if ON_GPU
         else [(7, 6, 2, 60, 20, 5), (3, 4, 4, 32, 32, 4)])


@pytest.mark.parametrize("dtype", IO_DTYPES, ids=str)
@pytest.mark.parametrize("with_norm", [False, True], ids=["rope", "norm_rope"])
@pytest.mark.parametrize("T,nh,nkv,d,rd,page_size", CASES)
def test_rope_kv_write(T, nh, nkv, d, rd, page_size, with_norm, dtype):
    qg = torch.randn(T, nh, 2 * d, device=DEVICE).to(dtype)
    q = qg[:, :, :d]  # strided: the gate half stays interleaved
    k = torch.randn(T, nkv, d, device=DEVICE).to(dtype)
    v = torch.randn(T, nkv, d, device=DEVICE).to(dtype)
    positions = torch.randint(0, 200_000, (T,), device=DEVICE)
    pages = -(-T // page_size) + 2
    slots = torch.randperm(pages * page_size, device=DEVICE)[:T]
    slots[T // 2] = -1
    k_pages = torch.randn(pages, page_size, nkv, d, device=DEVICE).to(dtype)
    v_pages = torch.randn(pages, page_size, nkv, d, device=DEVICE).to(dtype)
    kp_ref, vp_ref = k_pages.clone(), v_pages.clone()
    wq = (0.1 * torch.randn(d, device=DEVICE)).to(dtype) if with_norm else None
    wk = (0.1 * torch.randn(d, device=DEVICE)).to(dtype) if with_norm else None
    q_ref = rope_kv_write_naive(q, k, v, positions, slots, kp_ref, vp_ref, rd, 1e7, wq, wk)
    gate = qg[:, :, d:].clone()
    q_out = rope_kv_write(q, k, v, positions, slots, k_pages, v_pages, rd, 1e7, wq, wk, q_out=q)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    assert_close("rope_kv_write.q", q_ref, q_out, tol)
    assert torch.equal(qg[:, :, d:], gate)
    assert_close("rope_kv_write.k_pages", kp_ref, k_pages, tol)
    assert torch.equal(vp_ref, v_pages)


@pytest.mark.parametrize("dtype", IO_DTYPES, ids=str)
@pytest.mark.parametrize("T,nh,nkv,d,rd,section", [(9, 4, 2, 60, 20, (4, 3, 3)), (5, 2, 1, 32, 8, (2, 1, 1))]
                         if not ON_GPU else [(4096, 16, 4, 256, 64, (11, 11, 10))])
def test_mrope_rows(T, nh, nkv, d, rd, section, dtype):
    """3-row MRoPE positions: each frequency rotates by its row; the naive form is the reference model's rotary
    (ninfer.reference.rope.mrope_cos_sin), and three equal rows are the text path exactly."""
    from ninfer.reference.attention import apply_rope
    from ninfer.reference.rope import mrope_cos_sin

    q = torch.randn(T, nh, d, device=DEVICE).to(dtype)
    k = torch.randn(T, nkv, d, device=DEVICE).to(dtype)
    v = torch.randn(T, nkv, d, device=DEVICE).to(dtype)
    positions = torch.randint(0, 5000, (3, T), device=DEVICE)
    page_size, pages = 4, -(-T // 4) + 1
    slots = torch.randperm(pages * page_size, device=DEVICE)[:T]
    k_pages = torch.zeros(pages, page_size, nkv, d, device=DEVICE).to(dtype)
    v_pages = torch.zeros_like(k_pages)
    kp_ref, vp_ref = k_pages.clone(), v_pages.clone()
    q_ref = rope_kv_write_naive(q, k, v, positions, slots, kp_ref, vp_ref, rd, 1e7, mrope_section=section)
    q_out = rope_kv_write(q, k, v, positions, slots, k_pages, v_pages, rd, 1e7, mrope_section=section)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    assert_close("rope_kv_write.mrope.q", q_ref, q_out, tol)
    assert_close("rope_kv_write.mrope.k_pages", kp_ref, k_pages, tol)
    inv = 1.0 / (1e7 ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))
    cos, sin = mrope_cos_sin(positions.cpu(), inv, 1.0, section, torch.float32)
    want = apply_rope(q.float().cpu().transpose(0, 1), cos, sin).transpose(0, 1)
    assert_close("rope_kv_write.mrope vs reference", want, q_ref.float().cpu(), tol)
    same = positions[:1].expand(3, T).contiguous()
    one = rope_kv_write(q, k, v, same, slots, k_pages.clone(), v_pages.clone(), rd, 1e7, mrope_section=section)
    text = rope_kv_write(q, k, v, positions[0], slots, k_pages.clone(), v_pages.clone(), rd, 1e7)
    assert torch.equal(one, text)
