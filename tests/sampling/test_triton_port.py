"""The RNG definition ports to Triton: tl.philox with the documented counter layout reproduces
the scalar oracle's Gumbel noise bit for bit. On CPU the kernel runs in the Triton interpreter;
with NINFER_TEST_DEVICE=cuda it runs on the GPU, libdevice logarithms included."""

import os

import torch
import triton  # tests/conftest.py chose the interpreter on CPU before this import
import triton.language as tl

from ninfer.sampling.philox import gumbel_scalar

ON_GPU = os.environ.get("NINFER_TEST_DEVICE") == "cuda" and torch.cuda.is_available()
assert ON_GPU or os.environ.get("TRITON_INTERPRET") == "1", "Triton on CPU needs TRITON_INTERPRET=1 before import"


@triton.jit
def noise_kernel(out_ptr, seed, pos_lo, pos_hi, vocab, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    block = (offs >> 2).to(tl.uint32)
    zero = block * 0
    w0, w1, w2, w3 = tl.philox(seed, block, zero + pos_lo, zero + pos_hi, zero)
    lane = offs & 3
    bits = tl.where(lane == 0, w0, tl.where(lane == 1, w1, tl.where(lane == 2, w2, w3)))
    u = ((bits >> 9) * 2 + 1).to(tl.float32) * 5.9604644775390625e-08  # 2^-24, exact
    g = (-tl.log(-tl.log(u.to(tl.float64)))).to(tl.float32)
    tl.store(out_ptr + offs, g, mask=offs < vocab)


def test_triton_philox_reproduces_the_oracle():
    vocab = 37
    for seed, position in [(0, 0), ((1 << 64) - 1, 7), (1234567890123, (1 << 32) + 5)]:
        out = torch.empty(vocab, device="cuda" if ON_GPU else "cpu")
        noise_kernel[(1,)](out, seed, position & 0xFFFFFFFF, position >> 32, vocab, BLOCK=64)
        assert out.cpu().tolist() == [gumbel_scalar(seed, position, i) for i in range(vocab)]
