"""Builds the one-row FP8 GEMV (`qlinear.fp8_row`) for sm_90 at its default tile (64 rows, 128-column K tile, 4
warps; ``ninfer.testing.sm90``) and prints one JSON line a build: registers, spills, programs an SM, layout
conversions inside its loop, quarter-rate F2F conversions, PDL's trigger and wait and the loads before the wait.
"pdl" builds the row form with PDL, "narrow" its 128-row tile at 8 warps, "rows2" / "rows4" the few-rows form
(`qlinear.fp8_rows`) at 2 and 4 rows of x; "vector" builds `fastgemv`'s dot-free one-row
form (its 512-wide tile at 16 rows) for comparison, "dot-bf16" / "dot-f16" its tl.dot form with bf16 or f16
operands. Run without TRITON_INTERPRET: ``test_qlinear.py`` starts it as a subprocess."""

import json
import sys

from ninfer.fast.ops.qlinear import fp8_gemv, fp8_row, fp8_rows
from ninfer.testing.sm90 import build_sm90

INTS = ("R", "K", "k_per", "num_splits", "half", "BR", "BC", "stride_w", "stride_s", "stride_y")


def _report(form: str, swiglu: bool, b) -> None:
    print(json.dumps(dict(form=form, swiglu=swiglu, registers=b.registers, spill=b.spill_bytes,
                          programs=b.programs_per_sm, loop_conversions=b.loop_conversions(),
                          f2f=b.opcodes("F2F."), trigger=b.opcodes("PREEXIT"), wait=b.opcodes("ACQBULK"),
                          loads_before_wait=b.before("ACQBULK", "LDG."))), flush=True)


def _fp8_kernel(form: str, **constexprs):
    types = dict(x_ptr="*bf16", w_ptr="*fp8e4nv", s_ptr="*fp32", y_ptr="*bf16", part_ptr="*fp32", arrive_ptr="*i32",
                 M="i32", stride_x="i32", **{n: "i32" for n in INTS})
    b = build_sm90(fp8_gemv._fp8_kernel, types, dict(EVEN_K=True, SPLIT=True, SWIGLU=False, FP32_DOT=False,
                                                      **constexprs),
                   num_warps=4, num_stages=4, divisible=("K", "k_per", "BC", "BR", "stride_w", "stride_y",
                                                         "stride_x"))
    _report(form, False, b)


def vector() -> None:
    _fp8_kernel("vector", BM=1, BW=16, BK=512, SB=128, USE_DOT=False, F16_DOT=False)


def dot(f16: bool) -> None:
    # the tl.dot form at 16 padded rows (every M > 1), bf16 or f16 operands
    _fp8_kernel("dot f16" if f16 else "dot bf16", BM=16, BW=64, BK=128, SB=128, USE_DOT=True, F16_DOT=f16)


def build(x_dtype: str, swiglu: bool, pdl: bool = False, rows: int = fp8_row.ROWS, warps: int = 4) -> None:
    types = dict(x_ptr=f"*{x_dtype}", w_ptr="*fp8e4nv", s_ptr="*fp32", y_ptr=f"*{x_dtype}", part_ptr="*fp32",
                 arrive_ptr="*i32", **{n: "i32" for n in INTS})
    b = build_sm90(fp8_row._fp8_row_kernel, types, dict(BW=rows, BK=128, SPLIT=True, SWIGLU=swiglu, PDL=pdl),
                   num_warps=warps, num_stages=4, divisible=("K", "k_per", "BC", "BR", "stride_w", "stride_y"))
    _report("row pdl" if pdl else f"row {x_dtype}" + (f" {rows}" if rows != fp8_row.ROWS else ""), swiglu, b)


def rows(bm: int) -> None:
    types = dict(x_ptr="*bf16", w_ptr="*fp8e4nv", s_ptr="*fp32", y_ptr="*bf16", part_ptr="*fp32", arrive_ptr="*i32",
                 M="i32", stride_x="i32", **{n: "i32" for n in INTS})
    constexprs = dict(BM=bm, BW=fp8_row.ROWS, SPLIT=True, SWIGLU=False)
    b = build_sm90(fp8_rows._fp8_rows_kernel, types, constexprs,
                   num_warps=4, num_stages=4, divisible=("K", "k_per", "BC", "BR", "stride_w", "stride_y",
                                                         "stride_x"))
    _report(f"rows {bm}", False, b)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        if arg == "vector":
            vector()
        elif arg.startswith("dot"):
            dot(arg == "dot-f16")
        elif arg == "pdl":  # with programmatic dependent launch
            build("bf16", swiglu=False, pdl=True)
        elif arg.startswith("rows"):  # the few-rows form at 2 or 4 rows of x
            rows(int(arg[4:]))
        elif arg == "narrow":  # the tile of weights of at most fastgemv.NARROW_R rows
            build("bf16", swiglu=False, rows=128, warps=8)
        else:
            build(arg, swiglu=False)
            build(arg, swiglu=True)
