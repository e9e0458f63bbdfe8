"""A published DFlash / DFlash2 drafter directory as a second source of one conversion (``--drafter DIR``).

The drafter is planned like the target, from its ``config.json`` and safetensors headers alone: a config that does
not fit the target (hidden size, vocabulary, tapped layers, mask token) is refused naming the field, and every
missing, unexpected or mis-shaped tensor is reported together before a byte is written. Its tensors keep their
published names under ``dflash.`` (an optional ``model.`` prefix is dropped); the embedding and lm_head are the
target's, so a drafter that carries its own is refused rather than silently ignored.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ninfer.models.qwen3_5.config import ConfigError, Qwen35Config
from ninfer.models.qwen3_5.drafter import PREFIX, DrafterConfig, drafter_parameters

from .errors import ConversionError
from .hf_source import SOURCE_DTYPES, HFSource, read_config_json, read_safetensors_header, weight_files
from .plan import Item, _target_dtype

_SHARED = ("embed_tokens.weight", "lm_head.weight")


class DrafterSource(HFSource):
    """The tensors and config of a drafter directory (HFSource's lazy reads, a drafter's config)."""

    def __init__(self, src_dir: str | Path, target: Qwen35Config):
        # not HFSource.__init__: that one parses a Qwen3.5 config; the reads below are the same
        self.dir = Path(src_dir)
        self.raw_config = read_config_json(self.dir)
        try:
            cfg = DrafterConfig.from_hf(self.raw_config)
            cfg.check_fits(target)
        except ConfigError as e:
            raise ConversionError(str(self.dir), [f"drafter config.json does not fit the target: {e}"]) from None
        except (TypeError, ValueError, AttributeError) as e:
            # a field of the wrong type (a string rope_theta, a list where an object belongs)
            raise ConversionError(str(self.dir), [f"drafter config.json has a malformed field: {e}"]) from None
        # the target's vocabulary when the drafter's config leaves it out (the lm_head it drafts through)
        self.drafter = dataclasses.replace(cfg, vocab_size=target.vocab_size)
        self.files = weight_files(self.dir)
        self.tensors = {t.key: t for f in self.files for t in read_safetensors_header(f)}
        self._fds = {}
        self._buf = bytearray(16 << 20)


def plan_drafter(src: DrafterSource, dtype: str | None) -> tuple[list[Item], list[str]]:
    """The drafter's objects in execution order, and every problem found."""
    problems: list[str] = []
    names: dict[str, str] = {}
    for key in src.tensors:
        name = key.removeprefix("model.")
        if name in _SHARED:
            problems.append(f"drafter tensor {key!r}: the drafter uses the target's {name}; a drafter carrying its "
                            "own is another model")
        elif PREFIX + name in names:
            problems.append(f"drafter tensors {names[PREFIX + name]!r} and {key!r} both map to {PREFIX + name!r}")
        else:
            names[PREFIX + name] = key
    items = []
    for name, spec in drafter_parameters(src.drafter).items():
        key = names.pop(name, None)
        if key is None:
            problems.append(f"missing drafter tensor {name.removeprefix(PREFIX)!r} (shape {list(spec.shape)})")
            continue
        t = src.tensors[key]
        if t.dtype not in SOURCE_DTYPES:
            problems.append(f"drafter tensor {key!r} has unsupported dtype {t.dtype} (expected BF16, F16 or F32)")
            continue
        if t.shape != spec.shape:
            problems.append(f"drafter tensor {key!r} has shape {list(t.shape)}, expected {list(spec.shape)}")
            continue
        items.append(Item(name, spec.feature, spec.kind, spec.shape, _target_dtype(spec.kind, t.dtype, dtype), (key,)))
    problems += [f"unexpected drafter tensor {key!r} (not a parameter of a {src.drafter.kind} drafter of this "
                 "config)" for key in names.values()]
    return items, problems
