from .naive import gemv_naive, gemv_swiglu_naive
from .triton import MAX_ROWS, GemvConfig, gemv, gemv_swiglu, pick_config

__all__ = ["MAX_ROWS", "GemvConfig", "gemv", "gemv_naive", "gemv_swiglu", "gemv_swiglu_naive", "pick_config"]
