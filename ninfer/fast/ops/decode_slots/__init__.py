from .naive import decode_slots_naive
from .triton import decode_slots

__all__ = ["decode_slots", "decode_slots_naive"]
