"""The embedding model's turns: a request's query goes before background jobs' chunks (rule OP4:
`POST /v1/context` must stay fast while the worker embeds a finished session)."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from server_plugin import priority
from server_plugin.retrieval.embeddings import Embedder, packaged_model_path

WAIT = 60.0  # seconds; the session's model is loaded before any test, so nothing waits


def test_a_request_embedding_goes_before_the_rest_of_a_background_batch(embedder):
    """A job embedding 400 texts in the background does not hold a request's one query until the
    whole batch is done: the query gets the model at the next chunk boundary."""
    order: list[str] = []
    started = threading.Event()
    texts = [f"Background line {i} about the lantern and the harbour." for i in range(400)]
    real_run = embedder._run

    def watched_run(chunk, *args, **kwargs):
        if len(chunk) == embedder.background_chunk:
            started.set()
        return real_run(chunk, *args, **kwargs)

    def job() -> None:
        with priority.background():
            embedder.embed(texts, WAIT)
        order.append("background batch")

    embedder._run = watched_run
    try:
        worker = threading.Thread(target=job)
        worker.start()
        assert started.wait(30)
        vector = embedder.embed_one("Where did Ayla hide the lantern? (a request)", WAIT)
        order.append("request")
        worker.join(120)
    finally:
        del embedder._run  # back to the class's own method
    assert order == ["request", "background batch"]
    assert vector.shape == (embedder.dim,) and abs(float(np.linalg.norm(vector)) - 1.0) < 1e-4


def test_background_chunks_give_the_same_vectors_as_one_batch(embedder):
    """Embedding in chunks changes nothing in the vectors (each text is embedded alone)."""
    texts = [f"Chunked text number {i}: the ferry left at dawn." for i in range(20)]
    with priority.background():
        chunked = embedder.embed(texts, WAIT)
    embedder._cache.clear()
    whole = embedder.embed(texts, WAIT)
    assert np.allclose(chunked, whole, atol=1e-5)


def test_background_chunks_hold_texts_of_like_length_and_vectors_come_back_in_order(embedder):
    """An item's whole text and its short passages go to the model in chunks of like length (a
    chunk is padded to its longest), and each text still gets its own vector."""
    texts = [("The ferry left at dawn and the harbour emptied, gull by gull. " * (i % 5 * 4 + 1))
             + f"Passage {i}." for i in range(20)]
    chunks: list[list[str]] = []
    real_run = embedder._run
    embedder._run = lambda chunk, *a, **k: chunks.append(list(chunk)) or real_run(chunk, *a, **k)
    try:
        with priority.background():
            chunked = embedder.embed(texts, WAIT)
    finally:
        del embedder._run
    assert len(chunks) == 3 and sorted(t for c in chunks for t in c) == sorted(texts)
    assert all(max(map(len, a)) <= min(map(len, b)) for a, b in zip(chunks, chunks[1:]))
    alone = np.stack([real_run([t], "passage")[0] for t in texts])
    assert np.abs(chunked - alone).max() < 1e-5


def test_background_marks_only_its_own_thread():
    """`priority.background()` is per thread and restores what it found."""
    seen: list[bool] = []
    with priority.background():
        other = threading.Thread(target=lambda: seen.append(priority.is_background()))
        other.start()
        other.join()
        assert priority.is_background() is True
    assert priority.is_background() is False
    assert seen == [False]


def folder_for_sentence_transformers(root: Path) -> Path:
    """The packaged MiniLM with its weights in pytorch_model.bin: a folder bert.py leaves to
    sentence-transformers (same vectors)."""
    import torch
    from safetensors.torch import load_file

    folder = root / "minilm-bin"
    shutil.copytree(packaged_model_path(), folder)
    torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    return folder


@pytest.fixture(scope="module")
def st_embedder(tmp_path_factory) -> Embedder:
    """An embedder loaded through sentence-transformers (a folder bert.py does not read)."""
    folder = folder_for_sentence_transformers(tmp_path_factory.mktemp("st"))
    model = Embedder(str(folder), threads=1, background_chunk=8, step_aside_seconds=0).start_loading()
    model.wait(180)
    return model


def test_one_query_goes_through_the_traced_transformer_with_the_batch_vectors(st_embedder, embedder):
    """A folder loaded through sentence-transformers has its transformer traced once at load (a
    query's forward pass without Python's per-module dispatch); a query embedded alone that way is
    the vector the batch path gives, and the packaged folder's through bert.py, for short, usual
    and truncated texts."""
    deadline = time.monotonic() + WAIT
    while st_embedder._traced is None and time.monotonic() < deadline:  # traced just after ready
        time.sleep(0.05)
    assert st_embedder._encoder is None and st_embedder._direct and st_embedder._traced is not None
    assert embedder._encoder is not None and embedder._model is None  # the packaged one: bert.py
    texts = ["ok", "Where did Ayla hide the lantern before the storm?", "lantern " * 400]
    st_embedder._cache.clear()
    embedder._cache.clear()
    alone = np.stack([st_embedder.embed_one(t, WAIT, kind="query") for t in texts])
    batch = st_embedder._model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    assert np.allclose(alone, batch, rtol=0, atol=1e-5)
    # (what is stored: a query may be embedded in bfloat16, tests/test_bert.py)
    assert np.allclose(embedder.embed(texts, WAIT, kind="passage"), batch, rtol=0, atol=1e-5)


def test_a_model_the_tracer_cannot_follow_keeps_the_eager_pass():
    """_traced gives None (the eager forward pass stays) for a model it cannot trace."""
    from server_plugin.retrieval.embeddings import _traced

    class NotATransformer(list):
        def preprocess(self, texts):
            return {"text": texts}

    assert _traced(NotATransformer()) is None


def test_a_process_that_exits_while_the_model_is_traced_ends_cleanly(tmp_path):
    """The trace runs on the loading thread just after the model is ready; a process that exits
    then (a short CLI command, the sidecar told to stop) waits for it instead of aborting."""
    import subprocess
    import sys

    folder = folder_for_sentence_transformers(tmp_path)
    script = ("from server_plugin.retrieval.embeddings import Embedder\n"
              f"e = Embedder({str(folder)!r}, threads=1, background_chunk=8,\n"
              "             step_aside_seconds=0).start_loading()\n"
              "e.wait(120)\n"
              "print('tracing' if e._tracing else 'traced already')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
