"""Schema migration 11, `m011_embedders`: what it does is its function's docstring."""

from __future__ import annotations

from ..db import Connection
from .script import EMBEDDING_DIM, run_script


def m011_embedders(conn: Connection) -> None:
    """Vectors keyed by the model that made them. `docs_model` holds the key of the model every
    vector of docs_vec and docs_passages comes from and the size of those tables ('' before a
    store's first vector: the first model to write is adopted); a store written before this
    migration holds the packaged MiniLM's. `reembed_vectors` holds the vectors a newly chosen model
    makes in the background, per row and revision, until every row has one (then they replace
    the old model's in one transaction)."""
    run_script(conn, f"""
    CREATE TABLE docs_model (id INTEGER PRIMARY KEY CHECK (id = 1), model_key TEXT NOT NULL,
        dim INTEGER NOT NULL);
    INSERT INTO docs_model(id, model_key, dim) SELECT 1,
        CASE WHEN EXISTS (SELECT 1 FROM docs) THEN 'minilm:all-MiniLM-L6-v2' ELSE '' END, {EMBEDDING_DIM};
    CREATE TABLE reembed_vectors (
        id INTEGER PRIMARY KEY,          -- the docs row
        model_key TEXT NOT NULL,         -- the model that made these vectors
        rev INTEGER NOT NULL,            -- the row's revision they were made for
        dense_hash TEXT,
        vector BLOB NOT NULL,            -- float32
        passages BLOB NOT NULL           -- float32, one vector after the other (none: empty)
    );
    """)
