"""Kernels: scans and signal processing (CumSum, CumProd, DFT, STFT, windows, MelWeightMatrix).

Complex tensors travel in ONNX's layout: a trailing dim of 2 (real, imaginary),
or of 1 for a real signal.
"""

from __future__ import annotations

import numpy as np

import minfer_core
from minfer_core import kernel


def _scalar(v) -> int | float:
    return np.asarray(v).reshape(-1)[0].item()


# --- Cumulative scans -------------------------------------------------------------------------


def _scan(x: np.ndarray, axis, exclusive: int, reverse: int, ufunc: np.ufunc, identity, out) -> np.ndarray:
    """Inclusive/exclusive, forward/reverse running ufunc along axis, in x's dtype."""
    ax = int(_scalar(axis))
    ax = ax + x.ndim if ax < 0 else ax
    out = np.empty_like(x) if out is None else out
    # Reverse = a forward scan over flipped views of both input and output.
    src, dst = (np.flip(x, ax), np.flip(out, ax)) if reverse else (x, out)
    # dtype=x.dtype: numpy would otherwise widen small ints to the platform int.
    if not exclusive:
        ufunc.accumulate(src, axis=ax, dtype=x.dtype, out=dst)
        return out
    # Exclusive: position i sees only positions before it, so shift the scan by one.
    head, body, rest = ([slice(None)] * x.ndim for _ in range(3))
    head[ax], body[ax], rest[ax] = slice(0, 1), slice(1, None), slice(0, -1)
    ufunc.accumulate(src[tuple(rest)], axis=ax, dtype=x.dtype, out=dst[tuple(body)])
    dst[tuple(head)] = identity
    return out


@kernel("CumSum", since=11, out=True, views=False)
def cum_sum(x, axis, *, reverse=0, exclusive=0, out=None):
    """CumSum-11/14: running sum along axis (exclusive skips self, reverse runs from the end)."""
    return _scan(x, axis, exclusive, reverse, np.add, 0, out)


@kernel("CumProd", since=26, out=True, views=False)
def cum_prod(x, axis, *, reverse=0, exclusive=0, out=None):
    """CumProd-26: running product along axis (exclusive skips self, reverse runs from the end)."""
    return _scan(x, axis, exclusive, reverse, np.multiply, 1, out)


# --- DFT / STFT -----------------------------------------------------------------------------------


def _to_complex(x: np.ndarray) -> np.ndarray:
    """ONNX [..., 1|2] real/complex layout to a numpy complex array without the last dim."""
    return x[..., 0] if x.shape[-1] == 1 else x[..., 0] + 1j * x[..., 1]


def _from_complex(z: np.ndarray, dtype) -> np.ndarray:
    return np.stack([z.real, z.imag], axis=-1).astype(dtype)


def _dft(x: np.ndarray, dft_length, axis: int, inverse: int, onesided: int) -> np.ndarray:
    axis = axis + x.ndim if axis < 0 else axis
    if not 0 <= axis < x.ndim - 1:
        raise ValueError(f"DFT axis {axis} must name a signal dim of shape {x.shape}, not the complex dim")
    z = _to_complex(x)
    dim = z.shape[axis]
    if dft_length is not None:
        n = int(_scalar(dft_length))
    else:
        n = 2 * (dim - 1) if inverse and onesided else dim
    if n < 1:  # numpy refuses empty transforms; onnxruntime returns an empty axis
        empty = list(z.shape[:axis]) + [0] + list(z.shape[axis + 1 :])
        return np.zeros(empty + [1 if inverse and onesided else 2], x.dtype)
    if inverse and onesided:
        # IRFFT: Hermitian half spectrum in, real signal (trailing dim 1) out.
        return np.fft.irfft(z, n, axis=axis)[..., None].astype(x.dtype)
    spectrum = np.fft.ifft(z, n, axis=axis) if inverse else np.fft.fft(z, n, axis=axis)
    if onesided:
        spectrum = np.take(spectrum, np.arange(n // 2 + 1), axis=axis)
    return _from_complex(spectrum, x.dtype)


@kernel("DFT", since=17, views=False)
def dft_17(input, dft_length=None, *, inverse=0, axis=1, onesided=0):
    """DFT-17: axis as an attribute (default 1, the first dim after batch)."""
    return _dft(input, dft_length, axis, inverse, onesided)


@kernel("DFT", since=20, views=False)
def dft_20(input, dft_length=None, axis=None, *, inverse=0, onesided=0):
    """DFT-20: axis as an optional input (default -2, the last signal dim)."""
    return _dft(input, dft_length, -2 if axis is None else int(_scalar(axis)), inverse, onesided)


@kernel("STFT", since=17, views=False)
def stft(signal, frame_step, window=None, frame_length=None, *, onesided=1):
    """STFT-17: DFT of windowed frames: [batch, frames, bins, 2]."""
    z = _to_complex(signal)
    length = z.shape[1]
    if frame_length is not None:
        size = int(_scalar(frame_length))
    else:
        size = length if window is None else window.shape[0]
    step = int(_scalar(frame_step))
    frames = (length - size) // step + 1
    # One gather builds every frame: starts down, offsets across.
    index = np.arange(frames)[:, None] * step + np.arange(size)
    chunks = z[:, index]
    if window is not None:
        chunks = chunks * window.astype(np.float64)
    spectrum = np.fft.fft(chunks, size, axis=-1)
    if onesided:
        spectrum = spectrum[..., : size // 2 + 1]
    return _from_complex(spectrum, signal.dtype)


# --- Windows and filter banks ------------------------------------------------------------------------


def _cosine_window(size, periodic: int, output_datatype: int, a0: float, a1: float, a2: float) -> np.ndarray:
    """a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N), N = size (periodic) or size - 1."""
    count = int(_scalar(size))
    span = count if periodic else count - 1
    angle = 2 * np.pi * np.arange(count, dtype=np.float64) / span
    return (a0 - a1 * np.cos(angle) + a2 * np.cos(2 * angle)).astype(minfer_core.onnx_dtype(output_datatype))


@kernel("HannWindow", since=17, views=False)
def hann_window(size, *, periodic=1, output_datatype=1):
    """HannWindow-17: 0.5 - 0.5 cos(2 pi n / N)."""
    return _cosine_window(size, periodic, output_datatype, 0.5, 0.5, 0.0)


@kernel("HammingWindow", since=17, views=False)
def hamming_window(size, *, periodic=1, output_datatype=1):
    """HammingWindow-17: alpha - (1 - alpha) cos(2 pi n / N), alpha = 25/46 as onnx defines it."""
    return _cosine_window(size, periodic, output_datatype, 25 / 46, 21 / 46, 0.0)


@kernel("BlackmanWindow", since=17, views=False)
def blackman_window(size, *, periodic=1, output_datatype=1):
    """BlackmanWindow-17: 0.42 - 0.5 cos(2 pi n / N) + 0.08 cos(4 pi n / N)."""
    return _cosine_window(size, periodic, output_datatype, 0.42, 0.5, 0.08)


def _mel_edges(num_mel: int, dft_length: int, rate: float, low: float, high: float) -> np.ndarray:
    """Spectrogram bin of each filter edge: num_mel + 2 points evenly spaced on the mel scale."""
    mel_low = 2595 * np.log10(1 + low / 700)
    mel_high = 2595 * np.log10(1 + high / 700)
    # onnx spaces the points by (high - low) / (num_mel + 2), not / (num_mel + 1).
    mels = mel_low + np.arange(num_mel + 2) * (mel_high - mel_low) / (num_mel + 2)
    hertz = 700 * (10 ** (mels / 2595) - 1)
    return np.floor((dft_length + 1) * hertz / rate).astype(np.int64)


@kernel("MelWeightMatrix", since=17, views=False)
def mel_weight_matrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz, *, output_datatype=1):
    """MelWeightMatrix-17: [dft_length // 2 + 1, num_mel_bins] triangular filters peaking at 1."""
    num_mel, n = int(_scalar(num_mel_bins)), int(_scalar(dft_length))
    edges = _mel_edges(num_mel, n, float(_scalar(sample_rate)), float(_scalar(lower_edge_hertz)), float(_scalar(upper_edge_hertz)))
    left, center, right = edges[:-2], edges[1:-1], edges[2:]
    j = np.arange(n // 2 + 1)[:, None]
    # A zero-width rising edge degenerates to a single 1 at the center.
    rise = np.where(center > left, (j - left) / np.maximum(center - left, 1), 1.0)
    fall = (right - j) / np.maximum(right - center, 1)
    out = np.where((j >= left) & (j <= center), rise, 0.0)
    out = np.where((j >= center) & (j < right), fall, out)
    return out.astype(minfer_core.onnx_dtype(output_datatype))


