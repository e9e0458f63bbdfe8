from .naive import layer_norm_naive
from .triton import layer_norm

__all__ = ["layer_norm", "layer_norm_naive"]
