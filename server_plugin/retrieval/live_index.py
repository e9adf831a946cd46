"""The search index in memory: one store's rows, kept current with every committed write.

Each store keeps its rows in memory (`LiveIndex`, docs/search.md section 3): vectors, term
postings, neighbour links and per-row fields, built from SQLite in a background thread at start-up
and kept current by reading what changed since the revision it holds (docs.py stamps every write
with a revision). The catch-up runs after every commit (a listener on the database wakes the
thread) and again before every query, so a query always sees every committed write — the
process's own or another's. Edits and deletes leave dead rows behind (masked out at once); once
they pass `search_rebuild_share` of the rows, a fresh index is built in the background and swapped
in. The same thread re-embeds rows whose vectors hold character names (a rename, a new alias, or a
row written before its characters existed).
"""

from __future__ import annotations

import bisect
import json
import logging
import sys
import threading
import time
import weakref
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .. import priority
from ..errors import ServiceUnavailable
from ..services import Services
from ..store.db import Database
from . import docs as index
from . import live_bulk, vec_chunks
from .columns import Codes, DayCodes, Masks, Postings, RowTerms, day_of
from . import ranking as R
from .ranking import kernels, vectors as V
from . import visibility

log = logging.getLogger(__name__)

DIM = 384  # until the store's model says otherwise (docs.model)
REEMBED_BATCH = 8  # texts per background embedding call (a query waits at most for one batch)


# --- the in-memory index -----------------------------------------------------------------------
_COLUMNS = ("id, kind, chat_id, character_id, known_by, session_key, position, created_at,"
            " content_len, cues, terms, passages, cast_version")


# Per-row arrays and their fill values (vectors and neighbour links are kept apart).
_FIELDS = {"doc_id": (np.int64, -1), "alive": (bool, False), "kind": (np.int32, -1),
           "chat": (np.int32, -1), "owner": (np.int64, -1), "known": (np.int32, -1),
           "gid": (np.int64, -1), "pos": (np.float64, np.nan), "day": (np.int32, -1),
           "content_len": (np.float64, 0.0), "cues": (np.float64, 0.0),
           "doc_len": (np.float64, 0.0), "win1": (np.float64, 1.0), "win2": (np.float64, 1.0)}


class LiveIndex:
    """One store's searchable rows in memory, aligned by row (see the module docstring).

    Rows are only ever appended; an edited item's old row dies (`alive` False) and its new version
    is appended. Messages of one session are linked to their ±1/±2 neighbours (`nbr`, columns
    previous-1, next-1, previous-2, next-2, as `ranking.neighbour_index`).
    """

    def __init__(self, window_weights: Sequence[float], capacity: int = 1024, dim: int = DIM,
                 half: bool = False, coarse: str | None = None) -> None:
        self.window_weights, self.dim = tuple(window_weights), dim
        # float16 vectors (`search_half_vectors`): half the memory; ranking.dot multiplies them.
        self.vtype = np.float16 if half else np.float32
        # int4 / int8 copies of item and passage vectors: ranking's first pass (search_first_pass)
        self.coarse = V.coarse_copies(coarse, dim)
        self.n = self.dead = self.rev = self.cast_version = 0
        self.stale_cast = False  # some row's vector may hold names of the current cast
        self.cap = capacity
        self.a = {name: np.full(capacity, fill, dtype=dtype) for name, (dtype, fill) in _FIELDS.items()}
        self.vectors = np.zeros((capacity, dim), dtype=self.vtype)
        # Column-major: a query gathers each neighbour column of every row (windows, BM25's
        # neighbour context), twice as fast from a contiguous column as from a strided one.
        self.nbr = np.full((capacity, 4), -1, dtype=np.int64, order="F")
        self.pvec = np.zeros((max(16, capacity // 2), dim), dtype=self.vtype)
        self.powner = np.zeros(len(self.pvec), dtype=np.int64)
        self.pn = 0
        self.postings = Postings()
        # BM25's neighbour-spread postings per term (ranking.TermIndex.spread_cache); a term is
        # dropped when a row holding it is added or gets new neighbours, so it is never stale.
        self.spread_cache: dict[str, Any] = R.SpreadCache()
        # What ranking keeps per candidate mask (ranking.remembered): emptied when any row changes.
        self.memo: dict[Any, Any] = {}
        self.row_terms = RowTerms()  # each row's terms (what a changed row drops from spread_cache)
        self.row_of: dict[int, int] = {}
        self.groups: dict[int, list[tuple[float, int, int]]] = {}  # gid -> sorted (pos, doc id, row)
        self.kinds, self.chats, self.owners = Codes(), Codes(), Codes()
        self.known_sets, self.sessions = Codes(), Codes()
        self.days = DayCodes()  # a row's day (column "day") is its code among the distinct days
        self.masks = Masks()  # candidate masks of recent searches (`candidates`)

    # -- growing ---------------------------------------------------------------------------------
    def _reserve(self, rows: int, passages: int) -> None:
        if self.n + rows > self.cap:
            cap = max(self.cap * 2, self.n + rows)
            for name, (dtype, fill) in _FIELDS.items():
                grown = np.full(cap, fill, dtype=dtype)
                grown[: self.n] = self.a[name][: self.n]
                self.a[name] = grown
            self.vectors = np.concatenate([self.vectors[: self.n], np.zeros((cap - self.n, self.dim), self.vtype)])
            nbr = np.full((cap, 4), -1, dtype=np.int64, order="F")
            nbr[: self.n] = self.nbr[: self.n]
            self.nbr = nbr
            self.cap = cap
        if self.pn + passages > len(self.pvec):
            cap = max(len(self.pvec) * 2, self.pn + passages)
            self.pvec = np.concatenate([self.pvec[: self.pn], np.zeros((cap - self.pn, self.dim), self.vtype)])
            self.powner = np.concatenate([self.powner[: self.pn], np.zeros(cap - self.pn, np.int64)])

    # -- rows ------------------------------------------------------------------------------------
    def append(self, row: Any, vector: np.ndarray, passages: Sequence[np.ndarray], link: bool = True) -> int:
        """Add one docs row (with its vector and passage vectors); returns its row number."""
        self._reserve(1, len(passages))
        i, a = self.n, self.a
        self.n += 1
        a["doc_id"][i] = row["id"]
        a["alive"][i] = True
        a["kind"][i] = self.kinds(row["kind"])
        a["chat"][i] = self.chats(row["chat_id"])
        a["owner"][i] = self.owners(row["character_id"])
        a["known"][i] = self.known_sets(live_bulk.known_set(row["known_by"]))
        a["gid"][i] = self.sessions(row["session_key"])
        a["pos"][i] = np.nan if row["position"] is None else float(row["position"])
        a["day"][i] = self.days(day_of(row["created_at"]))
        a["content_len"][i] = float(row["content_len"])
        a["cues"][i] = float(row["cues"])
        terms = json.loads(row["terms"])
        a["doc_len"][i] = float(sum(terms.values()))
        self.postings.add(i, terms)
        self.row_terms.append(tuple(map(sys.intern, terms)))  # one copy of each word
        self._forget_spread(i)
        self.vectors[i] = vector
        for p in passages:
            self.pvec[self.pn] = p
            self.powner[self.pn] = i
            self.pn += 1
        self.row_of[int(row["id"])] = i
        if row["cast_version"] != self.cast_version:
            self.stale_cast = True
        gid = int(a["gid"][i])
        if gid >= 0:
            members = self.groups.setdefault(gid, [])
            key = (a["pos"][i] if np.isfinite(a["pos"][i]) else float("inf"), int(row["id"]), i)
            at = bisect.bisect(members, key)
            members.insert(at, key)
            if link:
                self._relink(members, at - 2, at + 3)
        return i

    def kill(self, doc_id: int) -> None:
        """The row of a deleted (or replaced) doc dies: masked out, unlinked from its neighbours."""
        i = self.row_of.pop(int(doc_id), None)
        if i is None:
            return
        self.a["alive"][i] = False
        self.masks.kill(i)
        self.dead += 1
        gid = int(self.a["gid"][i])
        members = self.groups.get(gid)
        if members:
            at = next(j for j, m in enumerate(members) if m[2] == i)
            members.pop(at)
            self._relink(members, at - 2, at + 2)
        self.nbr[i] = -1
        self._forget_spread(i)

    def _forget_spread(self, row: int) -> None:
        self.memo.clear()  # every row's change reaches here (append, kill, relink)
        for term in self.row_terms[row]:
            self.spread_cache.pop(term, None)

    def _relink(self, members: list[tuple[float, int, int]], lo: int, hi: int) -> None:
        """Neighbour links and window norms of members[lo:hi] (after an insert or removal)."""
        count = len(members)
        for j in range(max(lo, 0), min(hi, count)):
            row = members[j][2]
            self.nbr[row] = [members[j - 1][2] if j >= 1 else -1, members[j + 1][2] if j + 1 < count else -1,
                             members[j - 2][2] if j >= 2 else -1, members[j + 2][2] if j + 2 < count else -1]
            self._norms(np.array([row]))
            self._forget_spread(row)

    def _norms(self, rows: np.ndarray) -> None:
        w1, w2 = (list(self.window_weights) + [0.0, 0.0])[:2]
        for lo in range(0, len(rows), 2048):  # in blocks: a campaign's rows at once would be GBs
            part = rows[lo:lo + 2048]
            nbr = self.nbr[part]
            total, near = self.vectors[part].astype(np.float32), np.empty((len(part), self.dim), np.float32)
            for col, w in ((0, w1), (1, w1), (2, w2), (3, w2)):
                # each row's neighbour (row -1: none, weighed 0), in place: a third faster, same sums
                near[...] = self.vectors[nbr[:, col]]
                near *= np.where(nbr[:, col] >= 0, np.float32(w), np.float32(0))[:, None]
                total += near
                if col == 1:
                    self.a["win1"][part] = np.maximum(np.linalg.norm(total, axis=1), 1e-12)
            self.a["win2"][part] = np.maximum(np.linalg.norm(total, axis=1), 1e-12)

    def link_all(self) -> None:
        """Neighbour links and window norms of every row at once (after a bulk load)."""
        n = self.n
        pos = np.where(np.isfinite(self.a["pos"][:n]), self.a["pos"][:n], np.inf)
        gid = np.where(self.a["alive"][:n], self.a["gid"][:n], -1)
        self.nbr[:n] = R.neighbour_index(gid, pos, radius=2)
        self.spread_cache.clear()
        self.memo.clear()
        if n:
            self._norms(np.arange(n))

    def set_window_weights(self, weights: Sequence[float]) -> None:
        if tuple(weights) != self.window_weights:
            self.window_weights = tuple(weights)
            if self.n:
                self._norms(np.arange(self.n))

    # -- reading ---------------------------------------------------------------------------------
    def settle_first_pass(self) -> None:
        """An int4 copy this torch does not read as packed (`int4_ready`: the layout differs by CPU)
        becomes an int8 copy, made by the next `corpus`. Asked by `build` and by every query."""
        if self.coarse and isinstance(self.coarse[0], V.Int4Rows) and not V.int4_ready(self.dim):
            self.coarse = V.coarse_copies("int8", self.dim)

    def corpus(self) -> R.Corpus:
        """A ranking view of the rows (no copies)."""
        n, a = self.n, self.a
        return R.Corpus(
            ids=a["doc_id"][:n], terms=R.TermIndex(self.postings, a["doc_len"][:n], n,  # type: ignore[arg-type]
                                                   self.spread_cache),
            vectors=self.vectors[:n], gids=a["gid"][:n], speakers=(), neighbours=self.nbr[:n],
            win1_norm=a["win1"][:n], win2_norm=a["win2"][:n],
            sent_vectors=self.pvec[: self.pn] if self.pn else None,
            sent_owner=self.powner[: self.pn] if self.pn else None,
            temporal=a["cues"][:n], content_len=a["content_len"][:n],
            day_codes=a["day"][:n], day_table=np.array(self.days.values, dtype=np.float64),
            speaker_codes=a["owner"][:n], speaker_table=self.owners.code, memo=self.memo,
            coarse=self.coarse[0].sync(self.vectors, n) if self.coarse else None,
            coarse_sent=self.coarse[1].sync(self.pvec, self.pn) if self.coarse and self.pn else None)

    def candidates(self, viewer_id: str | None, scopes: Iterable[str], chat_ids: Sequence[str] | None,
                   kinds: Sequence[str] | None) -> np.ndarray:
        """Live rows of the kinds and chats asked for (and of no chat) that the viewer may know
        (visibility.py). Kept between searches (`columns.Masks`): only rows appended since are
        decided."""
        scopes = frozenset(scopes)
        key = (viewer_id, scopes, None if chat_ids is None else tuple(chat_ids),
               None if kinds is None else tuple(kinds))
        return self.masks.get(key, self.n, lambda lo, hi: self._candidates(lo, hi, viewer_id, scopes,
                                                                            chat_ids, kinds))

    def _candidates(self, lo: int, hi: int, viewer_id: str | None, scopes: frozenset[str],
                    chat_ids: Sequence[str] | None, kinds: Sequence[str] | None) -> np.ndarray:
        """`candidates` of rows lo…hi-1."""
        a = {name: self.a[name][lo:hi] for name in ("alive", "kind", "chat", "known", "owner")}
        mask = a["alive"].copy()
        if kinds is not None:
            codes = [self.kinds.code[k] for k in kinds if k in self.kinds.code]
            mask &= np.isin(a["kind"], codes)
        if chat_ids is not None:
            codes = [self.chats.code.get(c, -2) for c in chat_ids]
            mask &= np.isin(a["chat"], codes) | (a["chat"] == -1)
        if viewer_id is not None:
            scoped_codes = [self.kinds.code[k] for k in visibility.SCOPED_KINDS if k in self.kinds.code]
            mask &= visibility.row_mask(
                viewer_id, known_sets=self.known_sets.values, known_codes=a["known"],
                scoped=np.isin(a["kind"], scoped_codes), owners=self.owners.values,
                owner_codes=a["owner"], scopes=scopes)
        return mask


# --- loading from the store --------------------------------------------------------------------
def _passage_ids(rows: Sequence[Any]) -> list[int]:
    return [int(r["id"]) * index.MAX_PASSAGES + j for r in rows for j in range(r["passages"])]


def _add_rows(live: LiveIndex, rows: Sequence[Any], vecs: dict[int, np.ndarray],
              pvecs: dict[int, np.ndarray], link: bool) -> None:
    for r in rows:
        doc_id = int(r["id"])
        vector = vecs.get(doc_id)
        if vector is None:  # cannot happen (same transaction); never rank a row without one
            log.error("search: doc %s has no vector; skipped", doc_id)
            continue
        passages = [pvecs[p] for p in (doc_id * index.MAX_PASSAGES + j for j in range(r["passages"]))
                    if p in pvecs]
        live.append(r, vector, passages, link=link)


def build(db: Database, window_weights: Sequence[float], half: bool = False, coarse: str | None = None,
          torch_imported: Callable[[], bool] | None = None) -> LiveIndex:
    """A fresh LiveIndex of every docs row, from one consistent snapshot (`half`: float16 vectors;
    `coarse`: int4 or int8 copies for ranking's first pass, made here in one batch, of the kind
    this CPU reads once `torch_imported`: an import here beside the embedder's aborted at exit)."""
    with db.read() as conn:
        live = LiveIndex(window_weights, dim=index.model(conn)[1], half=half, coarse=coarse)
        live.rev = index.revision(conn)
        live.cast_version = index.cast_version(conn)
        count, batches = index.rows_in_batches(conn, _COLUMNS, live_bulk.BATCH)
        live._reserve(count, 0)
        live_bulk.load(live, batches, vec_chunks.row_ids(conn, "docs_vec"),
                       lambda: index.item_vectors(conn, None), lambda: index.passage_vectors(conn, None),
                       day_of)
    live.link_all()
    # The copies this CPU's kernel reads, made now (an int4 copy replaced at the first query cost
    # 100,000 messages ~1 s of the build and ~1.3 s of that query; the model loads first, ~3 s).
    if torch_imported is not None and torch_imported():
        live.settle_first_pass()
    live.corpus()  # the first pass's copies, if any, now rather than in the first query
    return live


def catch_up(live: LiveIndex, db: Database, limit: int | None = None) -> bool:
    """Apply every write committed since `live.rev`. False (nothing applied) when the gap is too
    large to patch — more than `limit` changed rows, deletions no longer recorded, vectors of
    another size: rebuild."""
    with db.read() as conn:
        rev = index.revision(conn)
        version = index.cast_version(conn)
        if rev == live.rev and version == live.cast_version:
            return True
        if live.rev < index.gone_floor(conn) or index.model(conn)[1] != live.dim:  # (vectors resized)
            return False
        gone = index.gone_since(conn, live.rev)
        rows = index.rows_since(conn, _COLUMNS, live.rev)
        if limit is not None and len(rows) + len(gone) > limit:
            return False
        vecs = index.item_vectors(conn, [int(r["id"]) for r in rows])
        pvecs = index.passage_vectors(conn, _passage_ids(rows))
    if version != live.cast_version:
        live.cast_version, live.stale_cast = version, True
    for doc_id in gone:
        live.kill(doc_id)
    for r in rows:
        live.kill(int(r["id"]))
    _add_rows(live, rows, vecs, pvecs, link=True)
    live.rev = rev
    return True


# --- one store's search state ------------------------------------------------------------------
class SearchState:
    """The LiveIndex of one store, its lock, and the background thread that keeps it current."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc
        self.lock = priority.Lock()
        self._load_lock = priority.Lock()
        self.live: LiveIndex | None = None
        self.ready = threading.Event()
        self.wake = threading.Event()
        self.error: str | None = None
        self.build_seconds: float | None = None
        self.thread: threading.Thread | None = None
        self.stopping = False
        self.analysed = False  # set once no row waits for today's analyzer (reanalyse)

    # -- keeping current -------------------------------------------------------------------------
    def _weights(self) -> tuple[float, float]:
        s = self.svc.settings
        return (s.search_window_w1, s.search_window_w2)

    def fresh(self) -> LiveIndex:
        """A new index of the store as the settings ask for it (not installed)."""
        s = self.svc.settings
        loaded = lambda: bool(getattr(self.svc.embedder, "ready", False))  # noqa: E731 - torch imported
        return build(self.svc.db, self._weights(), s.search_half_vectors,
                     s.search_first_pass if s.search_refine_rows > 0 else None, loaded)

    def load(self) -> None:
        """Build the index (at start-up, or on the first query without a background thread)."""
        started = time.perf_counter()
        try:
            fresh = self.fresh()
            with self.lock:
                self.live = fresh
                catch_up(fresh, self.svc.db)
        except Exception as exc:  # reported by health and by every search
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("search: building the index failed")
        finally:
            self.build_seconds = time.perf_counter() - started
            self.ready.set()

    def ensure_loaded(self, timeout: float) -> None:
        """Wait for the background build, or build here when no thread was started."""
        if self.thread is None:
            with self._load_lock:
                if not self.ready.is_set():
                    self.load()
        if not self.ready.wait(timeout):
            raise ServiceUnavailable("search_not_ready", "the search index is still loading; try again shortly")

    def current(self) -> LiveIndex:
        """The index, caught up with every committed write (call with `self.lock` held)."""
        live = self.live
        if live is None:
            raise ServiceUnavailable("search_not_ready", self.error or "the search index is still loading")
        live.set_window_weights(self._weights())
        limit = max(2000, live.n // 4)
        if not catch_up(live, self.svc.db, limit):
            self.live = live = self.fresh()
            catch_up(live, self.svc.db)
        return live

    def maintain(self) -> None:
        """Background work after a commit: catch up, rebuild when many rows died, re-embed stale names."""
        if self.live is None:
            return
        with self.lock:
            live = self.current()
            rebuild = live.n and live.dead / live.n > self.svc.settings.search_rebuild_share
        if rebuild:
            fresh = self.fresh()
            with self.lock:
                catch_up(fresh, self.svc.db)
                self.live = fresh
            self._prune_gone(fresh.rev)
        if self.live is not None and self.live.stale_cast:
            self.reembed()
        if not self.analysed:
            self.reanalyse()

    def reanalyse(self) -> int:
        """BM25 terms of rows an older analyzer made, made again batch by batch (docs.reanalyse);
        search answers from the old terms meanwhile. Returns how many."""
        done, s = 0, self.svc.settings
        while not self.stopping:
            priority.step_aside(s.background_step_aside_seconds)
            n = index.reanalyse(self.svc.db, s.search_reanalyse_batch)
            done, self.analysed = done + n, not n
            if not n:
                break
        return done

    def _prune_gone(self, rev: int) -> None:
        """Deletions this index has applied need not be kept (another process behind this
        revision rebuilds instead)."""
        with self.svc.db.write() as conn:
            index.prune_gone(conn, rev)

    def reembed(self) -> int:
        """Vectors embedded with names of an older cast (or none): replace those whose text, with
        the current names taken out, differs from what was embedded. Returns how many."""
        db, done = self.svc.db, 0
        while not self.stopping:
            version, cast = index.store_cast(db)
            rows = index.stale_cast(db.reader(), version, REEMBED_BATCH * 8)
            if not rows:
                break
            same = [r["id"] for r in rows
                    if r["dense_hash"] == index.dense_hash(R.dense_text(r["text"], cast))]
            changed = [r for r in rows if r["id"] not in set(same)]
            with db.write() as conn:
                index.mark_cast(conn, same, version)
            for start in range(0, len(changed), REEMBED_BATCH):
                if self.stopping:
                    return done
                batch = changed[start:start + REEMBED_BATCH]
                prepared = index.prepare(self.svc, [r["text"] for r in batch])
                with db.write() as conn:
                    for r, p in zip(batch, prepared):
                        if p.cast_version != version or not index.replace_vectors(conn, r["id"], r["rev"], p):
                            # changed meanwhile: its own write re-prepared it, or the cast moved on
                            index.mark_cast_at(conn, r["id"], r["rev"], p.cast_version)
                        done += 1
        with self.lock:
            if self.live is not None:
                self.live.stale_cast = False
        return done


def _loop(ref: "weakref.ref[SearchState]") -> None:
    with priority.background():  # re-embedding after a rename yields to requests
        _maintain_until_closed(ref)


def _maintain_until_closed(ref: "weakref.ref[SearchState]") -> None:
    state = ref()
    if state is None or state.stopping:
        return
    if state.svc.settings.search_compiled_first_pass:  # beside the build: the first search waited
        threading.Thread(target=kernels.compiled, name="search-loops", daemon=True).start()
    state.load()
    wake, state = state.wake, None
    while True:
        woke = wake.wait(timeout=2.0)
        state = ref()
        if state is None or state.stopping:  # the store is closing, or its services are gone
            return
        if woke:
            wake.clear()
            try:
                state.maintain()
            except Exception:  # never kill the thread; the next query catches up itself
                log.exception("search: background maintenance failed")
        state = None


def state_of(svc: Services) -> SearchState:
    """The store's search state (created on first use; without `start` it loads on first query)."""
    return svc.cached("search_state", None, lambda: SearchState(svc))


def start(svc: Services) -> SearchState:
    """Build the index in a background thread and keep it current after every commit."""
    state = state_of(svc)
    if state.thread is None:
        ref = weakref.ref(state)
        svc.db.on_commit(lambda: _wake(ref))
        svc.db.on_close(lambda: _stop(ref))
        state.thread = threading.Thread(target=_loop, args=(ref,), name="search-index", daemon=True)
        state.thread.start()
    return state


def _wake(ref: "weakref.ref[SearchState]") -> None:
    state = ref()
    if state is not None:
        state.wake.set()


def stop(svc: Services) -> None:
    """Stop the background thread (searches still catch up themselves); tests use it to run the
    background passes (`maintain`, `reembed`) by hand."""
    state = state_of(svc)
    _stop(weakref.ref(state))
    state.stopping = False  # the thread has left; passes called by hand run in full


def _stop(ref: "weakref.ref[SearchState]", timeout: float = 30.0) -> None:
    """The store is closing: let the thread finish what it is doing and leave."""
    state = ref()
    if state is not None and state.thread is not None:
        state.stopping = True
        state.wake.set()
        if state.thread is not threading.current_thread():
            state.thread.join(timeout)


def status(svc: Services) -> dict[str, Any]:
    """For /v1/health: whether the index is built, its size and how long the build took."""
    state = state_of(svc)
    live = state.live
    return {"ready": state.ready.is_set() and state.error is None, "error": state.error,
            "rows": 0 if live is None else live.n - live.dead,
            "build_seconds": state.build_seconds}
