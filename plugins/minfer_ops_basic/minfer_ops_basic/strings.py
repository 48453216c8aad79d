"""Kernels: string ops (StringNormalizer, StringConcat, StringSplit, RegexFullMatch).

Strings are numpy object arrays of Python ``str`` (minfer's mapping of
TensorProto.STRING); every kernel here returns object arrays.
"""

from __future__ import annotations

import re

import numpy as np

from minfer_core import kernel


def _strings(values, shape: tuple[int, ...]) -> np.ndarray:
    """An object array of the given shape holding ``values`` (a flat sequence of str)."""
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out.reshape(shape)


def _text(value) -> str:
    """An element as str (string tensors fed as bytes hold UTF-8)."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _change_case(word: str, upper: bool) -> str:
    """Character by character, as C's towupper/towlower: a letter whose case form is longer ("ß" -> "SS") stays."""
    out = []
    for c in word:
        changed = c.upper() if upper else c.lower()
        out.append(changed if len(changed) == 1 else c)
    return "".join(out)


@kernel("StringNormalizer", since=10, views=False)
def string_normalizer(x, *, case_change_action="NONE", is_case_sensitive=0, locale=None, stopwords=None):
    """StringNormalizer-10: drop stopwords from a [C] or [1, C] tensor, then lower- or upper-case what is left."""
    # locale only picks the case tables in other runtimes; Python's str.lower/upper use Unicode's own rules
    if case_change_action not in ("NONE", "LOWER", "UPPER"):
        raise ValueError(f"StringNormalizer: case_change_action {case_change_action!r}; expected NONE, LOWER or UPPER")
    words = [_text(v) for v in x.reshape(-1)]
    if stopwords:
        fold = (lambda s: s) if is_case_sensitive else str.lower
        stop = {fold(w) for w in stopwords}
        words = [w for w in words if fold(w) not in stop]
    if case_change_action != "NONE":
        words = [_change_case(w, case_change_action == "UPPER") for w in words]
    if not words:
        words = [""]  # ONNX: everything filtered out leaves one empty string
    return _strings(words, (len(words),) if x.ndim == 1 else (1, len(words)))


@kernel("StringConcat", since=20, views=False)
def string_concat(x, y):
    """StringConcat-20: elementwise x + y with numpy broadcasting."""
    a, b = np.broadcast_arrays(x, y)
    return _strings([_text(p) + _text(q) for p, q in zip(a.reshape(-1), b.reshape(-1))], a.shape)


def _split(text: str, delimiter: str | None, maxsplit: int | None) -> list[str]:
    """Python's str.split, as onnx's reference; without a delimiter, whitespace runs split and the ends are trimmed."""
    limit = -1 if maxsplit is None else maxsplit
    if not delimiter:
        # str.split(None, n) keeps the whitespace that ends the remainder; ONNX trims it
        return text.strip().split(None, limit)
    return text.split(delimiter, limit)


@kernel("StringSplit", since=20, views=False)
def string_split(x, *, delimiter=None, maxsplit=None):
    """StringSplit-20: each element split into pieces padded with "" to the longest; and the piece counts."""
    pieces = [_split(_text(v), delimiter, maxsplit) for v in x.reshape(-1)]
    width = max((len(p) for p in pieces), default=0)
    counts = np.array([len(p) for p in pieces], dtype=np.int64).reshape(x.shape)
    flat = [s for p in pieces for s in p + [""] * (width - len(p))]
    return _strings(flat, x.shape + (width,)), counts


@kernel("RegexFullMatch", since=20, views=False)
def regex_full_match(x, *, pattern=None):
    """RegexFullMatch-20: whether each element matches pattern as a whole (RE2 syntax; Python re reads its common subset)."""
    if pattern is None:
        raise ValueError("RegexFullMatch needs a pattern attribute")
    regex = re.compile(pattern)
    hits = [regex.fullmatch(_text(v)) is not None for v in x.reshape(-1)]
    return np.array(hits, dtype=bool).reshape(x.shape)


# --- TfIdfVectorizer ---------------------------------------------------------------


def _pool_ngrams(pool: list, ngram_counts: list[int]) -> dict[tuple, int]:
    """Each pool n-gram (a tuple of tokens) -> its index in pool order; ngram_counts[k] starts the (k+1)-grams."""
    ends = list(ngram_counts[1:]) + [len(pool)]
    grams = [tuple(pool[at : at + n]) for n, (lo, hi) in enumerate(zip(ngram_counts, ends), start=1) for at in range(lo, hi, n)]
    return {gram: i for i, gram in reversed(list(enumerate(grams)))}  # reversed: a repeated n-gram keeps its first index


def _row_counts(row: list, table: dict[tuple, int], lengths: range, max_skip: int, size: int) -> np.ndarray:
    """How often each pool n-gram occurs in one row, over every skip up to max_skip (unigrams once per token)."""
    counts = np.zeros(size, dtype=np.float64)
    for n in lengths:
        for skip in range(max_skip + 1 if n > 1 else 1):
            step = skip + 1
            for first in range(len(row) - (n - 1) * step):
                hit = table.get(tuple(row[first : first + (n - 1) * step + 1 : step]))
                if hit is not None:
                    counts[hit] += 1
    return counts


@kernel("TfIdfVectorizer", since=9, views=False)
def tfidf_vectorizer(
    x,
    *,
    max_gram_length,
    max_skip_count,
    min_gram_length,
    mode,
    ngram_counts,
    ngram_indexes,
    pool_int64s=None,
    pool_strings=None,
    weights=None,
):
    """TfIdfVectorizer-9: n-gram counts of each row (TF), their presence (IDF) or counts (TFIDF) times weights."""
    if mode not in ("TF", "IDF", "TFIDF"):
        raise ValueError(f"TfIdfVectorizer: mode {mode!r}; expected TF, IDF or TFIDF")
    pool = list(pool_strings) if pool_strings is not None else [int(v) for v in (pool_int64s or [])]
    table = _pool_ngrams(pool, list(ngram_counts))
    rows = x.reshape(1, -1) if x.ndim == 1 else x
    tokens = [[_text(v) for v in r] if pool_strings is not None else [int(v) for v in r] for r in rows]
    lengths = range(min_gram_length, max_gram_length + 1)
    counts = np.zeros((len(tokens), len(ngram_indexes)))
    for i, r in enumerate(tokens):
        counts[i] = _row_counts(r, table, lengths, max_skip_count, len(ngram_indexes))
    if mode == "IDF":
        counts = np.minimum(counts, 1.0)
    if mode != "TF":
        counts = counts * (np.asarray(weights, dtype=np.float64) if weights is not None else 1.0)
    out = np.zeros((rows.shape[0], max(ngram_indexes) + 1), dtype=np.float32)
    np.add.at(out, (slice(None), np.asarray(ngram_indexes)), counts.astype(np.float32))
    return out.reshape(-1) if x.ndim == 1 else out
