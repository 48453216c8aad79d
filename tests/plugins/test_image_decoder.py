"""minfer-ops-basic ImageDecoder-20: onnx's node cases, lossless round trips, and Pillow as an optional dependency.

Oracles: onnx's stored node-case outputs (every format), and for PNG the very
pixels that were encoded (lossless, so decoding must give them back exactly).
"""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest

from minfer_core import InferenceSession, KernelError, UnsupportedOpError
from minfer_core.testing.conformance import load_cases, run_case
from minfer_core.testing.ops import single_node_model

Image = pytest.importorskip("PIL.Image")  # the test extra installs Pillow; the plugin itself does not need it

CASES = [c for c in load_cases() if c.name.startswith("test_image_decoder")]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_image_decoder_node_case(case):
    """Each onnx node case (JPEG RGB/grayscale/BGR, JPEG 2000, BMP, PNG, TIFF, WebP, PNM) gives its stored pixels."""
    run_case(case)


def test_every_format_has_a_node_case():
    """The nine node cases are found (so the parametrized test above cannot pass empty)."""
    assert len(CASES) == 9


def encoded(pixels: np.ndarray, fmt: str = "PNG") -> np.ndarray:
    """The bytes of ``pixels`` encoded by Pillow, as the uint8 tensor ImageDecoder takes."""
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return np.frombuffer(buf.getvalue(), np.uint8)


def decode(stream: np.ndarray, pixel_format: str = "RGB") -> np.ndarray:
    model, feeds = single_node_model("ImageDecoder", 20, [stream], {"pixel_format": pixel_format})
    return InferenceSession(model).run(None, feeds)[0]


def test_png_round_trip_gives_the_pixels_back_in_rgb_and_bgr():
    """A lossless RGB image decodes to its exact pixels, (H, W, 3) uint8; BGR reverses the channel axis."""
    pixels = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    rgb, bgr = decode(encoded(pixels), "RGB"), decode(encoded(pixels), "BGR")
    assert (rgb.dtype, rgb.shape) == (np.uint8, (5, 7, 3))
    np.testing.assert_array_equal(rgb, pixels)
    np.testing.assert_array_equal(bgr, pixels[:, :, ::-1])


def test_grayscale_png_decodes_to_one_channel_or_three_equal_ones():
    """A grayscale image gives (H, W, 1) in Grayscale and its value repeated on 3 channels in RGB."""
    gray = np.random.default_rng(1).integers(0, 256, (4, 6), dtype=np.uint8)
    np.testing.assert_array_equal(decode(encoded(gray), "Grayscale"), gray[:, :, None])
    np.testing.assert_array_equal(decode(encoded(gray), "RGB"), np.repeat(gray[:, :, None], 3, axis=2))


def test_alpha_channel_is_dropped_in_rgb():
    """An RGBA PNG decodes to (H, W, 3): the output always has the channels pixel_format names."""
    rgba = np.random.default_rng(2).integers(0, 256, (3, 3, 4), dtype=np.uint8)
    rgba[..., 3] = 255  # opaque, so dropping alpha leaves the colour untouched
    np.testing.assert_array_equal(decode(encoded(rgba)), rgba[:, :, :3])


@pytest.mark.parametrize("pixel_format,channels", [("RGB", 3), ("Grayscale", 1)])
def test_bytes_that_are_not_an_image_give_an_empty_image(pixel_format, channels):
    """A stream that does not decode gives an empty (0, 0, C) uint8 image, as the onnx spec says, not an exception."""
    out = decode(np.frombuffer(b"certainly not an image", np.uint8), pixel_format)
    assert (out.dtype, out.shape) == (np.uint8, (0, 0, channels))


def test_formats_onnx_does_not_list_are_not_decoded():
    """A GIF, which Pillow reads but onnx's list of formats lacks, gives the empty image: only the listed decoders run."""
    pixels = np.zeros((4, 4), np.uint8)
    assert Image.open(io.BytesIO(encoded(pixels, "GIF").tobytes())).format == "GIF"  # Pillow itself would decode it
    assert decode(encoded(pixels, "GIF"), "Grayscale").shape == (0, 0, 1)


def test_unknown_pixel_format_is_refused_at_build():
    """A pixel_format other than RGB, BGR, Grayscale is a KernelError at build that lists the three."""
    model, _ = single_node_model("ImageDecoder", 20, [np.zeros(4, np.uint8)], {"pixel_format": "CMYK"})
    with pytest.raises(KernelError, match="'CMYK' is not one of RGB, BGR, Grayscale"):
        InferenceSession(model)


def test_missing_pillow_says_what_to_install(monkeypatch):
    """Without Pillow, building an ImageDecoder node is an UnsupportedOpError naming the node and the [image] extra."""
    monkeypatch.setitem(sys.modules, "PIL", None)  # makes `import PIL` raise ImportError
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    model, _ = single_node_model("ImageDecoder", 20, [np.zeros(4, np.uint8)])
    with pytest.raises(UnsupportedOpError, match=r"\(ImageDecoder\) decodes images with Pillow.*pip install 'minfer-ops-basic\[image\]'"):
        InferenceSession(model)


def test_plugin_loads_without_pillow():
    """minfer-ops-basic registers its ops (ImageDecoder included) in a process where Pillow cannot be imported."""
    code = ("import sys; sys.modules['PIL'] = None\n"
            "from minfer_core import get_registry\n"
            "reg = get_registry()\n"
            "assert ('', 'ImageDecoder') in reg.ops and ('', 'Relu') in reg.ops, sorted(reg.ops)[:5]\n"
            "assert 'PIL' not in [m for m in sys.modules if sys.modules[m] is not None]\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
