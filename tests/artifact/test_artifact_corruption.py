"""Every kind of damage to a .ninfer file raises ArtifactError naming the object or field and the failed check."""

from __future__ import annotations

import pytest
import torch

from ninfer.artifact import ArtifactError, open_artifact, write_artifact
from ninfer.artifact.header import ALIGN
from ninfer.testing.weights import random_logical_tensors


@pytest.fixture()
def art(tmp_path, cfg):
    return write_artifact(tmp_path / "m.ninfer", cfg, random_logical_tensors(cfg).items(), {"tokenizer.json": "{}"})


def _object(path, name):
    with open_artifact(path, ("text", "mtp")) as a:
        return a.objects[name]


def _flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def test_truncated_file(art):
    data = art.read_bytes()
    for cut in (len(data) - 1, len(data) // 2, 10):
        art.write_bytes(data[:cut])
        with pytest.raises(ArtifactError, match="header"):
            open_artifact(art)


def test_bad_magic_and_version(art):
    data = bytearray(art.read_bytes())
    art.write_bytes(b"GGUF" + bytes(data[4:]))
    with pytest.raises(ArtifactError, match="header.magic: not a .ninfer file"):
        open_artifact(art)
    data[7] = 2
    art.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="header.version: unsupported container version"):
        open_artifact(art)


def test_bit_flip_in_object_names_it(art):
    name = "layers.1.linear_attn.out_proj.weight"
    o = _object(art, name)
    _flip(art, o.offset + o.nbytes // 2)
    with open_artifact(art) as a:  # opening reads no object bytes
        a.tensor("layers.0.linear_attn.out_proj.weight")
        with pytest.raises(ArtifactError, match=f"object '{name}': checksum mismatch"):
            a.tensor(name)
        with pytest.raises(ArtifactError, match=f"object '{name}': checksum mismatch"):
            a.verify()


def test_verify_reports_first_broken_object(art):
    first, second = "layers.2.mlp.down_proj.weight", "norm.weight"
    for n in (second, first):
        o = _object(art, n)
        _flip(art, o.offset)
    with open_artifact(art) as a:
        order = [o.name for o in a.descriptor.objects]
        expected = min((first, second), key=order.index)
        with pytest.raises(ArtifactError, match=f"object '{expected}'"):
            a.verify()


def test_resource_bit_flip(art):
    o = _object(art, "resource:tokenizer.json")
    _flip(art, o.offset)
    with open_artifact(art) as a, pytest.raises(ArtifactError, match="object 'resource:tokenizer.json'"):
        a.resource("tokenizer.json")


def test_descriptor_bit_flip(art):
    data = art.read_bytes()
    _flip(art, len(data) - 20)
    with pytest.raises(ArtifactError, match="descriptor: checksum mismatch"):
        open_artifact(art)


def test_descriptor_invalid_json(art, rewrite_descriptor):
    rewrite_descriptor(art, raw=b'{"format": "ninfer", "version": 3,')
    with pytest.raises(ArtifactError, match="descriptor: invalid JSON"):
        open_artifact(art)


@pytest.mark.parametrize("depth", [70, 100_000])  # 70: parses, past the bound; 100k: past the JSON parser itself
def test_deeply_nested_descriptor_is_an_artifact_error(art, rewrite_descriptor, depth):
    deep = b"[" * depth + b"]" * depth
    rewrite_descriptor(art, raw=b'{"format": "ninfer", "version": 3, "metadata": ' + deep + b"}")
    with pytest.raises(ArtifactError, match="descriptor: nested too deeply"):
        open_artifact(art)


def _obj(d, name):
    return next(o for o in d["objects"] if o["name"] == name)



MUTATIONS = {
    "missing_field": (lambda d: d["objects"][0].pop("checksum"), r"descriptor.objects\[0\].checksum: missing field"),
    "wrong_type": (lambda d: d.__setitem__("bindings", {}), "descriptor.bindings: wrong type"),
    "nbytes": (lambda d: _obj(d, "norm.weight").__setitem__("nbytes", 4), "object 'norm.weight': nbytes does not match"),
    "shape": (lambda d: _obj(d, "norm.weight").__setitem__("shape", [65]), "object 'norm.weight': nbytes does not match"),
    "dtype": (lambda d: _obj(d, "norm.weight").__setitem__("dtype", "int4"), "object 'norm.weight': format/dtype/shape"),
    "misaligned": (lambda d: _obj(d, "norm.weight").__setitem__("offset", _obj(d, "norm.weight")["offset"] + 8),
                   "object 'norm.weight': misaligned offset"),
    "outside": (lambda d: _obj(d, "norm.weight").__setitem__("offset", 1 << 40), "object 'norm.weight': object outside"),
    "overlap": (lambda d: d["objects"][1].__setitem__("offset", d["objects"][0]["offset"]), "overlaps another object"),
    "dangling_binding": (lambda d: d["bindings"][0].__setitem__("object", "ghost"),
                         "binding 'embed_tokens.weight': references a missing object"),
    "view_range": (lambda d: d["bindings"][0].__setitem__("rows", [0, 10 ** 6]), "view rows out of range"),
    "geometry": (lambda d: d["bindings"][0].__setitem__("shape", [1, 2]), "geometry differs from its object"),
    "use": (lambda d: d["uses"][0].__setitem__("binding", "ghost"), "references a missing binding"),
    "activation": (lambda d: d["uses"][0].__setitem__("activation", "AllowA2"), "unknown activation permission"),
    "config": (lambda d: d["config"].__setitem__("hidden_size", -1), "descriptor.config.hidden_size: invalid config"),
    "missing_text": (lambda d: d.update(bindings=[b for b in d["bindings"] if b["name"] != "norm.weight"],
                                        uses=[u for u in d["uses"] if u["binding"] != "norm.weight"]),
                     "feature 'text': missing bindings"),
    "version": (lambda d: d.__setitem__("version", 4), "descriptor.version: unsupported version"),
}


@pytest.mark.parametrize("case", sorted(MUTATIONS))
def test_inconsistent_descriptor(art, case, rewrite_descriptor):
    mutate, needle = MUTATIONS[case]
    rewrite_descriptor(art, mutate)
    with pytest.raises(ArtifactError, match=needle):
        open_artifact(art)


def test_data_offset_is_aligned(art):
    with open_artifact(art) as a:
        assert a.header.data_offset == ALIGN
        assert all(o.offset % ALIGN == 0 for o in a.objects.values())
        assert isinstance(a.tensor("norm.weight"), torch.Tensor)
