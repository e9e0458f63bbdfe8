from .naive import prefill_attention_naive
from .triton import prefill_attention

__all__ = ["prefill_attention", "prefill_attention_naive"]
