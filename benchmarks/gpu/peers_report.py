"""The peers table: ninfer's Engine beside llama.cpp and HF transformers (+ fla) from one GPU session's JSON
(bench_engine.json, bench_llamacpp.json, bench_hf.json). Decode is ms per step of B tokens at the 512-token
context (the Engine's decode rows at ctx 512; llama-batched-bench after a 512-token prompt; HF generate after a
512-token prompt); prefill is tok/s of one prompt. ``vs llama.cpp`` is llama.cpp's time over ninfer's (decode) or
ninfer's rate over llama.cpp's (prefill): above 1 ninfer is faster."""

from __future__ import annotations

from typing import NamedTuple

CONTEXT = 512


class PeerRow(NamedTuple):
    model: str
    case: str
    ninfer: float | None
    llamacpp: float | None
    hf: float | None

    @property
    def faster(self) -> float | None:
        """How many times faster ninfer is than llama.cpp in this case (None: either is missing)."""
        if not self.ninfer or not self.llamacpp:
            return None
        return self.llamacpp / self.ninfer if self.case.startswith("decode") else self.ninfer / self.llamacpp


def _decode(engine: dict, llama: dict, hf: dict, B: int) -> tuple:
    mine = next((r["step_ms"] for r in engine.get("decode", []) if r["B"] == B and r["ctx"] == CONTEXT), None)
    theirs = (llama.get("decode_512ctx") or {}).get(f"B{B}", {}).get("step_ms")
    hf_ms = next((d["step_ms"] for d in hf.get("decode", []) if d["B"] == B and d["prompt"] == CONTEXT), None)
    return mine, theirs, hf_ms


def _prefill(engine: dict, llama: dict, hf: dict, T: int) -> tuple:
    mine = next((r["tok_s"] for r in engine.get("prefill", []) if r["T"] == T and not r.get("reused")), None)
    theirs = (llama.get("prefill_tok_s") or {}).get(str(T))
    hf_rate = next((p["tok_s"] for p in hf.get("prefill", []) if p["T"] == T), None)
    return mine, theirs, hf_rate


def peer_rows(engine: dict, llamacpp: dict | None, hf: dict | None) -> list[PeerRow]:
    """One row per (model, case) the Engine measured; a peer that did not run (or lacks the case) is None."""
    rows = []
    for name, e in engine.get("models", {}).items():
        llama = ((llamacpp or {}).get("models") or {}).get(name) or {}
        h = ((hf or {}).get("models") or {}).get(name) or {}
        for B in sorted({r["B"] for r in e.get("decode", []) if r["ctx"] == CONTEXT}):
            rows.append(PeerRow(name, f"decode B={B}", *_decode(e, llama, h, B)))
        for T in sorted({r["T"] for r in e.get("prefill", [])}):
            rows.append(PeerRow(name, f"prefill {T} tok/s", *_prefill(e, llama, h, T)))
    return rows


def _cell(x: float | None, case: str) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if "tok/s" in case else f"{x:.2f}"


def print_peers(engine: dict, llamacpp: dict | None, hf: dict | None) -> None:
    llama_name = f"llama.cpp {(llamacpp or {}).get('commit', '')}".strip()
    print("\n" + "=" * 100)
    print(f"ninfer Engine vs {llama_name} and HF transformers (+fla), same session (decode: ms per step at "
          f"{CONTEXT} context; prefill: tok/s)")
    print(f"{'model':8} {'case':20} {'ninfer':>10} {'llama.cpp':>10} {'HF':>10} {'vs llama.cpp':>13}")
    for r in peer_rows(engine, llamacpp, hf):
        x = r.faster
        print(f"{r.model:8} {r.case:20} {_cell(r.ninfer, r.case):>10} {_cell(r.llamacpp, r.case):>10} "
              f"{_cell(r.hf, r.case):>10} {'-' if x is None else f'{x:.2f}x':>13}")
    print("=" * 100)
