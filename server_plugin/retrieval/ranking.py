"""The ranking core of search (rule SW6): pure functions over texts, term counts and vectors.

Nothing here touches the database, the clock or the embedding model. The store computes what
it keeps per item at write time with these functions (`analyze`, `dense_text`, `temporal_cues`),
keeps an in-memory `Corpus` per store, and asks `rank` for scores; `search.py` owns the caching
and the visibility mask, this module owns the arithmetic.

How a query is scored (each part measured on LoCoMo with bench/locomo_proto.py; the storage
design and the measurements at campaign scale are in docs/search.md):
- BM25 over Snowball-stemmed terms of "<date> <speaker>: <text>"; a message's term counts are its
  own plus its session neighbours' at decaying weights ("neighbour context"), added at query time
  through a neighbour table so that no stored row changes when a new message arrives.
- MiniLM cosine with the item's vector, with its ±1 / ±2 session windows (weighted means of the
  neighbours' vectors, scored from the items' cosines) and with its best passage. Everything is
  embedded with character names removed: MiniLM ranks by the names it sees, so a query naming
  Ayla would otherwise pull every message that says "Ayla". The query names its first character
  in the first person instead ("When did I go…"), as stored messages speak.
- Weighted z-score fusion of those channels over the viewer's candidates (it beat reciprocal rank
  fusion), plus additive priors in z units: speaker (the characters the query names), session
  (the best score of the item's session), temporal cues for "when" questions, dates the query
  names, content length, recency and importance.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import date as _date
from functools import lru_cache
from typing import Any, Hashable, Iterable, Mapping, Sequence

import numpy as np
import snowballstemmer

# ---------------------------------------------------------------------------------------------
# Text analysis (BM25 side)

# A small English stop list: function words only. Names, numbers and content words stay.
STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is it
    its itself just me more most my myself no nor not now of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself yourselves
    im ive id ill youre youve theyre thats dont didnt doesnt isnt wasnt cant wont also really
    oh yeah hey hi wow""".split()
)

_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")
_POSSESSIVE = re.compile(r"['’]s$")
_stemmer = snowballstemmer.stemmer("english")


@lru_cache(maxsize=200_000)
def stem(word: str) -> str:
    """Snowball English stem of one lower-case word (cached: the vocabulary is small)."""
    return _stemmer.stemWord(word)


def tokenize(text: str) -> list[str]:
    """Lower-case word tokens; a possessive 's is dropped and inner apostrophes removed."""
    words = []
    for match in _WORD.finditer(text.lower()):
        word = _POSSESSIVE.sub("", match.group())
        words.append(word.replace("'", "").replace("’", ""))
    return [w for w in words if w]


def analyze(text: str, *, bigrams: bool = False) -> Counter[str]:
    """Term counts of `text` for BM25: stems of non-stop words, plus adjacent-pair bigrams.

    Bigrams join two consecutive content stems with "_" (stop words are skipped first, so
    "support group" and "support the group" share the bigram "support_group").
    """
    stems = [stem(w) for w in tokenize(text) if w not in STOPWORDS]
    counts = Counter(stems)
    if bigrams:
        counts.update(f"{a}_{b}" for a, b in zip(stems, stems[1:]))
    return counts


# ---------------------------------------------------------------------------------------------
# Character names (dense side and speaker awareness)


@dataclass(frozen=True)
class Cast:
    """Character names and aliases of one store, mapped to character ids.

    Built from the characters table (name + aliases). Matching is whole-word and
    case-insensitive; a possessive "'s" is part of the match.
    """

    aliases: Mapping[str, str]  # alias as written -> character id
    _pattern: re.Pattern | None = field(default=None, compare=False, repr=False)

    @classmethod
    def build(cls, characters: Iterable[tuple[str, Iterable[str]]]) -> "Cast":
        """`characters`: (character id, names and aliases) pairs. Empty names are ignored."""
        table: dict[str, str] = {}
        for char_id, names in characters:
            for name in names:
                name = name.strip()
                if name:
                    table.setdefault(name.lower(), char_id)
        if not table:
            return cls({}, None)
        # Longest first, so "Mel Jones" wins over "Mel".
        alts = sorted(table, key=len, reverse=True)
        pattern = re.compile(
            r"(?<![\w])(" + "|".join(re.escape(a) for a in alts) + r")(['’]s)?(?![\w])",
            re.IGNORECASE,
        )
        return cls(table, pattern)

    def mentioned(self, text: str) -> list[str]:
        """Character ids named in `text`, in order of first mention, without repeats."""
        if self._pattern is None:
            return []
        seen: list[str] = []
        for m in self._pattern.finditer(text):
            cid = self.aliases[m.group(1).lower()]
            if cid not in seen:
                seen.append(cid)
        return seen

    def sub(self, text: str, repl, *, capitalised_only: bool = False) -> str:
        """Replace every name; `repl(match, character_id, possessive)` returns the new text.

        With `capitalised_only`, a name is replaced only where it starts with a capital letter:
        stored texts write names capitalised, and a character called "Will" or "Hope" must not
        take the words "will" and "hope" out of every message.
        """
        if self._pattern is None:
            return text

        def one(m: re.Match) -> str:
            if capitalised_only and not m.group(1)[:1].isupper():
                return m.group(0)
            return repl(m, self.aliases[m.group(1).lower()], bool(m.group(2)))

        return self._pattern.sub(one, text)


_SPACES = re.compile(r"\s+")
_ORPHAN_PUNCT = re.compile(r"\s+([,.!?;:])")
_LEADING_PUNCT = re.compile(r"^[\s,.;:!?]+")
_DOUBLE_PUNCT = re.compile(r"([,;:])\s*(?=[,.!?;:])")


def _tidy(text: str) -> str:
    text = _SPACES.sub(" ", text)
    text = _DOUBLE_PUNCT.sub("", text)
    text = _ORPHAN_PUNCT.sub(r"\1", text)
    return _LEADING_PUNCT.sub("", text).strip()


def dense_text(text: str, cast: Cast) -> str:
    """The text an item is embedded as: character names removed ("Ayla's" becomes "their").

    MiniLM's cosine is dominated by the names it sees; without them it ranks by what happened.
    BM25 keeps the names (it weighs them by rarity, which is what we want there).
    """
    return _tidy(cast.sub(text, lambda m, cid, poss: " their " if poss else " ", capitalised_only=True))


_PREPOSITIONS = frozenset(
    "to with for about from at of by on in like than and or as after before toward towards".split()
)


def rewrite_query(query: str, cast: Cast, mode: str = "first_person") -> str:
    """The query text for the dense side.

    - "strip": names removed, as in `dense_text`.
    - "first_person": the first character named becomes "I"/"me"/"my" (stored messages are in
      their speaker's first person: "When did Mel go camping?" -> "When did I go camping?");
      other names become "them"/"their" after a preposition or as a possessive, else vanish.
    """
    if mode == "strip":
        return dense_text(query, cast)
    named = cast.mentioned(query)
    if not named:
        return query
    first = named[0]

    def repl(m: re.Match, cid: str, poss: bool) -> str:
        before = query[: m.start()].split()
        after_prep = bool(before) and before[-1].lower().strip(",.;:!?\"'") in _PREPOSITIONS
        if cid != first:
            return " their " if poss else (" them " if after_prep else " ")
        if poss:
            return "my"
        return "me" if after_prep else "I"

    return _tidy(cast.sub(query, repl))


# ---------------------------------------------------------------------------------------------
# Temporal cues (a prior for "when" questions)

_TEMPORAL_QUERY = re.compile(
    r"^\s*(when|how long ago|since when|what (day|date|time|year|month|week)|which (day|year|month|week))\b"
    r"|\b(what|which) (day|date|year|month)\b|\bhow long\b",
    re.IGNORECASE,
)
_TEMPORAL_WORDS = frozenset(
    """yesterday today tonight tomorrow ago last next recently lately weekend week weeks month
    months year years morning evening afternoon night earlier later soon since before after
    monday tuesday wednesday thursday friday saturday sunday january february march april may june
    july august september october november december christmas birthday anniversary summer winter
    spring autumn fall""".split()
)


def is_temporal_query(query: str) -> bool:
    """True for questions that ask when something happened or how long ago."""
    return bool(_TEMPORAL_QUERY.search(query))


def temporal_cues(text: str) -> int:
    """How many time expressions `text` holds (computed at write time; a small integer)."""
    words = tokenize(text)
    n = sum(1 for w in words if w in _TEMPORAL_WORDS)
    n += sum(1 for w in words if w.isdigit() and len(w) == 4 and w[:2] in ("19", "20"))
    return n


# ---------------------------------------------------------------------------------------------
# Dates named in a query (a prior for items dated near them)

_MONTHS = {
    m: i
    for i, m in enumerate(
        "january february march april may june july august september october november december".split(),
        start=1,
    )
}
_MONTH_RE = "(" + "|".join(_MONTHS) + "|" + "|".join(m[:3] for m in _MONTHS) + r")\.?"
_DAY_MONTH_YEAR = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH_RE},?\s+(\d{{4}})\b", re.I)
_MONTH_DAY_YEAR = re.compile(rf"\b{_MONTH_RE}\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})\b", re.I)
_MONTH_YEAR = re.compile(rf"\b{_MONTH_RE},?\s+(\d{{4}})\b", re.I)
_YEAR = re.compile(r"\b(19\d\d|20\d\d)\b")
_ISO = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")


def _month(name: str) -> int:
    name = name.lower().rstrip(".")
    return _MONTHS.get(name) or next(i for m, i in _MONTHS.items() if m.startswith(name))


def _days(y: int, m: int, d: int) -> int | None:
    try:
        return _date(y, m, d).toordinal()
    except ValueError:
        return None


def query_dates(text: str) -> list[tuple[int, int]]:
    """Calendar spans a query names, as (first day, last day) ordinals.

    "March 16, 2022" and "16 March 2022" give that day, "October 2023" that month, a bare
    "2023" that year. Each span of text is read once, the most precise reading first.
    """
    spans: list[tuple[int, int]] = []
    taken: list[tuple[int, int]] = []

    def free(m: re.Match) -> bool:
        return all(m.end() <= a or m.start() >= b for a, b in taken)

    def add(m: re.Match, lo: int | None, hi: int | None) -> None:
        if lo is not None and hi is not None:
            spans.append((lo, hi))
            taken.append((m.start(), m.end()))

    for m in _ISO.finditer(text):
        d = _days(int(m.group(1)), int(m.group(2)), int(m.group(3)))
        add(m, d, d)
    for m in _DAY_MONTH_YEAR.finditer(text):
        if free(m):
            d = _days(int(m.group(3)), _month(m.group(2)), int(m.group(1)))
            add(m, d, d)
    for m in _MONTH_DAY_YEAR.finditer(text):
        if free(m):
            d = _days(int(m.group(3)), _month(m.group(1)), int(m.group(2)))
            add(m, d, d)
    for m in _MONTH_YEAR.finditer(text):
        if free(m):
            y, mo = int(m.group(2)), _month(m.group(1))
            last = _days(y + (mo == 12), mo % 12 + 1, 1)
            add(m, _days(y, mo, 1), None if last is None else last - 1)
    for m in _YEAR.finditer(text):
        if free(m):
            y = int(m.group(1))
            add(m, _days(y, 1, 1), _days(y, 12, 31))
    return spans


def date_prior(
    item_days: np.ndarray, spans: Sequence[tuple[int, int]], after: float = 14.0, tau: float = 7.0
) -> np.ndarray:
    """How well each item's date fits the spans a query names, in [0, 1] (NaN days give 0).

    People talk about an event in the days after it ("yesterday I went bowling"), so an item
    dated up to `after` days past a span counts as inside it; beyond, the fit decays with
    scale `tau` days. Wide spans (a year) are discounted by their width.
    """
    best = np.zeros(len(item_days), dtype=np.float64)
    known = np.isfinite(item_days)
    for lo, hi in spans:
        dist = np.maximum(lo - item_days, 0.0) + np.maximum(item_days - (hi + after), 0.0)
        fit = np.exp(-dist / tau) * min(1.0, 31.0 / (hi - lo + 1.0)) ** 0.5
        best = np.where(known, np.maximum(best, np.nan_to_num(fit)), best)
    return best


# ---------------------------------------------------------------------------------------------
# Conversation structure


_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=\S)")


def sentences(text: str, min_chars: int = 12) -> list[str]:
    """Split `text` into sentences; fragments shorter than `min_chars` join the previous one."""
    parts: list[str] = []
    for piece in _SENTENCE.split(text.strip()):
        if parts and len(piece) < min_chars:
            parts[-1] += " " + piece
        elif piece:
            parts.append(piece)
    return parts


def chunks(text: str, min_words: int = 0, max_words: int = 80, max_chunks: int = 16) -> list[str]:
    """Passages of `text` for the best-passage channel: sentences, merged until a passage has at
    least `min_words` words, split when one runs past `max_words`; at most `max_chunks` (the
    first ones). One passage means the item's own vector already covers it (no extra vector).
    """
    out: list[str] = []
    cur: list[str] = []
    for sent in sentences(text):
        words = sent.split()
        while len(words) > max_words:
            out.append(" ".join(words[:max_words]))
            words = words[max_words:]
        cur += words
        if len(cur) >= min_words:
            out.append(" ".join(cur))
            cur = []
    if cur:
        if out and len(cur) < min_words:
            out[-1] += " " + " ".join(cur)
        else:
            out.append(" ".join(cur))
    return out[:max_chunks]


def group_ids(groups: Sequence[Hashable | None]) -> np.ndarray:
    """Dense integer ids for groups (-1 for None), for vectorised session terms."""
    table: dict[Hashable, int] = {}
    return np.array(
        [-1 if g is None else table.setdefault(g, len(table)) for g in groups], dtype=np.int64
    )


def neighbour_index(gids: np.ndarray, positions: np.ndarray | None = None, radius: int = 2) -> np.ndarray:
    """Row indices of each row's session neighbours: shape (n, 2*radius), -1 where there is none.

    Columns go previous-1, next-1, previous-2, next-2, …; column c and c ^ 1 are opposite
    directions. Rows of a group are ordered by `positions` (default: row order), so rows of many
    chats may interleave in the table (the store appends messages as they arrive). Rows with
    gid -1 (memories, lore, summaries) have no neighbours.
    """
    n = len(gids)
    nbr = np.full((n, 2 * radius), -1, dtype=np.int64)
    if n == 0:
        return nbr
    pos = np.arange(n) if positions is None else np.asarray(positions)
    order = np.lexsort((pos, gids))
    for d in range(1, radius + 1):
        if d >= n:
            break
        a, b = order[:-d], order[d:]
        same = (gids[a] == gids[b]) & (gids[a] >= 0)
        nbr[b[same], 2 * (d - 1)] = a[same]
        nbr[a[same], 2 * (d - 1) + 1] = b[same]
    return nbr


def _columns(radius: int, weights: Sequence[float]) -> list[tuple[int, float]]:
    """(column of the neighbour table, weight) for distances 1..radius."""
    cols = []
    for d in range(1, radius + 1):
        w = weights[min(d, len(weights)) - 1] if weights else 0.0
        if w:
            cols += [(2 * (d - 1), w), (2 * (d - 1) + 1, w)]
    return cols


def neighbour_sum(
    values: np.ndarray, nbr: np.ndarray, weights: Sequence[float], radius: int | None = None
) -> np.ndarray:
    """values[i] + Σ_d weights[d-1] · (values[prev_d(i)] + values[next_d(i)]), rows or scalars."""
    out = values.astype(np.float32 if values.ndim > 1 else np.float64, copy=True)
    radius = len(weights) if radius is None else radius
    for col, w in _columns(min(radius, nbr.shape[1] // 2), weights):
        idx = nbr[:, col]
        has = idx >= 0
        out[has] += w * values[idx[has]]
    return out


def expand_neighbours(
    counts: Sequence[Mapping[str, float]], nbr: np.ndarray, weights: Sequence[float] = (0.9, 0.5)
) -> list[Counter]:
    """Each item's term counts plus its neighbours' at `weights` by distance (the reference for
    what `bm25(..., neighbours=...)` computes at query time without storing it)."""
    out: list[Counter] = []
    cols = _columns(min(len(weights), nbr.shape[1] // 2), weights)
    for i, own in enumerate(counts):
        merged: Counter = Counter(own)
        for col, w in cols:
            j = nbr[i, col]
            if j >= 0:
                for term, c in counts[j].items():
                    merged[term] += w * c
        out.append(merged)
    return out


def window_texts(texts: Sequence[str], nbr: np.ndarray, radius: int) -> list[str]:
    """For each item, its text joined with up to `radius` session neighbours on each side."""
    out = []
    for i, text in enumerate(texts):
        before, after = [], []
        for d in range(1, radius + 1):
            p, n = nbr[i, 2 * (d - 1)], nbr[i, 2 * (d - 1) + 1]
            if p >= 0:
                before.insert(0, texts[p])
            if n >= 0:
                after.append(texts[n])
        out.append(" ".join(before + [text] + after))
    return out


def window_vectors(
    vectors: np.ndarray, nbr: np.ndarray, radius: int, weights: Sequence[float] = (1.0, 0.6)
) -> np.ndarray:
    """Each row plus its session neighbours up to `radius` away (weighted), re-normalised.

    A message's "window": its vector mixed with its neighbours'. The weighted mean of stored
    vectors measured as well as embedding the joined window text on LoCoMo, and costs no
    embedding at write time and no re-embedding of earlier messages when a new one arrives.
    """
    out = neighbour_sum(vectors, nbr, weights, radius)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.where(norms > 0, norms, 1.0)


def window_norms(
    vectors: np.ndarray, nbr: np.ndarray, radius: int, weights: Sequence[float] = (1.0, 0.6)
) -> np.ndarray:
    """Norm of each row's un-normalised window (what `window_scores` divides by)."""
    norms = np.linalg.norm(neighbour_sum(vectors, nbr, weights, radius), axis=1)
    return np.where(norms > 0, norms, 1.0)


def window_scores(
    item_scores: np.ndarray,
    nbr: np.ndarray,
    radius: int,
    norms: np.ndarray,
    weights: Sequence[float] = (1.0, 0.6),
) -> np.ndarray:
    """Cosine of the query with each window vector, from the items' own cosines.

    Because q·(Σ w v) = Σ w (q·v), the window channel needs no window matrix: the items' scores,
    summed over neighbours and divided by the precomputed window norm, equal
    `window_vectors(...) @ q` exactly, in O(n) instead of a second n×384 product.
    """
    return neighbour_sum(item_scores, nbr, weights, radius) / norms


# ---------------------------------------------------------------------------------------------
# BM25 from term statistics


@dataclass
class TermIndex:
    """Postings of the items' own term counts: term -> (row indices, term frequencies).

    Only each item's own counts are stored; `bm25` adds the neighbours' counts at query time
    through the neighbour table, so that a new message changes no earlier row. Document
    frequencies come from the own counts (context does not dilute a term's rarity).
    """

    postings: dict[str, tuple[np.ndarray, np.ndarray]]
    doc_len: np.ndarray
    n_docs: int
    # term -> (neighbour columns, rows, counts with the neighbours' added): filled by `bm25`;
    # its owner drops a term when a row holding it gets new neighbours (search.LiveIndex).
    spread_cache: dict[str, tuple[Any, np.ndarray, np.ndarray]] | None = None

    @classmethod
    def build(cls, counts: Sequence[Mapping[str, float]]) -> "TermIndex":
        """Index `counts`, one mapping of term -> count per row."""
        lists: dict[str, tuple[list[int], list[float]]] = {}
        for i, c in enumerate(counts):
            for term, tf in c.items():
                ix, tfs = lists.setdefault(term, ([], []))
                ix.append(i)
                tfs.append(float(tf))
        postings = {
            t: (np.asarray(ix, dtype=np.int64), np.asarray(tf, dtype=np.float64))
            for t, (ix, tf) in lists.items()
        }
        doc_len = np.array([float(sum(c.values())) for c in counts], dtype=np.float64)
        return cls(postings, doc_len, len(counts))


def idf(doc_freq: float, n_docs: float) -> float:
    """Okapi BM25 idf with the +1 that keeps it positive (Lucene's form)."""
    return float(np.log(1.0 + (n_docs - doc_freq + 0.5) / (doc_freq + 0.5)))


def bm25(
    index: TermIndex,
    query: Mapping[str, float],
    *,
    k1: float = 1.2,
    b: float = 0.75,
    bigram_weight: float = 1.0,
    mask: np.ndarray | None = None,
    neighbours: np.ndarray | None = None,
    neighbour_weights: Sequence[float] = (),
) -> np.ndarray:
    """Okapi BM25 score of every row for the query term counts `query`.

    With `neighbours` (see `neighbour_index`), a row's term frequencies and length are its own
    plus its session neighbours' at `neighbour_weights` ("neighbour context"). With `mask`, the
    collection statistics (row count, mean length, document frequencies) are those of the
    candidates alone: a row the viewer may not see changes no score.
    """
    n = index.n_docs
    scores = np.zeros(n, dtype=np.float64)
    if n == 0:
        return scores
    cols = []
    if neighbours is not None and neighbour_weights:
        cols = _columns(min(len(neighbour_weights), neighbours.shape[1] // 2), neighbour_weights)
    dl = index.doc_len if not cols else neighbour_sum(index.doc_len, neighbours, neighbour_weights)
    if mask is None:
        n_docs, avgdl = float(n), float(dl.mean())
    else:
        n_docs = float(mask.sum())
        avgdl = float(dl[mask].mean()) if n_docs else 1.0
    norm = k1 * (1.0 - b + b * dl / (avgdl or 1.0))
    for term, qtf in query.items():
        post = index.postings.get(term)
        if post is None:
            continue
        ix, tf = post
        df = len(ix) if mask is None else int(mask[ix].sum())
        weight = qtf * idf(df, n_docs) * (bigram_weight if "_" in term else 1.0)
        if cols:
            ix, tf = _spread_cached(index, term, ix, tf, neighbours, cols)  # type: ignore[arg-type]
        scores[ix] += weight * tf * (k1 + 1.0) / (tf + norm[ix])
    return scores


def spread(ix: np.ndarray, tf: np.ndarray, neighbours: np.ndarray,
           cols: Sequence[tuple[int, float]], n: int) -> tuple[np.ndarray, np.ndarray]:
    """A term's rows and counts with each holder's count added to its neighbours at their weight."""
    # Scatter each holder's count to the rows that have it as a neighbour: the row whose
    # previous-d is j is j's next-d (column c ^ 1), so each column is a plain gather.
    acc = np.zeros(n, dtype=np.float64)
    acc[ix] = tf
    for col, w in cols:
        recv = neighbours[ix, col ^ 1]
        ok = recv >= 0
        acc[recv[ok]] += w * tf[ok]
    rows = np.flatnonzero(acc)
    return rows, acc[rows]


def _spread_cached(index: TermIndex, term: str, ix: np.ndarray, tf: np.ndarray,
                   neighbours: np.ndarray, cols: list[tuple[int, float]]) -> tuple[np.ndarray, np.ndarray]:
    """`spread`, kept per term in the index's cache: common words of a long action have
    thousands of rows, and spreading them is most of a query's BM25 time."""
    cache = index.spread_cache
    if cache is None:
        return spread(ix, tf, neighbours, cols, index.n_docs)
    key = tuple(cols)
    found = cache.get(term)
    if found is not None and found[0] == key:
        return found[1], found[2]
    rows, counts = spread(ix, tf, neighbours, cols, index.n_docs)
    if len(cache) >= SPREAD_CACHE_TERMS:
        cache.clear()  # a bound, not an LRU: refilling costs one query's worth of spreading
    cache[term] = (key, rows, counts)
    return rows, counts


SPREAD_CACHE_TERMS = 20_000


# ---------------------------------------------------------------------------------------------
# Fusion


def zscore(x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """(x - mean) / std over the candidates in `mask`; zeros where the spread is nil."""
    sel = x if mask is None else x[mask]
    if sel.size == 0:
        return np.zeros(len(x), dtype=np.float64)
    sd = float(sel.std())
    if sd < 1e-12:
        return np.zeros(len(x), dtype=np.float64)
    return (x - float(sel.mean())) / sd


def fuse(
    channels: Mapping[str, np.ndarray],
    weights: Mapping[str, float],
    mask: np.ndarray | None = None,
) -> np.ndarray:
    """Weighted sum of each channel's z-scores over the candidates (weight-0 channels skipped)."""
    n = len(next(iter(channels.values()))) if channels else 0
    total = np.zeros(n, dtype=np.float64)
    for name, scores in channels.items():
        w = weights.get(name, 0.0)
        if w:
            total += w * zscore(scores, mask)
    return total


def reciprocal_rank_fusion(channels: Sequence[np.ndarray], k: float = 60.0) -> np.ndarray:
    """Classic RRF, kept as the baseline that z-score fusion is measured against."""
    total = np.zeros(len(channels[0]), dtype=np.float64)
    for scores in channels:
        ranks = np.empty(len(scores), dtype=np.float64)
        ranks[np.argsort(-scores, kind="stable")] = np.arange(1, len(scores) + 1)
        total += 1.0 / (k + ranks)
    return total


def group_max(scores: np.ndarray, gids: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """For each item, the best candidate score of its group (its own score if ungrouped)."""
    out = scores.astype(np.float64, copy=True)
    inside = gids >= 0
    pool = inside if mask is None else inside & mask
    if not pool.any():
        return out
    best = np.full(int(gids.max()) + 1, -np.inf)
    np.maximum.at(best, gids[pool], scores[pool])
    grouped = np.where(inside)[0]
    vals = best[gids[grouped]]
    out[grouped] = np.where(np.isfinite(vals), vals, scores[grouped])
    return out


def segment_max(values: np.ndarray, owners: np.ndarray, n_items: int, fill: np.ndarray) -> np.ndarray:
    """Max of `values` per owning item (best passage per item); `fill` where an item has none."""
    out = np.full(n_items, -np.inf)
    if len(values):
        np.maximum.at(out, owners, values)
    return np.where(np.isfinite(out), out, fill)


# ---------------------------------------------------------------------------------------------
# The ranker


@dataclass(frozen=True)
class RankingParams:
    """Every weight of the ranker; each becomes a setting `search_<name>`.

    Defaults were tuned on 4 LoCoMo conversations and checked on the other 6 (docs/search.md).
    Weights of channels are in z units; priors add to the fused z-score.
    """

    k1: float = 1.5  # BM25 term saturation
    b: float = 0.94  # BM25 length normalisation
    bigrams: bool = False  # adjacent-stem bigrams in BM25 terms (flat on LoCoMo; doubles postings)
    bigram_weight: float = 1.0
    neighbour_weights: tuple[float, ...] = (0.9, 0.5)  # BM25 counts of ±1, ±2 session neighbours
    passage_min_words: int = 16  # write time: passages (best-passage vectors) of at least this
    window_weights: tuple[float, ...] = (1.0, 0.6)  # vectors of ±1, ±2 neighbours in windows
    w_bm25: float = 0.75
    w_dense: float = 0.45  # the item's own vector
    w_dense_win1: float = 0.2  # ±1 window vector
    w_dense_win2: float = 0.225  # ±2 window vector
    w_dense_sent: float = 0.3  # best passage of multi-passage items (see `chunks`)
    w_speaker: float = 3.75  # messages by a character the query names
    w_session: float = 0.15  # best fused score in the item's session
    w_temporal: float = 2.0  # time expressions, for "when" questions
    w_length: float = 0.45  # log content length (substantive messages over "ok!")
    w_date: float = 2.5  # item dated in/just after a date the query names
    date_after_days: float = 14.0
    date_tau_days: float = 7.0
    w_recency: float = 0.0  # newer items (z of timestamp); flat on LoCoMo
    w_importance: float = 0.0  # importance 1-5 of memories; no labels in LoCoMo
    query_person: str = "first_person"  # dense query: "first_person" or "strip"

    def channel_weights(self) -> dict[str, float]:
        return {
            "bm25": self.w_bm25,
            "dense": self.w_dense,
            "dense_win1": self.w_dense_win1,
            "dense_win2": self.w_dense_win2,
            "dense_sent": self.w_dense_sent,
        }


@dataclass
class Corpus:
    """What search keeps in memory for one store: per-item arrays, aligned by row.

    `gids` holds each message's session group (see `group_ids`; -1 for memories, lore,
    summaries) and `neighbours` its session neighbours (`neighbour_index`); rows may come in any
    order. `vectors` are L2-normalised rows of `dense_text`;
    `win1_norm`/`win2_norm` come from `window_norms` (None skips the channel), or `win_vectors`
    holds embedded window texts (the costlier variant, kept for measurement); `sent_vectors` and
    `sent_owner` hold the passage vectors of multi-passage items (`chunks`) and their rows.
    """

    ids: list[str]
    terms: TermIndex
    vectors: np.ndarray
    gids: np.ndarray
    speakers: Sequence[str | None]
    neighbours: np.ndarray | None = None  # neighbour_index(gids, positions)
    win1_norm: np.ndarray | None = None  # window_norms(vectors, neighbours, 1, window_weights)
    win2_norm: np.ndarray | None = None  # window_norms(vectors, neighbours, 2, window_weights)
    win_vectors: tuple[np.ndarray, np.ndarray] | None = None  # embedded ±1/±2 window texts instead
    sent_vectors: np.ndarray | None = None
    sent_owner: np.ndarray | None = None
    temporal: np.ndarray | None = None  # temporal_cues per item
    content_len: np.ndarray | None = None  # content words of the item's own text
    days: np.ndarray | None = None  # date ordinal per item (NaN when undated)
    timestamps: np.ndarray | None = None  # seconds, for the recency prior
    importance: np.ndarray | None = None  # 1..5, for the importance prior
    # Speakers as integer codes (-1: none) and the code of each speaker id. A store that keeps
    # them up to date passes them in; otherwise they are built from `speakers` on first use.
    speaker_codes: np.ndarray | None = None
    speaker_table: Mapping[str, int] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def speaker_mask(self, named: Sequence[str]) -> np.ndarray:
        """Rows spoken by any of `named` (speaker codes are built once, then reused)."""
        if self.speaker_codes is None or self.speaker_table is None:
            table: dict[str, int] = {}
            self.speaker_codes = np.array(
                [-1 if s is None else table.setdefault(s, len(table)) for s in self.speakers],
                dtype=np.int64)
            self.speaker_table = table
        codes, table = self.speaker_codes, self.speaker_table
        wanted = [table[n] for n in named if n in table]
        return np.isin(codes, wanted) if wanted else np.zeros(len(codes), dtype=bool)


@dataclass(frozen=True)
class Query:
    """A query prepared once: BM25 terms, the dense vector, what it names."""

    text: str
    terms: Mapping[str, float]
    vector: np.ndarray
    named: tuple[str, ...] = ()  # character ids the query names
    temporal: bool = False  # asks "when"
    dates: tuple[tuple[int, int], ...] = ()  # calendar spans it names


def dense_query_text(text: str, cast: Cast, params: RankingParams = RankingParams()) -> str:
    """The text to embed for the dense side of `text` (names handled per `query_person`)."""
    return rewrite_query(text, cast, params.query_person)


def prepare_query(
    text: str, cast: Cast, vector: np.ndarray, params: RankingParams = RankingParams()
) -> Query:
    """Everything `rank` needs from a query, given the embedding of `dense_query_text(text)`."""
    return Query(
        text=text,
        terms=analyze(text, bigrams=params.bigrams),
        vector=np.asarray(vector, dtype=np.float32),
        named=tuple(cast.mentioned(text)),
        temporal=is_temporal_query(text),
        dates=tuple(query_dates(text)),
    )


def channel_scores(
    corpus: Corpus, query: Query, params: RankingParams, mask: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Raw scores of every item per channel (channels with weight 0 are not computed)."""
    out: dict[str, np.ndarray] = {}
    if params.w_bm25:
        out["bm25"] = bm25(
            corpus.terms, query.terms, k1=params.k1, b=params.b,
            bigram_weight=params.bigram_weight, mask=mask,
            neighbours=corpus.neighbours, neighbour_weights=params.neighbour_weights,
        )
    base = corpus.vectors @ query.vector
    out["dense"] = base
    if corpus.win_vectors is not None:
        if params.w_dense_win1:
            out["dense_win1"] = corpus.win_vectors[0] @ query.vector
        if params.w_dense_win2:
            out["dense_win2"] = corpus.win_vectors[1] @ query.vector
    else:
        nbr = corpus.neighbours
        if params.w_dense_win1 and corpus.win1_norm is not None and nbr is not None:
            out["dense_win1"] = window_scores(base, nbr, 1, corpus.win1_norm, params.window_weights)
        if params.w_dense_win2 and corpus.win2_norm is not None and nbr is not None:
            out["dense_win2"] = window_scores(base, nbr, 2, corpus.win2_norm, params.window_weights)
    if params.w_dense_sent and corpus.sent_vectors is not None and len(corpus.sent_vectors):
        sims = corpus.sent_vectors @ query.vector
        out["dense_sent"] = np.maximum(base, segment_max(sims, corpus.sent_owner, len(corpus), base))
    return out


def rank(
    corpus: Corpus,
    query: Query,
    params: RankingParams = RankingParams(),
    mask: np.ndarray | None = None,
) -> np.ndarray:
    """Fused score of every item (higher is better); items outside `mask` get -inf.

    `mask` is the candidate set (visibility and kinds, decided by the caller). Statistics —
    BM25's collection statistics, z-scores, session maxima — are taken over candidates only, so
    an item the viewer may not see neither appears nor moves another item's score.
    """
    if len(corpus) == 0:
        return np.zeros(0, dtype=np.float64)
    channels = channel_scores(corpus, query, params, mask)
    score = fuse(channels, params.channel_weights(), mask)
    if params.w_speaker and query.named:
        score += params.w_speaker * corpus.speaker_mask(query.named) / len(query.named)
    if params.w_temporal and query.temporal and corpus.temporal is not None:
        score += params.w_temporal * np.minimum(corpus.temporal, 2) / 2
    if params.w_date and query.dates and corpus.days is not None:
        score += params.w_date * date_prior(
            corpus.days, query.dates, params.date_after_days, params.date_tau_days
        )
    if params.w_length and corpus.content_len is not None:
        score += params.w_length * zscore(np.log1p(corpus.content_len), mask)
    if params.w_recency and corpus.timestamps is not None:
        score += params.w_recency * zscore(corpus.timestamps, mask)
    if params.w_importance and corpus.importance is not None:
        score += params.w_importance * zscore(corpus.importance, mask)
    if params.w_session:
        score += params.w_session * zscore(group_max(score, corpus.gids, mask), mask)
    if mask is not None:
        score = np.where(mask, score, -np.inf)
    return score


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the `k` best finite scores, best first (ties keep item order)."""
    finite = np.flatnonzero(np.isfinite(scores))
    if len(finite) == 0 or k <= 0:
        return finite[:0]
    if len(finite) > k:
        finite = finite[np.argpartition(-scores[finite], k - 1)[:k]]
    return finite[np.lexsort((finite, -scores[finite]))]
