from .conv import gdn_conv_prefill
from .naive import chunk_ends, conv_window_at, gdn_chunk_naive, gdn_conv_prefill_naive
from .triton import gdn_chunk

__all__ = ["chunk_ends", "conv_window_at", "gdn_chunk", "gdn_chunk_naive", "gdn_conv_prefill", "gdn_conv_prefill_naive"]
