"""Constants and builders the CLI tests share."""

from __future__ import annotations

import json
import shutil

SMALL = ["--no-progress", "--max-model-len", "256", "--max-num-seqs", "1"]


def edited_checkpoint(src, dst, **config_patch):
    """A copy of checkpoint `src` at `dst` whose config.json has `config_patch` applied."""
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(config_patch)
    (dst / "config.json").write_text(json.dumps(config))
    return dst
