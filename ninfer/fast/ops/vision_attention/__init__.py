from .naive import vision_attention_naive
from .sdpa import frames_sdpa
from .triton import TILES, vision_attention

__all__ = ["TILES", "frames_sdpa", "vision_attention", "vision_attention_naive"]
