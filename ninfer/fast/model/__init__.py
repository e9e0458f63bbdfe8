"""The fast Qwen3.5 model executor: fused resident weights, decode and prefill over the planned pools."""

from .kernels import Kernels, get_kernels
from .model import FastModel
from .weights import FastWeights, load_fast_weights

__all__ = ["FastModel", "FastWeights", "Kernels", "get_kernels", "load_fast_weights"]
