"""Sampling on the device: the fast Program's per-sequence tables, per-step graph input data and results around the
``sample`` and ``logprobs`` ops (docs/sampling.md section 7)."""

from .rows import VARIANTS, SampleRow, variant_of
from .sampler import DeviceSampler
from .tables import SequenceTables

__all__ = ["DeviceSampler", "SampleRow", "SequenceTables", "VARIANTS", "variant_of"]
