from .naive import rope_inv_freq, rope_kv_write_naive
from .triton import rope_kv_write

__all__ = ["rope_inv_freq", "rope_kv_write", "rope_kv_write_naive"]
