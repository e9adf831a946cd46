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

`Int4Rows` / `int4_dot` (the default) and `Int8Rows` / `int8_dot` are the first pass of a
two-pass scan (ranking/refine.py, `search_first_pass`): a copy of the rows in 4 or 8 bits a
component, each score off by ~5e-3 or ~5e-4 (standard deviation), never an answer by itself.
After an idle pause, as a turn comes, the scan is bound by memory: the int8 copy costs about
40 % of the float16 scan, the int4 copy under 30 % (bench/README.md, `scan_cost.py`).
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, TypeVar

import numpy as np

from ... import placement
from . import bfloat16 as bf16, kernels

T = TypeVar("T")

# Rows converted or quantized at a time: bounded scratch, and small enough for the CPU's cache
# (the int8 copy of 145,000 rows in 0.19 s by blocks of 2,048, 0.28 s by blocks of 16,384).
_BLOCK = 2_048
SPLIT_ROWS = 32_768  # from here a scan is halved across two threads (below, the hand-off costs more)
# A large scan's second half (`in_halves`): placed as the query's embedding is (placement.py),
# on the CPUs the embedding has just left idle, and the thread that hands it the rows waits off them.
_SCAN = ThreadPoolExecutor(max_workers=2, thread_name_prefix="chronicler-scan")


def torch_or_none():
    """The torch module, or None where it is not installed (a trimmed install still ranks)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency; a trimmed install still ranks
        return None
    return torch


def k_best(scores: np.ndarray, k: int, compiled: bool = False) -> np.ndarray:
    """Indices of `k` best scores, in no order (which of equal scores at the k-th place is kept
    is arbitrary, as with `np.argpartition`). `compiled`: the compiled pass of kernels.k_best
    where it can answer (~0.2 ms over 109,000 rows after idle). Else torch's selection, which
    reads the scores once: ~0.6 ms over 108,000 rows against argpartition's ~1.4 ms (which
    negates them first)."""
    found = kernels.k_best(scores, k) if compiled else None
    if found is not None:
        return found
    torch = torch_or_none()
    if torch is None or scores.dtype != np.float64 or not scores.flags.c_contiguous:
        return np.argpartition(-scores, k - 1)[:k]
    with torch.inference_mode():
        return torch.topk(torch.from_numpy(scores), k, sorted=False).indices.numpy()


def dot(rows: np.ndarray, vector: np.ndarray, placed: str = "off") -> np.ndarray:
    """`rows @ vector` as float32, whatever the rows' precision (float32 or float16); a large
    scan in two halves on two threads, placed as `placed` says (`in_halves`)."""
    if len(rows) >= SPLIT_ROWS:
        half = len(rows) // 2
        return np.concatenate(in_halves(lambda: _dot(rows[:half], vector),
                                        lambda: _dot(rows[half:], vector), placed))
    return _dot(rows, vector)


def in_halves(first: Callable[[], T], second: Callable[[], T], placed: str) -> tuple[T, T]:
    """`first()` on this thread and `second()` on `_SCAN` at once, the helper placed as the
    query's embedding is (`placed`: the setting `cpu_placement`) and this thread off those CPUs
    until both are done. Unplaced, the helper woke on this thread's CPU and waited there: no
    faster than one thread (bench/README.md, stop 41)."""
    moved = placement.leave(placed)
    try:
        other = _SCAN.submit(_placed, second, placed)
        mine = first()
        return mine, other.result()
    finally:
        if moved:
            placement.rejoin()


def _placed(work: Callable[[], T], placed: str) -> T:
    placement.embedding(placed)
    return work()


def _dot(rows: np.ndarray, vector: np.ndarray) -> np.ndarray:
    if rows.dtype != np.float16:
        return rows @ np.asarray(vector, dtype=rows.dtype)
    torch = torch_or_none()
    if torch is None or not rows.flags.c_contiguous:
        query = np.asarray(vector, dtype=np.float32)
        return np.concatenate([rows[i:i + _BLOCK].astype(np.float32) @ query
                               for i in range(0, len(rows), _BLOCK)] or [np.zeros(0, np.float32)])
    with torch.inference_mode():
        query = torch.from_numpy(np.asarray(vector, dtype=np.float16))
        table = torch.from_numpy(rows)
        if float16_mv():
            return torch.mv(table, query).numpy().astype(np.float32)
        # A matrix product with a one-column matrix, not `torch.mv`: the same scores to the bit,
        # and on a CPU where float16 is computed, not streamed (one with AVX-512 float16, where
        # the scan is bound by arithmetic), about a fifth faster (bench/README.md, `scan_cost.py`).
        column = query.unsqueeze(1)
        out = torch.cat([torch.matmul(table[lo:lo + size], column).squeeze(1)
                         for lo, size in power_blocks(len(rows))] or [torch.zeros(0, dtype=torch.float16)])
    return out.numpy().astype(np.float32)


@functools.lru_cache(maxsize=1)
def float16_mv() -> bool:
    """Whether float16 rows are multiplied by `torch.mv`: on a CPU without AVX-512, where the
    one-column product took 2.4x mv's time (bench/README.md, stop 41: 0.81 against 0.33 ms over
    1,500 rows, what the rescoring reads; 20.3 against 12.0 over 107,769). The scores there may
    differ from the product's by a float16 step; every caller on one machine takes the same."""
    torch = torch_or_none()
    return torch is not None and not str(torch.backends.cpu.get_cpu_capability()).startswith("AVX512")


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
# The int8 copy: a first pass over every row at about 40 % of the float16 scan's cost


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
    top = bf16.bits(np.maximum(np.abs(r).max(axis=1), 1e-30) / np.float32(127))
    q = np.clip(np.rint(r / bf16.value(top)[:, None]), -127, 127).astype(np.int8)
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


# ---------------------------------------------------------------------------------------------
# The int4 copy: half the int8 copy's bytes, the first pass by default (`search_first_pass`)

INT4_GROUP = 128  # components that share a scale and a zero point
INT4_BLOCK = 64  # rows torch's int4 kernel packs together (a copy holds a multiple of this)


@dataclass(frozen=True)
class Int4View:
    """An int4 copy as `int4_dot` reads it: the rows packed as torch's kernel takes them (`n`
    rows, then zero rows up to a multiple of INT4_BLOCK) and each group's (scale, zero point)
    as bfloat16 bits, shape (groups, rows, 2)."""

    packed: np.ndarray
    scale_zero: np.ndarray
    n: int


class Int4Rows:
    """An int4 copy of the first rows of a float matrix that only grows at its end (`Int8Rows`'
    twin). Each group of INT4_GROUP components of a row has its own scale and zero point, both
    bfloat16 values chosen before rounding (so that no rounding of theirs scales a score): a
    component is one of 16 steps between the group's least and greatest. `sync` packs the rows
    added since the last call, and the last partial block of INT4_BLOCK rows again."""

    def __init__(self, dim: int) -> None:
        self.packed = np.zeros((0, dim // 2), dtype=np.uint8)  # grown by doubling; read: [:top]
        # As the kernel reads them (groups, rows, 2), exactly `top` rows: it reads a strided
        # slice wrongly, so this grows by a copy when a block of rows is begun (1 in 32 turns).
        self.scale_zero = np.zeros((dim // INT4_GROUP, 0, 2), dtype=np.int16)
        self.n = 0
        self._view: Int4View | None = None

    def sync(self, source: np.ndarray, n: int) -> Int4View:
        """The copy of `source[:n]`; `source` gained rows at its end only since the last call."""
        if n < self.n:  # cannot happen with a live index's append-only rows; start over
            self.n, self._view = 0, None
        if n == self.n and self._view is not None:
            return self._view
        top = -(-n // INT4_BLOCK) * INT4_BLOCK
        if top > len(self.packed):
            grown = np.zeros((max(top, 2 * len(self.packed)), self.packed.shape[1]), np.uint8)
            grown[: len(self.packed)] = self.packed
            self.packed = grown
        if top != self.scale_zero.shape[1]:
            kept = min(top, self.scale_zero.shape[1])
            grown = np.zeros((self.scale_zero.shape[0], top, 2), np.int16)
            grown[:, :kept] = self.scale_zero[:, :kept]
            self.scale_zero = grown
        for lo in range(self.n // INT4_BLOCK * INT4_BLOCK, top, _BLOCK):  # _BLOCK: a multiple of INT4_BLOCK
            hi = min(top, lo + _BLOCK)
            rows = np.zeros((hi - lo, source.shape[1]), dtype=np.float32)
            rows[: min(hi, n) - lo] = source[lo:min(hi, n)]
            self.packed[lo:hi], scale_zero = quantize4(rows)
            self.scale_zero[:, lo:hi] = scale_zero.transpose(1, 0, 2)
        self.n = n
        self._view = Int4View(self.packed[:top], self.scale_zero, n)
        return self._view


def quantize4(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows (a multiple of INT4_BLOCK of them) as int4 in torch's packed layout, and each
    group's (scale, zero point) as bfloat16 bits, shape (rows, groups, 2): component x of a group
    is stored as q in 0..15, read back as (q - 8) * scale + zero."""
    r = np.asarray(rows, dtype=np.float32)
    n, dim = r.shape
    groups = r.reshape(n, dim // INT4_GROUP, INT4_GROUP)
    least = groups.min(axis=2)
    scale_bits = bf16.bits(np.maximum((groups.max(axis=2) - least) / 15, 1e-30), up=True)
    scale = bf16.value(scale_bits)
    zero_bits = bf16.bits(least + 8 * scale)
    steps = np.rint((groups - bf16.value(zero_bits)[..., None]) / scale[..., None]) + 8
    q = np.clip(steps, 0, 15).astype(np.uint8).reshape(n, dim)
    # torch's layout (int4_ready checks it): in each block of 64 rows, byte (k, r) holds
    # component k of row r in its low 4 bits and of row r + 32 in its high 4 bits, r < 32.
    halves = q.reshape(n // INT4_BLOCK, 2, INT4_BLOCK // 2, dim)
    packed = (halves[:, 0] | (halves[:, 1] << 4)).transpose(0, 2, 1).reshape(n, dim // 2)
    return packed, np.stack([scale_bits, zero_bits], axis=-1).view(np.int16)


def dequantize4(view: Int4View) -> np.ndarray:
    """The rows an `Int4View` stands for, in float32 (`int4_ready`'s check, the tests)."""
    n, half = view.packed.shape
    blocks = view.packed.reshape(n // INT4_BLOCK, half * 2, INT4_BLOCK // 2).transpose(0, 2, 1)
    q = np.concatenate([blocks & 15, blocks >> 4], axis=1).reshape(n, half * 2).astype(np.float32)
    scale = bf16.value(view.scale_zero[..., 0]).T  # (rows, groups)
    zero = bf16.value(view.scale_zero[..., 1]).T
    groups = q.reshape(n, -1, INT4_GROUP)
    return ((groups - 8) * scale[..., None] + zero[..., None]).reshape(n, -1)[: view.n]


@functools.lru_cache(maxsize=None)
def int4_ready(dim: int) -> bool:
    """Whether this torch's int4 kernel reads `Int4Rows` copies of `dim` components as they are
    meant: the kernel exists, and its products with a packed random matrix are those of the
    matrix `dequantize4` reads back (the packed layout is torch's on a CPU with AVX-512, not a
    public format: a torch that packs otherwise fails here, and the live index makes an int8
    copy instead, `LiveIndex.settle_first_pass`). Asked by the index's build and by a query."""
    torch = torch_or_none()
    if torch is None or dim % INT4_GROUP or not hasattr(torch, "_weight_int4pack_mm_for_cpu"):
        return False
    rng = np.random.default_rng(4)
    rows = rng.standard_normal((2 * INT4_BLOCK - 5, dim)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    vector = rows[7] + 0.5 * rows[70]
    try:
        view = Int4Rows(dim).sync(rows, len(rows))
        got = int4_dot(view, vector)
    except (RuntimeError, NotImplementedError):  # pragma: no cover - a torch built without it
        return False
    meant = dequantize4(view) @ vector
    return got.shape == meant.shape and bool(np.allclose(got, meant, rtol=0, atol=2e-2)) and \
        bool(np.abs(got - rows @ vector).max() < 0.1)


def int4_dot(view: Int4View, vector: np.ndarray) -> np.ndarray:
    """Approximate `rows @ vector` from an `Int4Rows` copy, as float32. The query is one
    bfloat16 row: this kernel computes rather than waits for memory, and a second row would
    cost as much again for an error well under the copy's own."""
    torch = torch_or_none()
    assert torch is not None  # int4_ready said so
    with torch.inference_mode():
        query = torch.from_numpy(np.asarray(vector, dtype=np.float32)[None]).to(torch.bfloat16)
        out = torch._weight_int4pack_mm_for_cpu(query, torch.from_numpy(view.packed), INT4_GROUP,
                                                torch.from_numpy(view.scale_zero).view(torch.bfloat16))
    return out[0, : view.n].float().numpy()


def coarse_copies(kind: str | None, dim: int) -> "tuple[Int4Rows, Int4Rows] | tuple[Int8Rows, Int8Rows] | None":
    """The item and passage copies of a first pass of `kind` ("int4", "int8"; None: none), or
    None where vectors of `dim` components do not fit the kernel."""
    if kind == "int4" and dim % INT4_GROUP == 0:
        return Int4Rows(dim), Int4Rows(dim)
    if kind == "int8" and dim % INT8_DIM_STEP == 0:
        return Int8Rows(dim), Int8Rows(dim)
    return None


def coarse_dot(copy: "tuple[np.ndarray, np.ndarray] | Int4View", vector: np.ndarray,
               compiled: bool = False, placed: str = "off") -> np.ndarray:
    """The first pass's scores from a copy `Int8Rows` or `Int4Rows` made (`compiled`, `placed`:
    see `coarse_dots`)."""
    return coarse_dots([copy], vector, compiled, placed)[0]


def coarse_dots(copies: "list[tuple[np.ndarray, np.ndarray] | Int4View]", vector: np.ndarray,
                compiled: bool = False, placed: str = "off") -> list[np.ndarray]:
    """`coarse_dot` of each copy (the items' and the passages'). `compiled` (the setting
    `search_compiled_first_pass`): int8 copies are read by kernels.int8_rows where numba
    compiles it, the rows of all of them in two halves on two threads from SPLIT_ROWS on, the
    second placed as `placed` (the setting `cpu_placement`) says. On a CPU without AVX-512,
    where the int8 copy is the first pass, torch's int8 kernel took twice the compiled loop's
    time over the same rows (bench/README.md, `scan_cost.py`). Otherwise torch's kernels."""
    if compiled and copies and not any(isinstance(copy, Int4View) for copy in copies):
        query = np.ascontiguousarray(vector, dtype=np.float32)
        done = _int8_compiled(copies, query, placed)  # type: ignore[arg-type]
        if done is not None:
            return done
    return [int4_dot(copy, vector) if isinstance(copy, Int4View) else int8_dot(*copy, vector)
            for copy in copies]


Span = tuple[np.ndarray, np.ndarray, int, int, np.ndarray]  # rows, scale bits, lo, hi, out


def _int8_compiled(copies: list[tuple[np.ndarray, np.ndarray]], query: np.ndarray,
                   placed: str) -> list[np.ndarray] | None:
    """Each int8 copy's scores by the compiled loop, or None without it. The rows of all the
    copies, taken in order, are cut in two at their middle: the second half on `_SCAN`."""
    outs = [np.empty(len(rows), dtype=np.float32) for rows, _ in copies]
    spans: list[Span] = [(rows, bits, 0, len(rows), out) for (rows, bits), out in zip(copies, outs)]
    total = sum(len(rows) for rows, _ in copies)
    if total < SPLIT_ROWS:
        return outs if _int8_spans(spans, query) else None
    mine, theirs = _cut(spans, total // 2)
    done = in_halves(lambda: _int8_spans(mine, query), lambda: _int8_spans(theirs, query), placed)
    return outs if all(done) else None


def _cut(spans: list[Span], at: int) -> tuple[list[Span], list[Span]]:
    """The spans' first `at` rows, and the rest."""
    first: list[Span] = []
    rest: list[Span] = []
    for rows, bits, lo, hi, out in spans:
        take = min(max(at, 0), hi - lo)
        if take:
            first.append((rows, bits, lo, lo + take, out))
        if lo + take < hi:
            rest.append((rows, bits, lo + take, hi, out))
        at -= take
    return first, rest


def _int8_spans(spans: list[Span], query: np.ndarray) -> bool:
    return all(kernels.int8_rows(rows, bits, query, lo, hi, out) for rows, bits, lo, hi, out in spans)


def coarse_ready(copy: "tuple[np.ndarray, np.ndarray] | Int4View", dim: int) -> bool:
    """Whether this torch has the kernel for `copy` (`int4_ready` / `int8_ready`)."""
    return int4_ready(dim) if isinstance(copy, Int4View) else int8_ready(dim)
