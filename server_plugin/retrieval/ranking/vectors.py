"""Products of many stored vectors with one query vector, for half-precision rows too, and the
pick of the best k scores (`k_best`: torch's kernels where they are faster).

The live index keeps its vectors in float16 (`search_half_vectors`): half the memory of float32,
and the dense channel of a campaign of 100,000 messages is a scan of about 175,000 vectors, bound
by memory bandwidth. numpy has no fast float16 kernel (it converts element by element: 10x
slower than float32), torch has one (bench/README.md, `scale_profile.py`: about 5x faster than
the float32 product at that size). The scores differ from float32's by under 3e-4 in cosine.

A large scan is split in two halves, one on a helper thread (torch and BLAS let other threads
run meanwhile): on 2 quiet cores the 108,719 float16 rows of a 100,000-message campaign take
2.7 ms instead of 5.1 ms; on a busy machine the helper only waits for a core (no spinning, unlike
a second torch thread, which the embedder keeps at one). torch multiplies the rows in blocks of
powers of two (`power_blocks`: a kernel per number of rows is compiled and kept on some CPUs).

`Int8Rows` and `int8_dot` are the first pass of a two-pass scan (ranking/refine.py): an int8
copy of the rows, a third of the float16 scan's cost after an idle pause, each score off by up
to ~3e-3, never an answer by itself.
"""

from __future__ import annotations

import functools
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


def k_best(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of `k` best scores, in no order (which of equal scores at the k-th place is kept
    is arbitrary, as with `np.argpartition`). torch's selection reads the scores once: ~0.6 ms
    over 108,000 rows against argpartition's ~1.4 ms (which negates them first)."""
    torch = torch_or_none()
    if torch is None or scores.dtype != np.float64 or not scores.flags.c_contiguous:
        return np.argpartition(-scores, k - 1)[:k]
    with torch.inference_mode():
        return torch.topk(torch.from_numpy(scores), k, sorted=False).indices.numpy()


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
        table = torch.from_numpy(rows)
        out = torch.cat([torch.matmul(table[lo:lo + size], column).squeeze(1)
                         for lo, size in power_blocks(len(rows))] or [torch.zeros(0, dtype=torch.float16)])
    return out.numpy().astype(np.float32)


def power_blocks(n: int) -> list[tuple[int, int]]:
    """(start, size) of blocks of `n` rows whose sizes are powers of two, largest first.

    On a CPU with AVX-512 float16 torch's float16 product compiles a kernel for each new number
    of rows and keeps it (about 0.6 MB each, up to a cache of 1,024): the index gains rows every
    turn, and the sidecar grew by ~0.6 MB a turn, and the rescoring of a few gathered rows each
    query. In blocks of powers of two there are at most ~20 numbers of rows, whatever comes; the
    scores are the same to the bit, and one block more per set bit costs ~0.05 ms."""
    blocks, lo = [], 0
    for bit in range(n.bit_length() - 1, -1, -1):
        if n & (1 << bit):
            blocks.append((lo, 1 << bit))
            lo += 1 << bit
    return blocks


# ---------------------------------------------------------------------------------------------
# The int8 copy: a first pass over every row at a third of the float16 scan's cost


class Int8Rows:
    """An int8 copy of the first rows of a float matrix that only grows at its end, with one
    scale a row (`int8_dot` multiplies it). `sync` quantizes the rows added since the last call,
    in one batch: a bulk load pays once, a new message pays for its own row.

    The scales are bfloat16 (torch's int8 kernel takes them so), kept as their 16 bits in numpy.
    A score is off by up to ~3e-3 (components rounded to 1/254 of the row's largest, the query
    and the score to bfloat16): a first pass, never an answer (ranking.refine rescores exactly).
    """

    def __init__(self, dim: int) -> None:
        self.rows = np.zeros((0, dim), dtype=np.int8)
        self.scale_bits = np.zeros(0, dtype=np.int16)
        self.n = 0

    def sync(self, source: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The copy of `source[:n]` as (int8 rows, bfloat16 scale bits); `source` gained rows
        at its end only since the last call."""
        if n < self.n:  # cannot happen with a live index's append-only rows; start over
            self.n = 0
        if n > len(self.rows):
            cap = max(n, 2 * len(self.rows))
            self.rows = np.concatenate([self.rows[: self.n], np.zeros((cap - self.n, self.rows.shape[1]), np.int8)])
            self.scale_bits = np.concatenate([self.scale_bits[: self.n], np.zeros(cap - self.n, np.int16)])
        for lo in range(self.n, n, _BLOCK):  # in blocks: bounded float32 scratch
            hi = min(n, lo + _BLOCK)
            self.rows[lo:hi], self.scale_bits[lo:hi] = quantize(source[lo:hi])
        self.n = n
        return self.rows[:n], self.scale_bits[:n]


def quantize(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows as int8 (the largest component of a row → ±127) and each row's scale, rounded to
    bfloat16 (returned as its 16 bits)."""
    r = np.asarray(rows, dtype=np.float32)
    bits = (np.maximum(np.abs(r).max(axis=1), 1e-30) / np.float32(127)).astype(np.float32).view(np.uint32)
    # round to nearest even in the upper 16 bits: what torch's conversion to bfloat16 does
    top = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    scale = (top.astype(np.uint32) << np.uint32(16)).view(np.float32)
    q = np.clip(np.rint(r / scale[:, None]), -127, 127).astype(np.int8)
    return q, top.view(np.int16)


INT8_DIM_STEP = 16  # torch's int8 kernel takes vectors of a multiple of this many components


@functools.lru_cache(maxsize=None)
def int8_ready(dim: int) -> bool:
    """Whether this torch has the int8 kernel for vectors of `dim` components (its shapes are
    checked: a dimension not a multiple of 16 fails it; a build without it has no first pass).
    Asked by a query, not by the index's build: importing torch on the build's thread while the
    embedder imports it on its own left the process to abort at exit."""
    torch = torch_or_none()
    if torch is None or dim % INT8_DIM_STEP or not hasattr(torch, "_weight_int8pack_mm"):
        return False
    try:
        with torch.inference_mode():
            torch._weight_int8pack_mm(torch.zeros((1, dim), dtype=torch.bfloat16),
                                      torch.zeros((2, dim), dtype=torch.int8), torch.ones(2, dtype=torch.bfloat16))
    except (RuntimeError, NotImplementedError):  # pragma: no cover - a torch built without it
        return False
    return True


def int8_dot(rows: np.ndarray, scale_bits: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """Approximate `rows @ vector` from an `Int8Rows` copy, as float32. On one thread: a scan
    after an idle pause is bound by memory, and halves on two threads were no faster there
    (`scan_cost.py`)."""
    torch = torch_or_none()
    assert torch is not None  # int8_ready said so
    with torch.inference_mode():
        # The query as two bfloat16 rows, its rounding and what that rounding left: the rows
        # are read once for both (about a sixth slower than one query row), and no error is
        # shared by every row's score (one would move the channel's mean, which ranking keeps).
        exact = torch.from_numpy(np.asarray(vector, dtype=np.float32))
        high = exact.to(torch.bfloat16)
        query = torch.stack([high, (exact - high.float()).to(torch.bfloat16)])
        scales = torch.from_numpy(scale_bits).view(torch.bfloat16)
        out = torch._weight_int8pack_mm(query, torch.from_numpy(rows), scales).float()
    return (out[0] + out[1]).numpy()
