"""The reference Qwen3.5 model: plain torch on CPU in fp32 (or fp64), explicit per-sequence state; the oracle."""

from .model import ReferenceModel
from .state import GDNState, KVCache, SequenceState
from .weights import load_model, load_weights, weights_from_hf_dir

__all__ = ["GDNState", "KVCache", "ReferenceModel", "SequenceState", "load_model", "load_weights",
           "weights_from_hf_dir"]
