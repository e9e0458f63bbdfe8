"""Image bytes the Gateway acquired, and their safe decoding into a Pillow image.

Decoding reads only bytes already in memory (no file or URL is opened here). Before any pixel is decoded the
header's size is checked against ``max_pixels``, so a decompression bomb is refused without expanding it; a
truncated or corrupt file, an unsupported format, or an animation's frames past the first never reach the
processor.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass, field

from .image_processor import ImageRejected

FORMATS = ("PNG", "JPEG", "WEBP", "GIF")


@dataclass(frozen=True)
class ImageData:
    """The encoded bytes of one image and where they came from (for messages: "data URL", a file name...)."""

    data: bytes = field(repr=False)
    source: str


def decode_image(image: ImageData, max_pixels: int):
    """The first frame of a PNG, JPEG, WebP or GIF as a loaded Pillow image; ImageRejected naming the fault."""
    from PIL import Image

    where = f"image from {image.source}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(image.data), formats=FORMATS)
            if img.width * img.height > max_pixels:
                raise ImageRejected(f"{where} is {img.width}x{img.height} = {img.width * img.height} pixels, over "
                                    f"the limit of {max_pixels}")
            img.seek(0)  # an animation's first frame
            img.load()
    except ImageRejected:
        raise
    except Image.UnidentifiedImageError:
        raise ImageRejected(f"{where} is not a PNG, JPEG, WebP or GIF image") from None
    except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError,
            Image.DecompressionBombWarning) as e:
        raise ImageRejected(f"{where} cannot be decoded: {e}") from None
    return img
