"""Sampling defaults from a model's `generation_config.json`, as vLLM's `--generation-config auto` takes them.

A request's own value always wins; a field neither sets keeps the caller's plain default. The fields are those vLLM
reads from the file that a request can also set: temperature, top_p, top_k, min_p, repetition_penalty. HF's
`"do_sample": false` means greedy decoding, so it becomes temperature 0 and the filters are not taken.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .params import SamplingParams, SamplingParamsError

FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


@dataclass(frozen=True)
class SamplingDefaults:
    values: tuple[tuple[str, Any], ...] = ()
    source: str = ""  # where the values came from; "" for none at all

    @classmethod
    def from_generation_config(cls, data: Mapping[str, Any], source: str) -> "SamplingDefaults":
        """From a parsed generation_config.json; ValueError names the source and the field when it is unusable."""
        if data.get("do_sample") is False:
            return cls((("temperature", 0.0),), source)
        values = {k: data[k] for k in FIELDS if data.get(k) is not None}
        try:
            SamplingParams.create(**values)
        except (SamplingParamsError, TypeError) as e:
            raise ValueError(f"{source}: {e}") from None
        return cls(tuple(values.items()), source)

    def fill(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """`fields` (None meaning unset) over these defaults; unset fields left out."""
        out = dict(self.values)
        out.update((k, v) for k, v in fields.items() if v is not None)
        return out

    def describe(self) -> str:
        """For the ready line: where the defaults came from and what they are."""
        if not self.source:
            return "plain sampling defaults"
        shown = ", ".join(f"{k} {v:g}" for k, v in self.values) or "nothing to take"
        return f"sampling defaults from {self.source} ({shown})"
