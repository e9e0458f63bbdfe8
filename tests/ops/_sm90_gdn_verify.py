"""Builds gdn_verify's kernel for sm_90 at the 9B GDN shape (``ninfer.testing.sm90``) and prints one JSON line per
(io dtype, block width). Run without TRITON_INTERPRET: ``test_gdn_verify.py`` starts it as a subprocess."""

import json
import sys

from ninfer.fast.ops.gdn_verify import triton as gv
from ninfer.testing.sm90 import build_sm90

HK, HV, DK, DV = 16, 32, 128, 128


def build(io: str, W: int):
    ptrs = dict(x_ptr=io, conv_ptr=io, cw_ptr=io, z_ptr=io, a_ptr=io, b_ptr=io, alog_ptr="fp32", dtb_ptr="fp32",
                nw_ptr=io, s_ptr="fp32", slot_ptr="i32", cu_ptr="i32", outs_ptr="i32", o_ptr="fp32", cnt_ptr="i32",
                y_ptr=io)
    types = {k: f"*{v}" for k, v in ptrs.items()}
    types.update({n: "i32" for n in ("stride_x", "stride_conv", "stride_z", "stride_a", "stride_b", "stride_slot",
                                     "stride_y", "stride_outs")}, scale="fp32", eps="fp32")
    b = build_sm90(gv._verify_kernel, types, dict(W=W, HK=HK, HV=HV, DK=DK, DV=DV, G=HV // HK, BK=128, BV=32, NV=4,
                                                  BVF=128), num_warps=4, num_stages=1,
                   divisible=("stride_x", "stride_conv", "stride_z", "stride_a", "stride_b", "stride_y"))
    print(json.dumps(dict(io=io, W=W, registers=b.registers, spill=b.spill_bytes, shared=b.shared_bytes,
                          per_sm=b.programs_per_sm)), flush=True)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        io, w = arg.split(":")
        build(io, int(w))
