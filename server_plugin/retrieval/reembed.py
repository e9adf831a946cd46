"""Moving a store to another embedder: every row embedded again in the background, then one switch.

When a store's setting `embedder` names another model than the one its vectors are of
(docs.model), a background thread embeds every row with the new model into `reembed_vectors`,
batch by batch (`reembed_batch` rows a write), as background work: requests go first
(priority.step_aside, and the embedder's request-first turns). Search keeps answering from the
old model's vectors meanwhile, and writes keep embedding with the old model; each staged vector
is of one row at one revision, so a row written or re-embedded meanwhile is simply embedded again.
When every row has one, one write transaction checks that, installs them (docs.install_vectors:
the old model's vectors deleted, the tables resized if the dimension differs) and, under the
search lock, the store's embedder and its in-memory index change together: no search ever ranks
one model's query against the other's vectors. The staged vectors survive a restart: a store
reopened mid-way goes on from where it was. Progress (done / total) is in GET /v1/health.

A store imported from a document without vectors (`"vectors": false`, docs/export.md) is a move
too: `without_vectors` gives its rows zero vectors of a placeholder "model" (embedders.Placeholder,
key "none:<dim>") inside the import's transaction, and the move to the settings' model embeds them
all; search answers from BM25 alone until the switch.

Owns: reembed_vectors.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

import numpy as np

from .. import priority
from ..services import Services
from ..store.db import Connection
from . import docs as index
from . import embedders, live_index
from .embeddings import Embedder, EmbedderNotReady

log = logging.getLogger(__name__)


class Move:
    """One store's move to another model: its thread, its progress, its last error."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.stopping = threading.Event()
        self.lock = priority.Lock()
        self.target: str | None = None
        self.source: str | None = None
        self.done = 0
        self.total = 0
        self.after = 0  # the doc id the next step reads from (rows in id order, then once again)
        self.error: str | None = None


def move_of(svc: Services) -> Move:
    return svc.cached("reembed_move", None, Move, size=1)


def store_embedder(svc: Services, given: Embedder | None = None) -> Embedder:
    """The embedder of the store's vectors (the settings' model when it holds none yet); `given`
    (a caller's model) is shared under its key first."""
    if given is not None:
        embedders.register(given)
    key = index.model(svc.db.reader())[0] or embedders.key_of(svc.settings)
    if given is not None and given.key == key:
        return given
    return embedders.for_key(key, svc.settings)


def without_vectors(conn: Connection) -> int:
    """Inside the import of a document without vectors (portable.import_store's `placeholders`):
    every index row gets a zero vector of the document's size and no passages, under the
    placeholder's key, so the index is whole and `ensure` then moves the store to the settings'
    model. Returns how many rows wait for their vector."""
    dim = index.model(conn)[1]
    zero = np.zeros(dim, dtype=np.float32)
    vectors = {int(r["id"]): (zero, []) for r in index.all_rows(conn, "id")}
    # Made anew: the tables are still the importing store's size, which may not be the document's.
    index.install_vectors(conn, embedders.placeholder_key(dim), dim, vectors, remake=True)
    conn.execute("DELETE FROM reembed_vectors")
    return len(vectors)


def follow_store(svc: Services) -> None:
    """After the store was replaced underneath (an import): its embedder is its vectors' model
    again, and a move to the settings' model begins if they differ."""
    svc.embedder = store_embedder(svc).start_loading()
    ensure(svc)


def ensure(svc: Services, *, start: bool = True) -> bool:
    """Begin moving the store to the model its settings name, when its vectors are another's
    (`start` False: only say so; the passes are then run by hand, as tests do). True when a
    move is under way."""
    wanted = embedders.key_of(svc.settings)
    held = index.model(svc.db.reader())[0]
    move = move_of(svc)
    if not held or held == wanted:  # nothing to move: the store's model is the one asked for
        if svc.embedder.key != wanted and not held:
            svc.embedder = embedders.for_key(wanted, svc.settings).start_loading()
        with move.lock:
            move.target = None
        if held == wanted:
            _forget_others(svc, wanted)
        return False
    with move.lock:
        move.target, move.source, move.error = wanted, held, None
        if start and (move.thread is None or not move.thread.is_alive()):
            move.stopping.clear()
            move.thread = threading.Thread(target=_loop, args=(weakref.ref(svc),), name="reembed", daemon=True)
            move.thread.start()
            svc.db.on_close(move.stopping.set)
    return True


def _loop(ref: "weakref.ref[Services]") -> None:
    with priority.background():
        while True:
            svc = ref()
            if svc is None:
                return
            move = move_of(svc)
            if move.stopping.is_set():
                return
            try:
                if run(svc):
                    return
            except EmbedderNotReady as exc:  # the endpoint is down, the package missing: try later
                move.error = str(exc)
            except Exception as exc:  # never kill the thread silently
                log.exception("re-embedding failed")
                move.error = f"{type(exc).__name__}: {exc}"
            retry = svc.settings.embedder_retry_seconds
            svc = None
            if move.stopping.wait(retry):
                return


def run(svc: Services, limit: int | None = None) -> bool:
    """Embed up to `limit` rows (None: every one left) with the wanted model, then switch if
    every row has its vector. True when the store is on the wanted model (or no move is asked)."""
    move = move_of(svc)
    if not ensure(svc, start=False):
        return True
    target = embedders.for_key(move.target or "", svc.settings)
    target.wait(svc.embed_wait())
    move.error = None
    left = limit
    while not move.stopping.is_set() and (left is None or left > 0) and move.target == target.key:
        n = step(svc, target, svc.settings.reembed_batch if left is None else min(left, svc.settings.reembed_batch))
        if n == 0:
            return switch(svc, target)
        left = None if left is None else left - n
    return False


def _pending(conn: Connection, key: str, after: int, batch: int) -> list[Any]:
    """Up to `batch` rows past doc id `after` without a vector of model `key` at their revision,
    by id. Read from the cursor, not from every row at each step: at 100,000 rows that read took
    ~150 ms of Python a step of 16 rows (~0.5 s of embedding)."""
    return conn.execute("SELECT d.id, d.rev, d.cast_version FROM docs d LEFT JOIN reembed_vectors r"
                        " ON r.id = d.id AND r.model_key = ? WHERE d.id > ? AND r.rev IS NOT d.rev"
                        " ORDER BY d.id LIMIT ?", (key, after, batch)).fetchall()


def _progress(conn: Connection, key: str) -> tuple[int, int]:
    """(how many rows there are, how many have a vector of model `key` at their revision)."""
    total = conn.execute("SELECT count(*) FROM docs").fetchone()[0]
    done = conn.execute("SELECT count(*) FROM reembed_vectors r JOIN docs d ON d.id = r.id"
                        " WHERE r.model_key = ? AND r.rev = d.rev", (key,)).fetchone()[0]
    return total, done


def step(svc: Services, target: Embedder, batch: int) -> int:
    """Embed one batch of rows with `target` into reembed_vectors; returns how many (0: none left)."""
    move = move_of(svc)
    _forget_others(svc, target.key)
    with svc.db.read() as conn:
        picked = _pending(conn, target.key, move.after, batch)
        if not picked and move.after:  # the end reached: rows written behind the cursor, from the start
            picked = _pending(conn, target.key, 0, batch)
        move.total, move.done = _progress(conn, target.key)
        texts = index.results(conn, [r["id"] for r in picked]) if picked else {}
    move.after = picked[-1]["id"] if picked else 0
    picked = [r for r in picked if r["id"] in texts]  # deleted meanwhile: nothing to embed
    if not picked:
        return 0
    priority.step_aside(svc.settings.background_step_aside_seconds)
    staged = []
    for keep in (False, True):  # rows embedded with names kept (cast_version -1) stay so
        rows = [r for r in picked if (r["cast_version"] == -1) == keep]
        if rows:
            prepared = index.prepare(svc, [texts[r["id"]]["text"] for r in rows], keep_names=keep, embedder=target)
            staged += [(r["id"], target.key, r["rev"], p.dense_hash, _blob(p.vector),
                        b"".join(_blob(v) for v in p.passages)) for r, p in zip(rows, prepared)]
    with svc.db.write() as conn:
        conn.executemany("INSERT OR REPLACE INTO reembed_vectors(id, model_key, rev, dense_hash, vector, passages)"
                         " VALUES (?,?,?,?,?,?)", staged)
    move.done += len(staged)
    return len(staged)


def _blob(vector: np.ndarray) -> bytes:
    return np.asarray(vector, dtype=np.float32).tobytes()


def switch(svc: Services, target: Embedder) -> bool:
    """If every row has its vector of `target`, put them in place of the old model's and move the
    store's embedder and search index over, at once (True); otherwise False (rows came meanwhile)."""
    state = live_index.state_of(svc)
    dim = int(target.dim or 0)
    with state.lock:
        with svc.db.write() as conn:
            if _pending(conn, target.key, 0, 1):
                return False
            rows = {int(r["id"]) for r in index.all_rows(conn, "id")}
            vectors = {}
            for doc_id, vector, passages in conn.execute(
                    "SELECT id, vector, passages FROM reembed_vectors WHERE model_key = ?", (target.key,)):
                if int(doc_id) not in rows:  # the row was deleted after its vector was made
                    continue
                flat = np.frombuffer(passages, dtype=np.float32)
                vectors[int(doc_id)] = (np.frombuffer(vector, dtype=np.float32), list(flat.reshape(-1, dim)))
            index.install_vectors(conn, target.key, dim, vectors)
            conn.execute("DELETE FROM reembed_vectors")
        svc.embedder = target
        if state.live is not None:  # the new model's vectors, before any query is embedded with it
            state.live = state.fresh()
    move = move_of(svc)
    with move.lock:
        move.target, move.error = None, None
    log.info("search: the store's vectors are now of %s (%d rows)", target.key, len(vectors))
    return True


def _forget_others(svc: Services, key: str) -> None:
    """Staged vectors of another model than `key` (a move given up for another) are dropped."""
    if svc.db.reader().execute("SELECT 1 FROM reembed_vectors WHERE model_key != ? LIMIT 1", (key,)).fetchone():
        with svc.db.write() as conn:
            conn.execute("DELETE FROM reembed_vectors WHERE model_key != ?", (key,))


def status(svc: Services) -> dict[str, Any] | None:
    """For /v1/health: the move under way (model, from, done, total, error), or None."""
    move = move_of(svc)
    with move.lock:
        if move.target is None:
            return None
        return {"model": move.target, "from": move.source, "done": move.done, "total": move.total,
                "error": move.error}


def stop(svc: Services, timeout: float = 30.0) -> None:
    """Stop the background thread (tests then run the passes by hand)."""
    move = move_of(svc)
    move.stopping.set()
    if move.thread is not None and move.thread is not threading.current_thread():
        move.thread.join(timeout)
    move.thread = None
    move.stopping.clear()
