"""Every stored vector read at once from sqlite-vec's chunks (retrieval/vec_chunks.py, rule SW6):
the same rows and vectors as reading through the vec0 table, deletions included; and where the
chunks cannot be trusted, the vec0 read."""

from __future__ import annotations

import numpy as np

from server_plugin.retrieval import docs as index
from server_plugin.retrieval import vec_chunks
from tests.helpers.api import expect_ok


def through_vec0(conn, table: str) -> dict[int, np.ndarray]:
    return {int(r[0]): np.frombuffer(r[1], dtype=np.float32)
            for r in conn.execute(f"SELECT rowid, embedding FROM {table}")}


def remember(api, text: str) -> dict:
    return expect_ok(api.post("/v1/memories", json={"text": text, "scope": "global", "actor": "user"}), 201)["memory"]


def test_sw6_chunks_give_every_vector_as_vec0_does_deletions_included(api, services):
    made = [remember(api, f"Memory {i}: the caravan reached the {w} gate at dusk. " * (1 + i % 4))
            for i, w in enumerate(["north", "salt", "river", "old", "east", "glass", "iron", "moss"])]
    for gone in made[1::3]:
        expect_ok(api.delete(f"/v1/memories/{gone['id']}", query_string={"actor": "user"}))
    with services.db.read() as conn:
        for table in ("docs_vec", "docs_passages"):
            fast, slow = vec_chunks.read_all(conn, table, 384), through_vec0(conn, table)
            assert fast is not None and slow and set(fast) == set(slow)
            assert all(np.array_equal(fast[k], slow[k]) for k in slow)
        assert set(index.item_vectors(conn, None)) == set(through_vec0(conn, "docs_vec"))


def test_sw6_chunks_of_an_unknown_layout_or_disagreeing_are_not_used(api, services):
    remember(api, "The ferryman takes silver, never copper.")
    with services.db.write() as conn:
        conn.execute("UPDATE docs_vec_info SET value = 2 WHERE key = 'CREATE_VERSION_MINOR'")
    with services.db.read() as conn:
        assert vec_chunks.read_all(conn, "docs_vec", 384) is None
        assert set(index.item_vectors(conn, None)) == set(through_vec0(conn, "docs_vec"))  # read through vec0
    with services.db.write() as conn:
        conn.execute("UPDATE docs_vec_info SET value = 1 WHERE key = 'CREATE_VERSION_MINOR'")
    with services.db.read() as conn:
        assert vec_chunks.read_all(conn, "docs_vec", 384) is not None
        # Chunks read as another layout (here: vectors of another size) disagree with vec0's sample.
        assert vec_chunks.read_all(conn, "docs_vec", 192) is None


def test_sw6_chunks_that_fail_while_streamed_are_read_through_vec0(api, services):
    for w in ("north", "salt", "river"):
        remember(api, f"The caravan reached the {w} gate at dusk.")
    with services.db.read() as conn:
        ids = list(vec_chunks.read_all(conn, "docs_vec", 384))
        where = np.array(conn.execute("SELECT rowid, chunk_id, chunk_offset FROM docs_vec_rowids").fetchall(),
                         dtype=np.int64)
        where[:, 1] += 999  # chunks that are not there
        dest = np.zeros((len(ids), 384), dtype=np.float16)
        vec_chunks.ChunkVectors(conn, "docs_vec", 384, where).copy_into(ids, dest)
        slow = through_vec0(conn, "docs_vec")
    assert len(ids) == 3 and all(np.array_equal(dest[k], slow[i].astype(np.float16)) for k, i in enumerate(ids))
