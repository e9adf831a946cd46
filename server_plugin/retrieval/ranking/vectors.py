"""Products of many stored vectors with one query vector, for half-precision rows too.

The live index keeps its vectors in float16 (`search_half_vectors`): half the memory of float32,
and the dense channel of a campaign of 100,000 messages is a scan of about 175,000 vectors, bound
by memory bandwidth. numpy has no fast float16 kernel (it converts element by element: 10x
slower than float32), torch has one (bench/README.md, `scale_profile.py`: about 5x faster than
the float32 product at that size). The scores differ from float32's by under 3e-4 in cosine.
"""

from __future__ import annotations

import numpy as np

_BLOCK = 16_384  # rows converted at a time where torch is missing (bounded extra memory)


def _torch():
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency; a trimmed install still ranks
        return None
    return torch


def dot(rows: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """`rows @ vector` as float32, whatever the rows' precision (float32 or float16)."""
    if rows.dtype != np.float16:
        return rows @ np.asarray(vector, dtype=rows.dtype)
    torch = _torch()
    if torch is None or not rows.flags.c_contiguous:
        query = np.asarray(vector, dtype=np.float32)
        return np.concatenate([rows[i:i + _BLOCK].astype(np.float32) @ query
                               for i in range(0, len(rows), _BLOCK)] or [np.zeros(0, np.float32)])
    with torch.inference_mode():
        out = torch.mv(torch.from_numpy(rows), torch.from_numpy(np.asarray(vector, dtype=np.float16)))
    return out.numpy().astype(np.float32)
