"""Fixtures: a fresh data dir per test, the real model loaded once per session, an authed client,
and a fake model server. The helpers the tests call are in tests/helpers/ (imported from there)."""

from __future__ import annotations

import os

# Before numpy/torch load: one BLAS thread; never reach for the network.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ["HF_HUB_OFFLINE"] = "1"

from typing import Any, Iterator  # noqa: E402

import pytest  # noqa: E402

from server_plugin.app import build_services, create_app  # noqa: E402
from server_plugin.clock import FakeClock  # noqa: E402
from server_plugin.retrieval.embeddings import Embedder, from_settings  # noqa: E402
from server_plugin.settings import defaults, load_settings  # noqa: E402
from tests.helpers.api import T0, TOKEN, Api  # noqa: E402
from tests.helpers.episodes import Answers  # noqa: E402
from tests.helpers.fakellm import FakeLLM  # noqa: E402


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """The real packaged MiniLM, loaded once for the whole run."""
    model = from_settings(defaults()).start_loading()
    model.wait(120)
    return model


@pytest.fixture
def overrides() -> dict[str, Any]:
    """Per-test setting overrides; a test may add to it before asking for `app`."""
    return {}


@pytest.fixture
def settings(tmp_path, overrides):
    # NORMAL: same semantics as FULL, without an fsync per commit (the suite writes thousands).
    # No background worker: tests run jobs deterministically (jobs.run_pending); one test starts it.
    # Parts (MJ1) are read as soon as they are due unless a test asks them to wait and grow.
    values = {"data_dir": str(tmp_path / "data"), "token": TOKEN, "sqlite_synchronous": "NORMAL",
              "worker_enabled": False, "part_wait_seconds": 0, **overrides}
    return load_settings(values, environ={})


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def services(settings, embedder, clock):
    svc = build_services(settings, embedder=embedder, clock=clock)
    yield svc
    svc.db.close()


@pytest.fixture
def app(settings, services):
    return create_app(settings, services=services)


@pytest.fixture
def api(app) -> Iterator[Api]:
    yield Api(app.test_client())


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    """A real fake-model server answering each extraction task from its prompt's labels (a test
    module that needs another answerer defines its own `fake`)."""
    server = FakeLLM().start()
    server.responder = Answers()
    yield server
    server.stop()
