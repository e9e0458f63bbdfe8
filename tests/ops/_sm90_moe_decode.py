"""Builds moe_decode's two kernels for sm_90 at the 35B-A3B shape (``ninfer.testing.sm90``) and prints one JSON
line per (M, weight dtype, kernel). Run without TRITON_INTERPRET: ``test_moe_decode.py`` starts it as a subprocess."""

import json
import sys

import triton

from ninfer.fast.ops.moe_decode import triton as md
from ninfer.testing.sm90 import build_sm90

H, I, E, TOPK, SMS = 2048, 512, 256, 8, 132


def builds(M: int, wdt: str):
    """wdt: the stacks' element type (bf16, fp32, or fp8e4nv: FP8 stacks with fp32 block scales)."""
    cfg = md.pick_config(M, H, I, SMS)
    # every integer but M is a multiple of 16 at this shape, as the launch specialises it
    ints = md._gate_up_kernel.arg_names + md._down_kernel.arg_names
    bm, common = triton.next_power_of_2(M), dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                                                 divisible=tuple(n for n in ints if n != "M"))
    fp8 = wdt == "fp8e4nv"
    sdt = "fp32" if fp8 else wdt  # the scale planes (a dense stack passes its data again, never read)
    i32 = ["M", "E", "I", "IS", "H", "BR", "BC"]
    scales = ["stride_wse", "stride_wsn", "stride_swsn"]
    gate_types = dict(x_ptr="*bf16", logit_ptr="*bf16", w_ptr=f"*{wdt}", sw_ptr=f"*{wdt}", act_ptr="*fp32",
                      ids_ptr="*i32", rw_ptr="*fp32", ws_ptr=f"*{sdt}", sws_ptr=f"*{sdt}", **{n: "i32" for n in i32 + [
                          "stride_x", "stride_l", "stride_we", "stride_wn", "stride_sn", "stride_act"] + scales})
    gate = build_sm90(md._gate_up_kernel, gate_types, dict(TOPK=TOPK, RENORM=True, BM=bm, BE=E, BKK=TOPK,
                                                             BN=cfg.gate_bn, BK=cfg.gate_bk, EVEN_K=True, FP8=fp8,
                                                             ONE_BLOCK=fp8),
                      **common)
    down_types = dict(act_ptr="*fp32", logit_ptr="*bf16", ids_ptr="*i32", rw_ptr="*fp32", w_ptr=f"*{wdt}",
                      sw_ptr=f"*{wdt}", r_ptr="*bf16", y_ptr="*bf16", ws_ptr=f"*{sdt}", sws_ptr=f"*{sdt}",
                      **{n: "i32" for n in i32 + ["stride_l", "stride_we", "stride_wn", "stride_sn", "stride_act",
                                                  "stride_r", "stride_y"] + scales})
    down = build_sm90(md._down_kernel, down_types, dict(TOPK=TOPK, HAS_SHARED=True, RESIDUAL=True, BM=bm, BKK=TOPK,
                                                         BN=cfg.down_bn, BK=cfg.down_bk, FP8=fp8, ONE_BLOCK=fp8),
                      **common)
    # programs at this M: gate_up's (M*k + 1 slots) x tiles (every slot, as a grid launches them), down's tiles
    grids = {"gate_up": (M * TOPK + 1) * -(-I // cfg.gate_bn), "down": -(-H // cfg.down_bn)}
    for name, b in (("gate_up", gate), ("down", down)):
        print(json.dumps(dict(M=M, dtype=wdt, kernel=name, registers=b.registers, spill=b.spill_bytes,
                              shared=b.shared_bytes, per_sm=b.programs_per_sm, programs=grids[name])), flush=True)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        m, wdt = arg.split(":")
        builds(int(m), wdt)
