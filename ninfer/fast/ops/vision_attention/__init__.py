from .naive import vision_attention_naive
from .triton import vision_attention

__all__ = ["vision_attention", "vision_attention_naive"]
