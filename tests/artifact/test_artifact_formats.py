"""Numeric formats: plane geometry, bit order, and pack/unpack round trips."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.artifact.formats import FORMATS, get_format, layout
from ninfer.artifact.formats.base import pack_bits, unpack_bits
from ninfer.artifact.formats.nvfp4 import E2M1

CASES = [
    ("dense", "bfloat16", {}, 0.005),
    ("dense", "float16", {}, 0.001),
    ("dense", "float32", {}, 0.0),
    ("fp8_e4m3", "float8_e4m3fn", {}, 0.04),
    ("fp8_e4m3", "float8_e4m3fn", {"block": [4, 32]}, 0.04),
    ("int_group", "int4", {"group_size": 32}, 0.15),
    ("int_group", "int5", {"group_size": 16}, 0.07),
    ("int_group", "int8", {"group_size": 32}, 0.006),
    ("int_group", "int4", {"group_size": 32, "zero_point": True}, 0.15),
    ("int_group", "int4", {"group_size": 16, "scale_dtype": "bfloat16"}, 0.15),
    ("nvfp4", "nvfp4", {}, 0.15),
]


@pytest.mark.parametrize("fmt,dtype,params,tol", CASES, ids=[f"{c[0]}-{c[1]}-{len(c[2])}" for c in CASES])
@pytest.mark.parametrize("shape", [(6, 64), (3, 5, 96)], ids=["2d", "3d"])
def test_round_trip(fmt, dtype, params, tol, shape):
    x = np.random.default_rng(42).standard_normal(shape).astype(np.float32)
    f = get_format(fmt)
    planes = f.pack(x, dtype, params)
    specs = f.planes(shape, dtype, params)
    assert [s.name for s in specs] == list(planes)
    for s in specs:
        assert planes[s.name].nbytes == s.nbytes, s
    y = f.unpack(planes, shape, dtype, params)
    assert y.shape == shape and y.dtype == np.float32
    rel = np.sqrt(((x - y) ** 2).mean() / (x ** 2).mean())
    assert rel <= tol
    # Unpacked values are representable: packing them again reproduces the same planes bit for bit.
    again = f.pack(y, dtype, params)
    for k in planes:
        np.testing.assert_array_equal(again[k], planes[k])


def test_int4_nibble_order():
    """Element 2j sits in the low nibble of byte j."""
    codes = np.array([[1, 2, 3, 4, 5, 6, 7, 8]], dtype=np.uint8)
    packed = pack_bits(codes, 4)
    assert packed.tolist() == [[0x21, 0x43, 0x65, 0x87]]


def test_int5_bit_stream():
    """8 codes fill 5 bytes as a little-endian 40-bit integer, code k at bits [5k, 5k+5)."""
    codes = np.array([[31, 0, 0, 0, 0, 0, 0, 1]], dtype=np.uint8)
    packed = pack_bits(codes, 5)
    assert int.from_bytes(packed[0].tobytes(), "little") == 31 | (1 << 35)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([4, 5]), st.integers(1, 3), st.integers(1, 4), st.data())
def test_bit_packing_inverse(bits, rows, groups, data):
    c = 8 * groups
    values = data.draw(st.lists(st.integers(0, (1 << bits) - 1), min_size=rows * c, max_size=rows * c))
    codes = np.array(values, dtype=np.uint8).reshape(rows, c)
    assert np.array_equal(unpack_bits(pack_bits(codes, bits), bits, c), codes)


def test_nvfp4_exact_grid():
    """Values already on the e2m1 grid times a power-of-two block scale survive exactly."""
    grid = np.concatenate([E2M1, -E2M1[1:], E2M1[:1]])  # 16 values, amax 6
    x = np.stack([grid * 2.0 ** k for k in range(-2, 2)]).astype(np.float32)  # [4, 16]
    f = FORMATS["nvfp4"]
    y = f.unpack(f.pack(x, "nvfp4", {}), x.shape, "nvfp4", {})
    np.testing.assert_allclose(y, x, rtol=0, atol=1e-6 * np.abs(x).max())


def test_int_group_scales_are_fp16_and_zero_rows_stay_zero():
    x = np.zeros((2, 32), dtype=np.float32)
    x[1] = np.linspace(-1, 1, 32)
    f = FORMATS["int_group"]
    planes = f.pack(x, "int4", {"group_size": 32})
    assert planes["scales"].dtype == np.float16
    y = f.unpack(planes, x.shape, "int4", {"group_size": 32})
    assert np.all(y[0] == 0)
    assert abs(y[1, -1] - 1.0) < 1e-3


@pytest.mark.parametrize("fmt,dtype,params,shape,needle", [
    ("int_group", "int4", {"group_size": 12}, (4, 48), "multiple of 8"),
    ("int_group", "int4", {"group_size": 32}, (4, 48), "multiple of 32"),
    ("nvfp4", "nvfp4", {}, (4, 40), "multiple of 16"),
    ("fp8_e4m3", "float8_e4m3fn", {}, (64,), "rank >= 2"),
    ("dense", "int4", {}, (4, 4), "no dtype"),
])
def test_invalid_geometry_is_named(fmt, dtype, params, shape, needle):
    with pytest.raises(ValueError, match=needle):
        get_format(fmt).planes(shape, dtype, params)


def test_fp8_block_scale_rows_per_entry():
    specs = FORMATS["fp8_e4m3"].planes((256, 256), "float8_e4m3fn", {"block": [128, 128]})
    assert specs[1].shape == (2, 2) and specs[1].rows_per_entry == 128
    offsets, total = layout(specs)
    assert offsets == [0, 256 * 256] and total == 256 * 256 + 16


@pytest.mark.parametrize("shape", [(6, 64), (3, 5, 64)], ids=["2d", "3d"])
def test_int_group_act_order_unpacks_through_the_permutation(shape):
    """Stored column j is logical column perm[j]: unpack equals the identity-order unpack with columns scattered."""
    rng = np.random.default_rng(3)
    f = get_format("int_group")
    plain = {"group_size": 16, "zero_point": True}
    planes = f.pack(rng.standard_normal(shape).astype(np.float32), "int4", plain)
    stored = f.unpack(planes, shape, "int4", plain)
    perm = np.stack([rng.permutation(shape[-1]) for _ in range(int(np.prod(shape[:-2])))]).astype(np.int32)
    perm = perm.reshape(*shape[:-2], shape[-1])
    y = f.unpack({**planes, "perm": perm}, shape, "int4", {**plain, "act_order": True})
    for idx in np.ndindex(*shape[:-2]):
        np.testing.assert_array_equal(y[idx][:, perm[idx]], stored[idx])
    spec = f.planes(shape, "int4", {**plain, "act_order": True})[-1]
    assert spec.name == "perm" and spec.rows_per_entry == (0 if len(shape) == 2 else 1)


def test_nvfp4_global_rows_scale_each_row_group():
    f = get_format("nvfp4")
    x = np.random.default_rng(4).standard_normal((2, 8, 32)).astype(np.float32)
    planes = f.pack(x, "nvfp4", {})
    base = f.unpack(planes, x.shape, "nvfp4", {})
    g = planes["global_scale"][0]
    per = np.array([[g, 2 * g], [4 * g, g / 2]], dtype=np.float32)  # [E, R/r] with r = 4
    params = {"global_rows": 4, "input_scale": True}
    assert [p.name for p in f.planes(x.shape, "nvfp4", params)][-2:] == ["global_scale", "input_scale"]
    y = f.unpack({**planes, "global_scale": per, "input_scale": np.ones((2, 2), np.float32)}, x.shape, "nvfp4", params)
    np.testing.assert_array_equal(y[0, 4:], base[0, 4:] * 2)
    np.testing.assert_array_equal(y[1, :4], base[1, :4] * 4)
    with pytest.raises(ValueError, match="global_rows"):
        f.planes((8, 32), "nvfp4", {"global_rows": 3})
