from .naive import gather_pages, paged_decode_attention_naive
from .triton import choose_num_splits, paged_decode_attention

__all__ = ["choose_num_splits", "gather_pages", "paged_decode_attention", "paged_decode_attention_naive"]
