from .naive import slot_copy_naive
from .triton import slot_copy

__all__ = ["slot_copy", "slot_copy_naive"]
