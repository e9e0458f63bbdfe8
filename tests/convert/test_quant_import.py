"""Published quantized layouts -> ninfer convert -> the artifact's dequantization equals an independent torch
dequantization of the checkpoint's own tensors, bit for bit; stored bytes stay the source's where no kernel needs a
re-layout; Uses carry the scheme's activation permission."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ninfer.artifact import open_artifact
from ninfer.convert.convert import convert_checkpoint
from ninfer.testing.checkpoints import read_checkpoint_tensors
from ninfer.testing.quant_checkpoints import make_quantized_checkpoint

E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6])
AWQ_REVERSE = [0, 4, 1, 5, 2, 6, 3, 7]

CASES = {
    "fp8": ("fp8", False, {}, "AllowA8"),
    "fp8_moe_bf16_scales": ("fp8", True, {"bf16_scales": True}, "AllowA8"),
    "fp8_multimodal": ("fp8", False, {"base": {"multimodal": True}}, "AllowA8"),
    "gptq_act_order": ("gptq", False, {}, "A16Only"),
    "gptq_moe": ("gptq", True, {"act_order": False}, "A16Only"),
    "gptq_8bit": ("gptq", False, {"bits": 8}, "A16Only"),
    "awq_moe": ("awq", True, {}, "A16Only"),
    "ct_int4": ("compressed-tensors", False, {}, "A16Only"),
    "ct_int4_asym_act_order": ("compressed-tensors", False, {"symmetric": False, "act_order": True}, "A16Only"),
    "ct_int8_moe": ("compressed-tensors", True, {"bits": 8}, "A16Only"),
    "nvfp4": ("modelopt", False, {}, "AllowA4"),
    "nvfp4_moe": ("modelopt", True, {}, "AllowA4"),
}


def _words(w: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """int32 words -> codes along dim, code j of a word at bits [bits*j, bits*j + bits)."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    x = (w.unsqueeze(dim + 1) >> shifts.view(*([1] * (dim + 1)), -1, *([1] * (w.dim() - dim - 1)))) & ((1 << bits) - 1)
    return x.flatten(dim, dim + 1)


def _dequant(method: str, t: dict[str, torch.Tensor], opts: dict) -> torch.Tensor:
    """The checkpoint's own math for one module, [out, in] fp32, in the producing tool's conventions."""
    bits = opts.get("bits", 4)
    if method == "fp8":
        w, s = t["weight"].float(), t["weight_scale_inv"].float()
        br, bc = opts.get("block", (32, 32))
        return w * s.repeat_interleave(br, 0).repeat_interleave(bc, 1)[: w.shape[0], : w.shape[1]]
    if method == "gptq":
        q = _words(t["qweight"], bits, 0)  # [K, N]
        z = _words(t["qzeros"], bits, 1) + 1  # v1 stores zero - 1
        gi = t["g_idx"].long()
        return ((q - z[gi]).float() * t["scales"].float()[gi]).T
    if method == "awq":
        q = _words(t["qweight"], 4, 1).view(t["qweight"].shape[0], -1, 8)[..., AWQ_REVERSE].flatten(1)
        z = _words(t["qzeros"], 4, 1).view(t["qzeros"].shape[0], -1, 8)[..., AWQ_REVERSE].flatten(1)
        g = q.shape[0] // z.shape[0]
        gi = torch.arange(q.shape[0]) // g
        return ((q - z[gi]).float() * t["scales"].float()[gi]).T
    if method == "compressed-tensors":
        q = _words(t["weight_packed"], bits, 1)  # [N, K], unsigned
        n, k = q.shape
        s = t["weight_scale"].float()
        gi = t["weight_g_idx"].long() if "weight_g_idx" in t else torch.arange(k) // (k // s.shape[1])
        z = _words(t["weight_zero_point"], bits, 0)[:n] if "weight_zero_point" in t else torch.full_like(s, 1 << (bits - 1)).int()
        return (q - z[:, gi]).float() * s[:, gi]
    codes = torch.stack([t["weight"] & 15, t["weight"] >> 4], -1).flatten(1).long()
    v = torch.where(codes >= 8, -E2M1[codes & 7], E2M1[codes & 7])
    s = t["weight_scale"].float() * t["weight_scale_2"].float()
    return v * s.repeat_interleave(16, 1)


def _modules(tensors: dict[str, torch.Tensor], anchor: str, dtype: torch.dtype) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for key, t in tensors.items():
        prefix, field = key.rsplit(".", 1)
        out.setdefault(prefix, {})[field] = t
    return {p: f for p, f in out.items() if anchor in f and f[anchor].dtype == dtype}


ANCHOR = {"fp8": ("weight", torch.float8_e4m3fn), "gptq": ("qweight", torch.int32), "awq": ("qweight", torch.int32),
          "compressed-tensors": ("weight_packed", torch.int32), "modelopt": ("weight", torch.uint8)}


def _logical(prefix: str) -> tuple[str, int | None, str | None]:
    """Checkpoint module -> (logical name, expert, gate/up/down) in the test's own words."""
    name = prefix.removeprefix("model.").removeprefix("language_model.") + ".weight"
    parts = name.split(".")
    if "experts" in parts:
        i = parts.index("experts")
        base = ".".join(parts[: i + 1])
        proj = parts[i + 2].removesuffix("_proj")
        return f"{base}.{'down_proj' if proj == 'down' else 'gate_up_proj'}", int(parts[i + 1]), proj
    return name, None, None


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    cache: dict[str, tuple] = {}

    def get(case: str):
        if case not in cache:
            method, moe, opts, _ = CASES[case]
            d = make_quantized_checkpoint(tmp_path_factory.mktemp(case), method, moe=moe, **opts)
            cache[case] = (d, convert_checkpoint(d, d.parent / f"{case}.ninfer", progress=False))
        return cache[case]
    return get


@pytest.mark.parametrize("case", sorted(CASES))
def test_import_dequantizes_bit_for_bit(converted, case):
    method, moe, opts, activation = CASES[case]
    src, path = converted(case)
    modules = _modules(read_checkpoint_tensors(src), *ANCHOR[method])
    expected: dict[str, dict] = {}
    for prefix, fields in modules.items():
        name, expert, proj = _logical(prefix)
        expected.setdefault(name, {})[(expert, proj)] = _dequant(method, fields, opts)
    assert any("experts" in n for n in expected) == moe
    features = ("text", "mtp", "vision") if opts.get("base", {}).get("multimodal") else ("text", "mtp")
    assert any(n.startswith("visual.") for n in expected) == ("vision" in features)
    with open_artifact(path, features=features) as art:
        for name, parts in expected.items():
            got = art.dequantize(name).numpy()
            if len(parts) == 1 and None in next(iter(parts)):
                want = parts[(None, None)]
            elif name.endswith("down_proj"):
                want = torch.stack([parts[(e, "down")] for e in range(len(parts))])
            else:
                n = len(parts) // 2
                want = torch.stack([torch.cat([parts[(e, "gate")], parts[(e, "up")]]) for e in range(n)])
            np.testing.assert_array_equal(got.view(np.uint32), want.numpy().view(np.uint32), err_msg=name)
            assert {u.activation for u in art.uses_of(name)} == {activation}, name
        dense = [u for u in art.uses if u.binding not in expected]
        assert dense and {u.activation for u in dense} == {"A16Only"}


@pytest.mark.parametrize("case, field, plane", [("fp8", "weight", "data"), ("nvfp4", "weight", "data"),
                                                 ("nvfp4", "weight_scale", "scales"),
                                                 ("ct_int4", "weight_packed", "data")])
def test_stored_bytes_are_the_sources(converted, case, field, plane):
    src, path = converted(case)
    tensors = read_checkpoint_tensors(src)
    key = "model.layers.0.linear_attn.in_proj_qkv"
    with open_artifact(path) as art:
        stored = art.planes("layers.0.linear_attn.in_proj_qkv.weight")[plane]
    assert stored.tobytes() == tensors[f"{key}.{field}"].contiguous().view(torch.uint8).numpy().tobytes()


def test_act_order_is_stored_permuted_with_contiguous_groups(converted):
    src, path = converted("gptq_act_order")
    g_idx = read_checkpoint_tensors(src)["model.layers.3.self_attn.o_proj.g_idx"].numpy()
    with open_artifact(path) as art:
        o = art.objects[art.bindings["layers.3.self_attn.o_proj.weight"].object]
        perm = art.planes("layers.3.self_attn.o_proj.weight")["perm"]
    assert o.params["act_order"] and o.params["zero_point"]
    assert not np.array_equal(perm, np.arange(len(perm)))
    np.testing.assert_array_equal(g_idx[perm], np.arange(len(perm)) // o.params["group_size"])


def test_kv_cache_scales_have_no_consumer_and_are_counted(tmp_path):
    from safetensors.torch import save_file

    d = make_quantized_checkpoint(tmp_path / "src", "modelopt")
    tensors = read_checkpoint_tensors(d)
    for s in ("k_scale", "v_scale"):
        tensors[f"model.layers.3.self_attn.{s}"] = torch.tensor(0.5)
    save_file(tensors, str(d / "model.safetensors"))
    with open_artifact(convert_checkpoint(d, tmp_path / "m.ninfer", progress=False)) as art:
        assert art.provenance["recipe"]["unused_kv_cache_scales"] == 2
        assert not any("scale" in o for o in art.objects if not o.startswith("resource:"))
