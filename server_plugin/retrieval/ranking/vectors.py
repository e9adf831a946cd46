"""Products of many stored vectors with one query vector, for half-precision rows too.

The live index keeps its vectors in float16 (`search_half_vectors`): half the memory of float32,
and the dense channel of a campaign of 100,000 messages is a scan of about 175,000 vectors, bound
by memory bandwidth. numpy has no fast float16 kernel (it converts element by element: 10x
slower than float32), torch has one (bench/README.md, `scale_profile.py`: about 5x faster than
the float32 product at that size). The scores differ from float32's by under 3e-4 in cosine.

A large scan is split in two halves, one on a helper thread (torch and BLAS let other threads
run meanwhile): on 2 quiet cores the 108,719 float16 rows of a 100,000-message campaign take
2.7 ms instead of 5.1 ms; on a busy machine the helper only waits for a core (no spinning, unlike
a second torch thread, which the embedder keeps at one).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

_BLOCK = 16_384  # rows converted at a time where torch is missing (bounded extra memory)
SPLIT_ROWS = 32_768  # from here a scan is halved across two threads (below, the hand-off costs more)
_HELPER = ThreadPoolExecutor(max_workers=2, thread_name_prefix="chronicler-dot")


def torch_or_none():
    """The torch module, or None where it is not installed (a trimmed install still ranks)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency; a trimmed install still ranks
        return None
    return torch


def dot(rows: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """`rows @ vector` as float32, whatever the rows' precision (float32 or float16); a large
    scan in two halves on two threads."""
    if len(rows) >= SPLIT_ROWS:
        half = len(rows) // 2
        other = _HELPER.submit(_dot, rows[half:], vector)
        return np.concatenate([_dot(rows[:half], vector), other.result()])
    return _dot(rows, vector)


def _dot(rows: np.ndarray, vector: np.ndarray) -> np.ndarray:
    if rows.dtype != np.float16:
        return rows @ np.asarray(vector, dtype=rows.dtype)
    torch = torch_or_none()
    if torch is None or not rows.flags.c_contiguous:
        query = np.asarray(vector, dtype=np.float32)
        return np.concatenate([rows[i:i + _BLOCK].astype(np.float32) @ query
                               for i in range(0, len(rows), _BLOCK)] or [np.zeros(0, np.float32)])
    with torch.inference_mode():
        # A matrix product with a one-column matrix, not `torch.mv`: the same scores to the bit,
        # and on a CPU where float16 is computed, not streamed (one with AVX-512 float16, where
        # the scan is bound by arithmetic), about a fifth faster (bench/README.md, `scan_cost.py`).
        column = torch.from_numpy(np.asarray(vector, dtype=np.float16)).unsqueeze(1)
        out = torch.matmul(torch.from_numpy(rows), column).squeeze(1)
    return out.numpy().astype(np.float32)
