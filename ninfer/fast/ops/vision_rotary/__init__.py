from .naive import vision_rotary_naive
from .triton import vision_rotary

__all__ = ["vision_rotary", "vision_rotary_naive"]
