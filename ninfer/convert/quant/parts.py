"""One quantized source matrix [n, K] of each published layout -> the planes of ninfer's representation.

``check`` reads headers (and the small ``g_idx``/``weight_shape`` tensors) and returns every problem, naming the tensor
and field; ``planes`` reads the bytes and re-lays them out (``docs/quantization.md``, "Imports"). Codes, scales and
zero points keep their values exactly; only their order and packing change.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ninfer.artifact.formats.base import pack_bits, unpack_bits
from ninfer.convert.hf_source import HFSource

from .modules import Module
from .scheme import Method, Scheme

# AWQ packs 8 columns per int32 with column order[i] at bits 4i.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
SCALE_DTYPES = {"F16": "float16", "BF16": "bfloat16"}


def unpack_words(words: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """int32 words holding 32/bits codes each (code j at bits [bits*j, bits*j+bits)) -> uint8 codes, expanded along
    ``axis`` (word i of that axis holds codes i*pf .. i*pf+pf-1)."""
    pf, mask = 32 // bits, (1 << bits) - 1
    w = np.ascontiguousarray(words).view(np.uint32)
    codes = np.stack([(w >> np.uint32(bits * j)) & np.uint32(mask) for j in range(pf)], axis=axis + 1)
    shape = list(w.shape)
    shape[axis] *= pf
    return codes.astype(np.uint8).reshape(shape)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns -> fp32, exactly (bf16 is the top half of an fp32)."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def act_order_perm(src: HFSource, m: Module, field: str, k: int, g: int, problems: list[str]) -> np.ndarray | None:
    """The stable argsort of ``g_idx`` when it is not ``arange(K) // g`` (None when it is, or is absent)."""
    t = m.field(field)
    if t is None:
        return None
    if t.shape != (k,) or t.dtype != "I32":
        problems.append(f"tensor {t.key}: {t.dtype} {list(t.shape)}, expected I32 [{k}]")
        return None
    g_idx = src.array(t.key).astype(np.int64)
    natural = np.arange(k) // g
    if np.array_equal(g_idx, natural):
        return None
    perm = np.argsort(g_idx, kind="stable")
    if not np.array_equal(g_idx[perm], natural):
        problems.append(f"tensor {t.key}: act-order groups are not each of group_size {g} columns")
        return None
    return perm.astype(np.int32)


def _expect(problems: list[str], m: Module, field: str, dtypes: tuple[str, ...], shape: tuple[int, ...]) -> None:
    t = m.field(field)
    if t is not None and (t.dtype not in dtypes or tuple(t.shape) != tuple(shape)):
        problems.append(f"tensor {t.key}: {t.dtype} {list(t.shape)}, expected {'/'.join(dtypes)} {list(shape)}")


def _group_of(scheme: Scheme, m: Module, k: int, problems: list[str]) -> int:
    """The group size, or 0 (with the problem named) when it does not divide K; the layout checks then stop."""
    g = scheme.group_size or k
    if k % g:
        problems.append(f"tensor {m.key}: quantization_config group_size {g} does not divide its input dim {k}")
        return 0
    return g


class PartReader:
    """The planes of one source matrix in one published layout (one instance per conversion)."""

    def __init__(self, src: HFSource, scheme: Scheme):
        self.src, self.s = src, scheme
        self.perms: dict[str, np.ndarray | None] = {}

    def check(self, m: Module, n: int, k: int) -> list[str]:
        problems: list[str] = []
        {Method.FP8_BLOCK: self._check_fp8, Method.GPTQ: self._check_gptq, Method.AWQ: self._check_awq,
         Method.PACKED: self._check_packed, Method.NVFP4: self._check_nvfp4}[self.s.method](m, n, k, problems)
        return problems

    def planes(self, m: Module, k: int) -> dict[str, np.ndarray]:
        read: dict[Method, Callable] = {Method.FP8_BLOCK: self._fp8, Method.GPTQ: self._gptq, Method.AWQ: self._awq,
                                        Method.PACKED: self._packed, Method.NVFP4: self._nvfp4}
        return read[self.s.method](m, k)

    def _a(self, m: Module, field: str) -> np.ndarray:
        return self.src.array(m.tensors[field].key)

    def _check_fp8(self, m: Module, n: int, k: int, problems: list[str]) -> None:
        br, bc = self.s.block
        _expect(problems, m, "weight", ("F8_E4M3",), (n, k))
        _expect(problems, m, "weight_scale_inv", ("F32", "BF16"), (-(-n // br), -(-k // bc)))

    def _fp8(self, m: Module, k: int) -> dict[str, np.ndarray]:
        s = self._a(m, "weight_scale_inv")
        return {"data": self._a(m, "weight"),
                "scales": bf16_to_f32(s) if m.tensors["weight_scale_inv"].dtype == "BF16" else s}

    def _check_gptq(self, m: Module, n: int, k: int, problems: list[str]) -> None:
        b = self.s.bits
        pf, g = 32 // b, _group_of(self.s, m, k, problems)
        if not g:
            return
        _expect(problems, m, "qweight", ("I32",), (k // pf, n))
        _expect(problems, m, "qzeros", ("I32",), (k // g, n // pf))
        _expect(problems, m, "scales", ("F16",), (k // g, n))
        if self.s.act_order and m.field("g_idx") is None:
            problems.append(f"tensor {m.key}.qweight: act-order (quantization_config.desc_act) without "
                            f"{m.key}.g_idx")
        self.perms[m.key] = act_order_perm(self.src, m, "g_idx", k, g, problems)

    def _gptq(self, m: Module, k: int) -> dict[str, np.ndarray]:
        b = self.s.bits
        codes = unpack_words(self._a(m, "qweight"), b, 0).T  # [n, K]
        zeros = unpack_words(self._a(m, "qzeros"), b, 1).T  # [n, K/g]
        if self.s.gptq_v1:
            zeros = zeros + 1  # GPTQ v1 stores each zero point minus one
        return self._int_planes(m, codes, self._a(m, "scales").T, zeros)

    def _int_planes(self, m: Module, codes: np.ndarray, scales: np.ndarray, zeros: np.ndarray | None
                    ) -> dict[str, np.ndarray]:
        perm = self.perms.get(m.key)
        if perm is not None:
            codes = codes[:, perm]
        out = {"data": pack_bits(np.ascontiguousarray(codes), self.s.bits), "scales": np.ascontiguousarray(scales)}
        if zeros is not None:
            out["zeros"] = np.ascontiguousarray(zeros, dtype=np.uint8)
        if perm is not None:
            out["perm"] = perm
        return out

    def _check_awq(self, m: Module, n: int, k: int, problems: list[str]) -> None:
        g = _group_of(self.s, m, k, problems)
        if not g:
            return
        _expect(problems, m, "qweight", ("I32",), (k, n // 8))
        _expect(problems, m, "qzeros", ("I32",), (k // g, n // 8))
        _expect(problems, m, "scales", ("F16",), (k // g, n))

    def _awq_codes(self, words: np.ndarray) -> np.ndarray:
        raw = unpack_words(words, 4, 1)  # [rows, n] in packing position order
        pos = np.argsort(AWQ_ORDER)  # column c sits at position pos[c]
        r, n = raw.shape
        return raw.reshape(r, n // 8, 8)[:, :, pos].reshape(r, n)

    def _awq(self, m: Module, k: int) -> dict[str, np.ndarray]:
        codes = self._awq_codes(self._a(m, "qweight")).T
        zeros = self._awq_codes(self._a(m, "qzeros")).T
        return self._int_planes(m, codes, self._a(m, "scales").T, zeros)

    def _check_packed(self, m: Module, n: int, k: int, problems: list[str]) -> None:
        b = self.s.bits
        pf, g = 32 // b, _group_of(self.s, m, k, problems)
        if not g:
            return
        _expect(problems, m, "weight_packed", ("I32",), (n, k // pf))
        _expect(problems, m, "weight_scale", tuple(SCALE_DTYPES), (n, k // g))
        if not self.s.symmetric:
            if m.field("weight_zero_point") is None:
                problems.append(f"tensor {m.key}.weight_packed: asymmetric scheme but {m.key}.weight_zero_point "
                                "is missing")
            _expect(problems, m, "weight_zero_point", ("I32",), (-(-n // pf), k // g))
        shape = m.field("weight_shape")
        if shape is not None and [int(v) for v in self.src.array(shape.key).reshape(-1)] != [n, k]:
            problems.append(f"tensor {shape.key}: {self.src.array(shape.key).tolist()}, expected {[n, k]}")
        if self.s.act_order and m.field("weight_g_idx") is None:
            problems.append(f"tensor {m.key}.weight_packed: act-order (actorder) without {m.key}.weight_g_idx")
        self.perms[m.key] = act_order_perm(self.src, m, "weight_g_idx", k, g, problems)

    def scale_dtype(self, m: Module) -> str:
        t = m.field("weight_scale") if self.s.method is Method.PACKED else None
        return SCALE_DTYPES.get(t.dtype, "float16") if t is not None else "float16"

    def _packed(self, m: Module, k: int) -> dict[str, np.ndarray]:
        b = self.s.bits
        packed = self._a(m, "weight_packed")
        zeros = None
        if not self.s.symmetric:
            n = packed.shape[0]
            zeros = unpack_words(self._a(m, "weight_zero_point"), b, 0)[:n]  # unsigned: zp + 2^(b-1)
        if self.perms.get(m.key) is None:
            # Little-endian int32 words of codes from bit 0 up are exactly the artifact's per-row bit stream.
            out = {"data": packed.view(np.uint8).reshape(packed.shape[0], -1), "scales": self._a(m, "weight_scale")}
            if zeros is not None:
                out["zeros"] = zeros
            return out
        codes = unpack_bits(packed.view(np.uint8).reshape(packed.shape[0], -1), b, k)
        return self._int_planes(m, codes, self._a(m, "weight_scale"), zeros)

    def _check_nvfp4(self, m: Module, n: int, k: int, problems: list[str]) -> None:
        _expect(problems, m, "weight", ("U8",), (n, k // 2))
        _expect(problems, m, "weight_scale", ("F8_E4M3",), (n, k // 16))
        for f in ("weight_scale_2", "input_scale"):
            t = m.field(f)
            if t is not None and (t.dtype != "F32" or int(np.prod(t.shape)) != 1):
                problems.append(f"tensor {t.key}: {t.dtype} {list(t.shape)}, expected one F32 value")

    def _nvfp4(self, m: Module, k: int) -> dict[str, np.ndarray]:
        out = {"data": self._a(m, "weight"), "scales": self._a(m, "weight_scale"),
               "global_scale": self._a(m, "weight_scale_2").reshape(1)}
        if m.field("input_scale") is not None:
            out["input_scale"] = self._a(m, "input_scale").reshape(1)
        return out
