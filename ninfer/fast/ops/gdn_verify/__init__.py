from .naive import gdn_verify_naive
from .triton import gdn_verify, supports

__all__ = ["gdn_verify", "gdn_verify_naive", "supports"]
