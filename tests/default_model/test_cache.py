"""The cache dir helper: location, and atomic publication."""

from __future__ import annotations

import pytest

from ninfer.cache import atomic_path, atomic_write_bytes, cache_dir


def test_env_overrides_the_platform_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NINFER_CACHE_DIR", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c" and (tmp_path / "c").is_dir()


def test_platform_dir_without_env(tmp_path, monkeypatch):
    monkeypatch.delenv("NINFER_CACHE_DIR", raising=False)
    monkeypatch.setattr("ninfer.cache.user_cache_dir", lambda app: str(tmp_path / "platform" / app))
    assert cache_dir() == tmp_path / "platform" / "ninfer"
    assert cache_dir().is_dir()


def test_atomic_write_publishes_complete_file(tmp_path):
    dest = tmp_path / "sub" / "f.bin"
    atomic_write_bytes(dest, b"abc")
    assert dest.read_bytes() == b"abc"
    assert dest.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in dest.parent.iterdir()] == ["f.bin"]


def test_failed_write_leaves_nothing_behind(tmp_path):
    dest = tmp_path / "f.bin"
    dest.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_path(dest) as tmp:
            tmp.write_bytes(b"partial")
            raise RuntimeError("builder failed")
    assert dest.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_a_changed_converter_converts_again(tmp_path, monkeypatch):
    """The conversion cache is keyed by the converter's code too: an upgraded ninfer never serves an artifact
    that an older converter wrote for the same checkpoint files."""
    from ninfer.convert import cached

    (tmp_path / "config.json").write_text("{}")
    before = cached.checkpoint_key(tmp_path)
    assert cached.checkpoint_key(tmp_path) == before  # unchanged files and converter: the same artifact
    monkeypatch.setattr(cached, "converter_digest", lambda: "another converter")
    assert cached.checkpoint_key(tmp_path) != before
