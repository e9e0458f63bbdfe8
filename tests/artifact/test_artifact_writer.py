"""The writer streams, checks byte counts, and never leaves a half-written file."""

from __future__ import annotations

import pytest
import torch

from ninfer.artifact import ArtifactError, ArtifactWriter, open_artifact, write_artifact
from ninfer.testing.weights import random_logical_tensors


def _listing(d):
    return sorted(p.name for p in d.iterdir())


def test_failure_mid_stream_leaves_nothing(tmp_path, cfg):
    tensors = random_logical_tensors(cfg)

    def stream():
        for i, item in enumerate(tensors.items()):
            if i == 10:
                raise RuntimeError("source went away")
            yield item

    with pytest.raises(RuntimeError, match="source went away"):
        write_artifact(tmp_path / "m.ninfer", cfg, stream())
    assert _listing(tmp_path) == []


def test_failure_keeps_previous_file(tmp_path, cfg):
    tensors = random_logical_tensors(cfg)
    p = write_artifact(tmp_path / "m.ninfer", cfg, tensors.items())
    before = p.read_bytes()
    tensors.pop("norm.weight")
    with pytest.raises(ArtifactError):
        write_artifact(p, cfg, tensors.items())
    assert p.read_bytes() == before
    assert _listing(tmp_path) == ["m.ninfer"]


def test_header_is_written_last(tmp_path, cfg):
    """While objects stream in, the temp file has no magic, so a crash can never leave a file that looks valid."""
    seen = []
    with ArtifactWriter(tmp_path / "m.ninfer") as w:
        w.add_tensor("x", torch.ones(4))
        tmp = next(p for p in tmp_path.iterdir() if p.name.endswith(".tmp"))
        w._f.flush()
        seen.append(tmp.read_bytes()[:8])
        w.abort()
    assert seen == [bytes(8)]
    assert _listing(tmp_path) == []


def test_chunked_planes_and_byte_count(tmp_path, cfg):
    a, b = torch.randn(3, 8), torch.randn(5, 8)
    with ArtifactWriter(tmp_path / "c.ninfer") as w:
        w.add_object("ab", dtype="float32", shape=(8, 8), planes={"data": iter([a, b])})
        with pytest.raises(ArtifactError, match="object 'short' plane 'data': byte count mismatch"):
            w.add_object("short", dtype="float32", shape=(8, 8), planes={"data": a})
        with pytest.raises(ArtifactError, match="object 'ab': duplicate name"):
            w.add_tensor("ab", a)
        with pytest.raises(ArtifactError, match="wrong planes"):
            w.add_object("q", dtype="int4", shape=(8, 32), format="int_group", params={"group_size": 32},
                         planes={"data": bytes(128)})
        w.abort()


def test_progress_bar_and_reopen(tmp_path, cfg, capsys):
    p = write_artifact(tmp_path / "m.ninfer", cfg, random_logical_tensors(cfg).items(), progress=True)
    assert "B" in capsys.readouterr().err
    with open_artifact(p) as a:
        assert a.verify() > 0
