"""Checks that an artifact's Bindings cover exactly the logical parameters of the selected features."""

from __future__ import annotations

import json
from typing import Mapping

from ninfer.models.qwen3_5.config import ConfigError, Qwen35Config
from ninfer.models.qwen3_5.drafter import RESOURCE, DrafterConfig, DrafterKind, drafter_parameters
from ninfer.models.qwen3_5.params import MTP, TEXT, VISION, logical_parameters

from .descriptor import Binding
from .errors import ArtifactError


def parse_config(raw: Mapping) -> Qwen35Config:
    try:
        return Qwen35Config.from_dict(raw)
    except ConfigError as e:
        raise ArtifactError(f"descriptor.config.{e.field}", "invalid config", str(e)) from None
    except TypeError as e:
        raise ArtifactError("descriptor.config", "invalid config", str(e)) from None


def check_bindings(cfg: Qwen35Config, bindings: Mapping[str, Binding], features: tuple[str, ...]) -> None:
    """Text must be complete; every selected model feature (MTP, Vision) must be complete; shapes must be the logical
    ones."""
    for feature in (f for f in features if f in (TEXT, MTP, VISION)):
        specs = logical_parameters(cfg, (feature,))
        if feature == MTP and not specs:
            raise ArtifactError("feature 'mtp'", "not available", "config has mtp_num_hidden_layers=0")
        if feature == VISION and not specs:
            raise ArtifactError("feature 'vision'", "not available",
                                "the config carries no vision geometry (reconvert the checkpoint with this ninfer)")
        missing = sorted(n for n in specs if n not in bindings)
        if missing:
            raise ArtifactError(f"feature {feature!r}", "missing bindings",
                                f"{len(missing)} missing: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
        for name, spec in specs.items():
            b = bindings[name]
            if b.shape != spec.shape:
                raise ArtifactError(f"binding {name!r}", "shape differs from the config's logical shape",
                                    f"{list(b.shape)} vs {list(spec.shape)}")
        extra = sorted(n for n, b in bindings.items() if b.feature == feature and n not in specs)
        if extra:
            raise ArtifactError(f"binding {extra[0]!r}", "not a logical parameter of the config",
                                f"{len(extra)} unexpected {feature} binding(s)")


DRAFTER_FEATURES = tuple(k.value for k in DrafterKind)


def parse_drafter(raw: bytes, target: Qwen35Config) -> DrafterConfig:
    """The drafter config resource, checked against the target it drafts for."""
    try:
        cfg = DrafterConfig.from_dict(json.loads(raw))
        cfg.check_fits(target)
    except ConfigError as e:
        raise ArtifactError(f"resource {RESOURCE!r}: {e.field}", "invalid drafter config", str(e)) from None
    except (TypeError, ValueError) as e:
        raise ArtifactError(f"resource {RESOURCE!r}", "invalid drafter config", str(e)) from None
    return cfg


def check_drafter_bindings(cfg: DrafterConfig, bindings: Mapping[str, Binding]) -> None:
    """The drafter's bindings are exactly its logical parameters, at their shapes, under its one feature."""
    specs = drafter_parameters(cfg)
    mine = {n: b for n, b in bindings.items() if b.feature in DRAFTER_FEATURES}
    other = sorted(n for n, b in mine.items() if b.feature != cfg.kind.value)
    if other:
        raise ArtifactError(f"binding {other[0]!r}", "feature differs from the drafter's",
                            f"{mine[other[0]].feature!r} in a {cfg.kind.value!r} artifact")
    missing = sorted(n for n in specs if n not in mine)
    if missing:
        raise ArtifactError(f"feature {cfg.kind.value!r}", "missing bindings",
                            f"{len(missing)} missing: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
    for name, spec in specs.items():
        if mine[name].shape != spec.shape:
            raise ArtifactError(f"binding {name!r}", "shape differs from the drafter config's logical shape",
                                f"{list(mine[name].shape)} vs {list(spec.shape)}")
    extra = sorted(n for n in mine if n not in specs)
    if extra:
        raise ArtifactError(f"binding {extra[0]!r}", "not a logical parameter of the drafter config",
                            f"{len(extra)} unexpected {cfg.kind} binding(s)")
