from .naive import gdn_decode_naive
from .triton import gdn_conv_update, gdn_decode, gdn_recurrent_update

__all__ = ["gdn_conv_update", "gdn_decode", "gdn_decode_naive", "gdn_recurrent_update"]
