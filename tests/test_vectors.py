"""The float16 product of the index's vectors in blocks of powers of two (rule SW6,
ranking/vectors.py): torch compiles and keeps a kernel for each new number of rows on some CPUs,
and the index gains rows every turn."""

from __future__ import annotations

import numpy as np
import pytest

from server_plugin.retrieval.ranking import vectors as V

torch = pytest.importorskip("torch")


def test_sw6_power_blocks_cover_every_row_once_in_powers_of_two():
    """rule SW6: the blocks of n rows lie end to end from row 0 to row n, each a power of two,
    largest first: one block per set bit of n."""
    assert V.power_blocks(0) == []
    assert V.power_blocks(1) == [(0, 1)]
    for n in (2, 3, 7, 4096, 4097, 109_301, 2**20 - 1):
        blocks = V.power_blocks(n)
        assert [lo for lo, _ in blocks] == list(np.cumsum([0] + [size for _, size in blocks])[:-1])
        assert sum(size for _, size in blocks) == n and len(blocks) == bin(n).count("1")
        assert all(size & (size - 1) == 0 for _, size in blocks)
        assert [size for _, size in blocks] == sorted((size for _, size in blocks), reverse=True)


def test_sw6_float16_products_of_any_number_of_rows_use_few_shapes_and_the_same_scores(monkeypatch):
    """rule SW6: scans of 1,000 different numbers of rows (as an index that grows each turn, and
    the few rows a second pass gathers, ask for) reach torch's product with at most 15 numbers
    of rows; each score is the one-piece product's (to the bit on the CPUs measured)."""
    rng = np.random.default_rng(3)
    rows = (rng.standard_normal((12_000, 384)) / 20).astype(np.float16)
    query = rng.standard_normal(384).astype(np.float32)
    column = torch.from_numpy(query.astype(np.float16)).unsqueeze(1)
    whole = torch.matmul(torch.from_numpy(rows), column).squeeze(1).numpy().astype(np.float32)
    shapes: set[int] = set()
    real = torch.matmul
    monkeypatch.setattr(V, "float16_mv", lambda: False)  # the product's way (an AVX-512 CPU's)

    def recording(a, b):
        shapes.add(int(a.shape[0]))
        return real(a, b)
    monkeypatch.setattr(torch, "matmul", recording)
    for n in list(range(1, 500)) + list(range(11_500, 12_000)):
        got = V._dot(rows[:n], query)
        assert got.dtype == np.float32 and np.allclose(got, whole[:n], rtol=0, atol=1e-3)
    assert len(shapes) <= 15 and all(s & (s - 1) == 0 for s in shapes), sorted(shapes)


def test_sw6_float16_rows_by_mv_where_the_cpu_has_no_avx512(monkeypatch):
    """rule SW6: on a CPU without AVX-512 float16 rows are multiplied by `torch.mv` (2.4x faster
    there than the one-column product), one call for any number of rows, each score within a
    float16 step of the exact product; with AVX-512, the product in power-of-two blocks."""
    rng = np.random.default_rng(4)
    rows = (rng.standard_normal((3_001, 384)) / 20).astype(np.float16)
    query = rng.standard_normal(384).astype(np.float32)
    exact = rows.astype(np.float64) @ query.astype(np.float16).astype(np.float64)
    calls: list[int] = []
    real = torch.mv
    monkeypatch.setattr(torch, "mv", lambda a, b: calls.append(int(a.shape[0])) or real(a, b))
    monkeypatch.setattr(V, "float16_mv", lambda: True)
    got = V._dot(rows, query)
    assert calls == [3_001] and got.dtype == np.float32 and np.abs(got - exact).max() < 2e-3
    monkeypatch.setattr(V, "float16_mv", lambda: False)
    assert np.abs(V._dot(rows, query) - exact).max() < 2e-3 and calls == [3_001]
    monkeypatch.undo()
    assert V.float16_mv() == (not str(torch.backends.cpu.get_cpu_capability()).startswith("AVX512"))
