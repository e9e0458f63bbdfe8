"""Builds each decode kernel that takes PDL (`ninfer.fast.ops.pdl`) for sm_90 at 9B shapes, with and without its
``PDL`` constexpr (``ninfer.testing.sm90``), and prints one JSON line a build: PDL's trigger (PREEXIT) and wait
(ACQBULK) counts, the global loads, stores and atomics placed before the wait, registers, spills and the layout
conversions inside loops ("gemv_fma": the GEMV's dot-free one-row form). Run without TRITON_INTERPRET:
``test_pdl.py`` starts it as a subprocess; arguments pick kernels by name (none: all)."""

import json
import sys

from ninfer.fast.ops.decode_slots import triton as decode_slots
from ninfer.fast.ops.draft_start import triton as draft_start
from ninfer.fast.ops.gdn_decode import triton as gdn
from ninfer.fast.ops.gdn_verify import triton as gdn_verify
from ninfer.fast.ops.gemv import triton as gemv
from ninfer.fast.ops.greedy_draw import triton as greedy_draw
from ninfer.fast.ops.moe_decode import triton as moe_decode
from ninfer.fast.ops.paged_decode_attention import triton as attention
from ninfer.fast.ops.qlinear import fp8_row, fp8_rows
from ninfer.fast.ops.rmsnorm import triton as rmsnorm
from ninfer.fast.ops.rope_kv_write import triton as rope
from ninfer.fast.ops.swiglu import triton as swiglu
from ninfer.testing.sm90 import build_sm90

WIDTHS = {"K", "k_per", "BC", "BR", "N", "I", "C", "H", "IS", "E", "V", "max_pages", "page_elems"}
INT_POINTERS = {"slot_ptr", "out_slot_ptr", "row_ptr", "cnt_ptr", "bt_ptr", "ctx_ptr", "first_ptr", "arrive_ptr",
                "pos_ptr", "rows_ptr", "cu_ptr", "outs_ptr", "ids_ptr", "table_ptr", "num_ptr", "room_ptr", "j_ptr",
                "f_ptr", "pend_ptr"}
FP32_POINTERS = {"s_ptr", "po_ptr", "lse_ptr", "part_ptr", "alog_ptr", "dtb_ptr", "inv_ptr", "state_ptr", "act_ptr",
                 "rw_ptr"}
# per kernel, pointers of another type than the rules above give
OVERRIDES = {"gdn_recurrent": {"o_ptr": "*fp32"}, "gdn_verify": {"o_ptr": "*fp32"}, "fp8_row": {"w_ptr": "*fp8e4nv"},
             "fp8_rows": {"w_ptr": "*fp8e4nv"}, "decode_slots": {"slot_ptr": "*i64"},
             "draft_start": {"tok_ptr": "*i64"},
             "greedy_draw": {"x_ptr": "*fp32", "drafts_ptr": "*i64", "token_ptr": "*i64"}}
# kernel name -> (module kernel, constexprs at 9B shapes, num_warps)
KERNELS = {
    "rmsnorm": (rmsnorm._rmsnorm_kernel, dict(HAS_RESIDUAL=True, BLOCK=4096), 8),
    "swiglu": (swiglu._swiglu_kernel, dict(BLOCK=1024), 4),
    "gdn_conv": (gdn._conv_update_kernel, dict(K=4, BLOCK_C=256, BLOCK_K=4), 4),
    "gdn_recurrent": (gdn._recurrent_kernel, dict(HK=16, HV=32, DK=128, DV=128, G=2, K=4, CONV=True, ROWS=False,
                                                   BK=128, BV=32, NV=4, BVF=128, BKW=4), 4),
    "attention": (attention._decode_kernel, dict(G=4, D=256, PAGE=16, NUM_SPLITS=8, BG=16, BD=256, BN=32,
                                                 HAS_FIRST=False, GATE=True), 4),
    "attention_merge": (attention._merge_kernel, dict(NH=16, D=256, NUM_SPLITS=8, BS=8, BD=256, GATE=True), 4),
    "rope_kv_write": (rope._rope_kv_write_kernel, dict(NH=16, NKV=4, D=256, RD=64, HAS_QN=True, HAS_KN=True,
                                                       BD=256, MROPE=False), 4),
    "gemv": (gemv._gemv_kernel, dict(BM=16, BW=32, BK=256, EVEN_K=True, SPLIT=True, SWIGLU=False, FP32_DOT=False,
                                     NORM=0, RESIDUAL=True), 4),
    "gemv_fma": (gemv._gemv_kernel, dict(BM=1, BW=64, BK=64, EVEN_K=True, SPLIT=True, SWIGLU=False, FP32_DOT=False,
                                         NORM=2, RESIDUAL=True), 4),
    "fp8_row": (fp8_row._fp8_row_kernel, dict(BW=64, BK=128, SPLIT=True, SWIGLU=False), 4),
    "fp8_rows": (fp8_rows._fp8_rows_kernel, dict(BM=4, BW=64, SPLIT=True, SWIGLU=False), 4),
    "gdn_verify": (gdn_verify._verify_kernel,
                   dict(W=4, HK=16, HV=32, DK=128, DV=128, G=2, BK=128, BV=32, NV=4, BVF=128), 4),
    "moe_gate_up": (moe_decode._gate_up_kernel, dict(TOPK=8, RENORM=True, BM=1, BE=256, BKK=8, BN=32, BK=256,
                                                     EVEN_K=True, FP8=False, ONE_BLOCK=False), 4),
    "moe_down": (moe_decode._down_kernel, dict(TOPK=8, HAS_SHARED=True, RESIDUAL=True, BM=1, BKK=8, BN=32, BK=256,
                                               FP8=False, ONE_BLOCK=False), 4),
    "decode_slots": (decode_slots._decode_slots_kernel, dict(PAGE=16, BLOCK=1024), 4),
    "greedy_draw": (greedy_draw._greedy_draw_kernel, dict(BLOCK=4096), 4),
    "draft_start": (draft_start._draft_start_kernel, dict(PAGE=16, BLOCK=1024), 4),
}


def _type(kernel_name: str, arg: str) -> str:
    if arg in OVERRIDES.get(kernel_name, {}):
        return OVERRIDES[kernel_name][arg]
    if arg in INT_POINTERS:
        return "*i32"
    if arg in FP32_POINTERS:
        return "*fp32"
    if arg.endswith("_ptr"):
        return "*bf16"
    return "fp32" if arg in ("scale", "eps") else "i32"


def build(name: str, pdl: bool) -> None:
    kernel, constexprs, warps = KERNELS[name]
    types = {a: _type(name, a) for a in kernel.arg_names if a not in constexprs and a != "PDL"}
    # strides and widths as a launch at model shapes specialises them (multiples of 16): aligned, vectorised loads
    divisible = tuple(a for a, t in types.items() if t == "i32" and (a.startswith("stride") or a in WIDTHS))
    b = build_sm90(kernel, types, dict(constexprs, PDL=pdl), num_warps=warps, num_stages=4, divisible=divisible)
    before = {op: b.before("ACQBULK", op) for op in ("LDG", "STG", "ATOM", "RED.")}  # LDG: LDGSTS too
    print(json.dumps(dict(kernel=name, pdl=pdl, trigger=b.opcodes("PREEXIT"), wait=b.opcodes("ACQBULK"),
                          global_before_wait=sum(before.values()), before=before, registers=b.registers,
                          spill=b.spill_bytes, loop_conversions=b.loop_conversions())), flush=True)


if __name__ == "__main__":
    for name in sys.argv[1:] or KERNELS:
        for pdl in (False, True):
            build(name, pdl)
