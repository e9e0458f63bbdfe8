"""Builds dflash_walk's kernel for sm_90 at the published selector (top-16, rank 256; ``ninfer.testing.sm90``) and
prints one JSON line per codebook dtype. Run without TRITON_INTERPRET: ``test_dflash_walk.py`` starts it as a
subprocess."""

import json
import sys

from ninfer.fast.ops.dflash_walk import triton as dw
from ninfer.testing.sm90 import build_sm90

STRIDES = ("stride_ur", "stride_uj", "stride_cr", "stride_cj", "stride_pr", "stride_pj", "stride_a", "stride_b",
           "stride_d")


def build(io: str):
    types = dict(u_ptr="*fp32", c_ptr="*i64", p_ptr=f"*{io}", a0_ptr="*i32", a_ptr=f"*{io}", b_ptr=f"*{io}",
                 room_ptr="*i32", d_ptr="*i64", n_ptr="*i32", KD="i32", K="i32", R="i32", V="i32",
                 **{n: "i32" for n in STRIDES})
    b = build_sm90(dw._dflash_walk_kernel, types, dict(BLOCK_K=16, BLOCK_R=256), num_warps=4, num_stages=1,
                   divisible=STRIDES)
    print(json.dumps(dict(io=io, registers=b.registers, spill=b.spill_bytes, shared=b.shared_bytes)), flush=True)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        build(arg)
