"""bfloat16 numbers as the first pass's copies keep them (vectors.py quantizes, kernels.py and
refine.py read): the top 16 bits of a float32, held as uint16 / int16 in numpy.

Below both vectors.py and kernels.py (vectors imports kernels), so that each reads the one
conversion here rather than a copy of its own."""

from __future__ import annotations

import functools

import numpy as np


def bits(values: np.ndarray, up: bool = False) -> np.ndarray:
    """float32 `values` rounded to bfloat16, as its 16 bits (uint16): to nearest even, what
    torch's conversion does, or (`up`, for positive values) to the next one up."""
    raw = np.asarray(values, dtype=np.float32).view(np.uint32)
    if up:
        return ((raw + np.uint32(0xFFFF)) >> np.uint32(16)).astype(np.uint16)
    odd = (raw >> np.uint32(16)) & np.uint32(1)  # a tie goes to the even pattern
    return ((raw + np.uint32(0x7FFF) + odd) >> np.uint32(16)).astype(np.uint16)


def value(pattern: np.ndarray) -> np.ndarray:
    """The float32 value of bfloat16 bits (uint16 or int16)."""
    return (np.asarray(pattern).astype(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


@functools.lru_cache(maxsize=1)
def table() -> np.ndarray:
    """The float32 value of every bfloat16 bit pattern (256 KB, made once, read-only): a compiled
    loop finds a row's scale with one lookup."""
    every = value(np.arange(1 << 16, dtype=np.uint32))
    every.flags.writeable = False
    return every
