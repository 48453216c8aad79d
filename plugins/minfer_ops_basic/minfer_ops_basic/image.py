"""Kernel: ImageDecoder-20, through Pillow (an optional dependency: ``pip install 'minfer-ops-basic[image]'``).

Pillow is imported when a node is built, not when the plugin loads, so the
plugin works without it and only a model that decodes images asks for it.
"""

from __future__ import annotations

import io

import numpy as np

from minfer_core import KernelError, UnsupportedOpError, kernel

_CHANNELS = {"RGB": 3, "BGR": 3, "Grayscale": 1}
# Pillow's names of the formats onnx lists (PPM reads PBM/PGM/PPM/PNM). Bytes come from feeds, so nothing else
# is tried: Pillow would otherwise open EPS through Ghostscript, among others.
_FORMATS = ("BMP", "JPEG", "JPEG2000", "TIFF", "PNG", "WEBP", "PPM")


def _pillow_image(where: str):
    """PIL.Image, or an error naming the node ``where`` and what to install."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise UnsupportedOpError(
            f"{where} decodes images with Pillow, which is not installed: pip install 'minfer-ops-basic[image]' "
            "(or pip install pillow)"
        ) from exc
    return Image


@kernel("ImageDecoder", since=20, prepare=True, views=False)
def image_decoder(ctx, *, pixel_format="RGB"):
    """ImageDecoder-20: encoded bytes (BMP, JPEG, JPEG 2000, TIFF, PNG, WebP, PNM) -> uint8 (H, W, C)."""
    where = f"node {ctx.node_name or '<unnamed>'!r} (ImageDecoder)"
    if pixel_format not in _CHANNELS:
        raise KernelError(f"{where}: pixel_format {pixel_format!r} is not one of {', '.join(_CHANNELS)}")
    image = _pillow_image(where)

    def run(encoded_stream):
        return _decode(image, encoded_stream, pixel_format)

    return run


def _decode(image, encoded: np.ndarray, pixel_format: str) -> np.ndarray:
    """The decoded pixels, or an empty (0, 0, C) image when the bytes are not one of the formats (as onnx specifies)."""
    try:
        with image.open(io.BytesIO(encoded.tobytes()), formats=_FORMATS) as img:
            pixels = np.array(img.convert("L" if pixel_format == "Grayscale" else "RGB"), dtype=np.uint8)
    except (OSError, ValueError, SyntaxError):  # Pillow's ways of saying the stream is not an image it reads
        return np.zeros((0, 0, _CHANNELS[pixel_format]), np.uint8)
    if pixel_format == "Grayscale":
        return pixels[:, :, None]
    return np.ascontiguousarray(pixels[:, :, ::-1]) if pixel_format == "BGR" else pixels
