"""The OpenAI-compatible backend over real HTTP (tests/helpers/fakellm.py), and run_prompt (rules OP1, OP3: LLM
modes, retries with backoff, timeouts; rule RV13: replies never wait, so failures must be clear)."""

from __future__ import annotations

import email.utils
import json
import logging
import socket
import threading
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from server_plugin.jobs import llm
from server_plugin.jobs.calls import run_job_prompt
from server_plugin.jobs.llm import (
    LLMBadResponse,
    LLMConfigError,
    LLMRateLimited,
    LLMRejected,
    LLMUnavailable,
    OpenAICompatible,
    normalise_url,
    run_prompt,
)
from server_plugin.jobs.tasks.base import ChatMessage, Prompt, PromptParseError
from server_plugin.jobs.tasks.registry import TASKS, fallback, parse
from server_plugin.jobs.tasks.summaries import Summary, chunk_summary
from server_plugin.settings import load_settings
from tests.helpers.fakellm import FakeLLM
from tests.helpers.tasks import DEFAULTS, limits

KEY = "sk-test-SECRET-0123456789"
MESSAGES = [{"role": "user", "content": "Hello"}]
# The llm_* settings' defaults, as make_backend passes them.
CALL = {"timeout": (DEFAULTS.llm_connect_timeout, DEFAULTS.llm_read_timeout),
        "retries": DEFAULTS.llm_retries, "backoff_base": DEFAULTS.llm_backoff_base,
        "backoff_max": DEFAULTS.llm_backoff_max, "retry_after_max": DEFAULTS.llm_retry_after_max}


def call(**kw) -> dict:
    """OpenAICompatible's call settings: the defaults, `kw` replacing any."""
    return {**CALL, **kw}


@pytest.fixture(scope="module")
def fake_server():
    server = FakeLLM().start()
    yield server
    server.stop()


@pytest.fixture
def fake(fake_server):
    """One real fake-model server per module (stopping one takes 0.5 s), reset for each test."""
    fake_server.reset()
    yield fake_server
    fake_server.reset()


class Sleeps(list):
    """An injected sleep: records the waits instead of waiting."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def client(fake: FakeLLM, **kw) -> tuple[OpenAICompatible, Sleeps]:
    sleeps = Sleeps()
    kw.setdefault("rand", lambda: 1.0)  # jitter factor 1: the waits are the exponential ceiling
    kw.setdefault("timeout", (2.0, 5.0))
    return OpenAICompatible(fake.url, kw.pop("model", "test-model"), kw.pop("key", None),
                            **call(sleep=sleeps, **kw)), sleeps


# --- configuration ---------------------------------------------------------------------------

@pytest.mark.parametrize("given, expected", [
    ("http://127.0.0.1:5001", "http://127.0.0.1:5001/v1/chat/completions"),
    ("http://127.0.0.1:5001/", "http://127.0.0.1:5001/v1/chat/completions"),
    ("http://127.0.0.1:5001/v1", "http://127.0.0.1:5001/v1/chat/completions"),
    (" http://127.0.0.1:5001/v1/ ", "http://127.0.0.1:5001/v1/chat/completions"),
    ("http://localhost:11434/v1/chat/completions", "http://localhost:11434/v1/chat/completions"),
    ("https://openrouter.ai/api/v1", "https://openrouter.ai/api/v1/chat/completions"),
    ("https://generativelanguage.googleapis.com/v1beta/openai/",
     "https://generativelanguage.googleapis.com/v1beta/openai/chat/completions"),
])
def test_llm_url_normalisation(given, expected):
    """rule OP3 (openai mode): a base URL with or without /v1 and trailing slash finds the endpoint."""
    assert normalise_url(given) == expected


@pytest.mark.parametrize("bad", ["", "   ", "127.0.0.1:5001", "ftp://host/v1"])
def test_llm_bad_url_is_a_config_error(bad):
    """rule OP3: a URL that cannot work is reported as configuration, naming the setting."""
    with pytest.raises(LLMConfigError, match="llm_url|http"):
        normalise_url(bad)


def test_llm_missing_model_is_a_config_error(fake):
    with pytest.raises(LLMConfigError, match="llm_model"):
        OpenAICompatible(fake.url, "  ", **CALL)


def test_llm_base_url_without_v1_reaches_the_server(fake):
    """rule OP3: http://host:port (KoboldCpp/llama.cpp style) is completed to /v1/chat/completions."""
    fake.script(["pong"])
    backend = OpenAICompatible(fake.url[: -len("/v1")], "m", **call(sleep=Sleeps()))
    assert backend.complete(MESSAGES, max_tokens=5) == "pong"
    assert fake.requests[-1]["path"] == "/v1/chat/completions"


# --- success ---------------------------------------------------------------------------------

def test_llm_success_sends_the_openai_request(fake):
    """rule OP3 (openai mode): model, messages, max_tokens, temperature 0, no streaming."""
    fake.script(["the answer"])
    backend, sleeps = client(fake)
    assert backend.complete(MESSAGES, max_tokens=42) == "the answer"
    body = fake.completions()[-1]
    assert body == {"model": "test-model", "messages": MESSAGES, "max_tokens": 42,
                    "temperature": 0.0, "stream": False}
    assert sleeps == []


def test_llm_response_format_is_passed_through(fake):
    """A JSON mode asked for is sent as response_format; none is sent by default."""
    fake.script(["{}"])
    backend, _ = client(fake)
    backend.complete(MESSAGES, max_tokens=5, response_format={"type": "json_object"})
    assert fake.completions()[-1]["response_format"] == {"type": "json_object"}


def test_llm_authorization_only_when_a_key_is_set(fake):
    """rule OP3: the key goes in a Bearer header; without a key no Authorization header is sent."""
    fake.script(["a", "b"])
    client(fake)[0].complete(MESSAGES, max_tokens=5)
    client(fake, key=KEY)[0].complete(MESSAGES, max_tokens=5)
    first, second = (r["headers"] for r in fake.requests)
    assert "Authorization" not in first
    assert second["Authorization"] == f"Bearer {KEY}"


def test_llm_list_models(fake):
    backend, _ = client(fake)
    assert backend.list_models() == ["fake-model"]


# --- retries ---------------------------------------------------------------------------------

def test_llm_retries_after_500_then_succeeds(fake):
    """rule OP3: a 5xx is retried after a backoff; the second attempt's answer is returned."""
    fake.fail_next(1, 500)
    fake.script(["recovered"])
    backend, sleeps = client(fake, backoff_base=0.5)
    assert backend.complete(MESSAGES, max_tokens=5) == "recovered"
    assert len(fake.completions()) == 2
    assert sleeps == [0.5]


def test_llm_backoff_is_exponential_capped_and_jittered(fake):
    """rule OP3: waits double (1, 2, 4, …), never exceed backoff_max, and jitter scales them into
    [0.5, 1] of the ceiling; after `retries` retries the error is raised and is retryable."""
    fake.fail_next(5, 503)
    backend, sleeps = client(fake, retries=4, backoff_base=1.0, backoff_max=3.0)
    with pytest.raises(LLMUnavailable, match="HTTP 503") as info:
        backend.complete(MESSAGES, max_tokens=5)
    assert info.value.retryable
    assert sleeps == [1.0, 2.0, 3.0, 3.0]
    assert len(fake.completions()) == 5
    jittered = OpenAICompatible(fake.url, "m", **call(rand=lambda: 0.0, backoff_base=2.0))
    assert jittered.backoff(1) == 2.0  # 4 s ceiling, halved by the lowest jitter


def test_llm_429_honours_retry_after(fake):
    """rule OP3: a 429 with Retry-After waits exactly what the server asked, then retries."""
    fake.fail_next(1, 429, retry_after=7)
    fake.script(["ok after waiting"])
    backend, sleeps = client(fake, backoff_base=0.1)
    assert backend.complete(MESSAGES, max_tokens=5) == "ok after waiting"
    assert sleeps == [7.0]


def test_llm_429_with_a_long_retry_after_is_left_to_the_queue(fake):
    """rule OP3: a worker does not sleep for minutes; the error carries retry_after for the queue."""
    fake.fail_next(1, 429, retry_after=600)
    backend, sleeps = client(fake, retry_after_max=120)
    with pytest.raises(LLMRateLimited) as info:
        backend.complete(MESSAGES, max_tokens=5)
    assert info.value.retry_after == 600
    assert info.value.retryable
    assert sleeps == [] and len(fake.completions()) == 1


def test_llm_retry_after_as_an_http_date(fake):
    """rule OP3: Retry-After may be an HTTP date; it is turned into the seconds left until then."""
    when = email.utils.format_datetime(datetime.now(timezone.utc) + timedelta(seconds=30), usegmt=True)
    fake.fail_next(1, 429, retry_after=when)
    fake.script(["ok"])
    backend, sleeps = client(fake)
    assert backend.complete(MESSAGES, max_tokens=5) == "ok"
    assert len(sleeps) == 1 and 20 < sleeps[0] <= 30


def test_llm_503_with_retry_after_waits_as_asked(fake):
    """rule OP3: a server loading its model answers 503 with Retry-After; we wait that long."""
    fake.fail_next(1, 503, retry_after=3)
    fake.script(["loaded"])
    backend, sleeps = client(fake, backoff_base=0.1)
    assert backend.complete(MESSAGES, max_tokens=5) == "loaded"
    assert sleeps == [3.0]


def test_llm_429_without_retry_after_uses_backoff(fake):
    fake.fail_next(1, 429)
    fake.script(["fine"])
    backend, sleeps = client(fake, backoff_base=0.25)
    assert backend.complete(MESSAGES, max_tokens=5) == "fine"
    assert sleeps == [0.25]


@pytest.mark.parametrize("status, hint", [(400, "llm_json_mode"), (401, "llm_key"),
                                          (403, "llm_key"), (404, "llm_url")])
def test_llm_4xx_is_not_retried(fake, status, hint):
    """rule OP3: a request the server refuses is not retried; the message says what to check."""
    fake.fail_next(1, status)
    backend, sleeps = client(fake, key=KEY)
    with pytest.raises(LLMRejected, match=hint) as info:
        backend.complete(MESSAGES, max_tokens=5)
    assert info.value.status == status
    assert not info.value.retryable
    assert sleeps == [] and len(fake.completions()) == 1


def test_llm_timeout_is_retried_then_reported(fake):
    """rule OP3: a server slower than the read timeout is a retryable LLMUnavailable naming the setting."""
    fake.delay = 0.6
    backend, sleeps = client(fake, timeout=(1.0, 0.2), retries=1)
    with pytest.raises(LLMUnavailable, match="llm_read_timeout") as info:
        backend.complete(MESSAGES, max_tokens=5)
    assert info.value.retryable
    assert len(sleeps) == 1
    assert len(fake.completions()) == 2


def test_llm_connection_refused_is_unavailable():
    """rule OP3: nothing listening -> LLMUnavailable after the retries, with a hint to check the URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free now: nobody listens on it once closed
    sleeps = Sleeps()
    backend = OpenAICompatible(f"http://127.0.0.1:{port}/v1", "m",
                               **call(retries=2, sleep=sleeps, timeout=(1.0, 1.0)))
    with pytest.raises(LLMUnavailable, match="Could not connect"):
        backend.complete(MESSAGES, max_tokens=5)
    assert len(sleeps) == 2


def test_llm_key_never_appears_in_errors_logs_or_repr(fake, caplog):
    """rule OP3: the API key is never logged nor put in an error message."""
    caplog.set_level(logging.DEBUG)
    fake.fail_next(2, 500)
    fake.fail_next(1, 401)
    backend, _ = client(fake, key=KEY, retries=3)
    with pytest.raises(LLMRejected) as info:
        backend.complete(MESSAGES, max_tokens=5)
    assert "retry" in caplog.text  # the retries were logged …
    assert KEY not in caplog.text  # … without the key
    assert KEY not in str(info.value)
    assert KEY not in repr(backend)


def test_llm_key_echoed_by_the_server_is_blanked(canned_status):
    """rule OP3: a server that echoes the key in its error text does not leak it into our message."""
    url = canned_status(401, json.dumps({"error": {"message": f"Incorrect API key provided: {KEY}"}}).encode())
    backend = OpenAICompatible(url, "m", KEY, **call(sleep=Sleeps()))
    with pytest.raises(LLMRejected) as info:
        backend.complete(MESSAGES, max_tokens=5)
    assert KEY not in str(info.value) and "[key]" in str(info.value)


def test_llm_408_is_retried(fake):
    fake.fail_next(1, 408)
    fake.script(["ok"])
    backend, sleeps = client(fake)
    assert backend.complete(MESSAGES, max_tokens=5) == "ok" and len(sleeps) == 1


def test_llm_url_credentials_are_redacted():
    """rule OP3: user:password or ?key= in a configured URL never reach messages."""
    backend = OpenAICompatible("http://user:pw@127.0.0.1:9/v1?key=abc", "m",
                               **call(retries=0, timeout=(0.5, 0.5), sleep=Sleeps()))
    with pytest.raises(LLMUnavailable) as info:
        backend.complete(MESSAGES, max_tokens=5)
    assert "pw" not in str(info.value) and "abc" not in str(info.value)


# --- bad answers -----------------------------------------------------------------------------

class _Canned(BaseHTTPRequestHandler):
    """A real HTTP server answering one fixed body (for answers the fake model does not produce)."""

    body = b""
    content_type = "application/json"
    status = 200

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(self.status)
        self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.fixture
def canned_status():
    servers = []

    def start(status: int, body: bytes, content_type: str = "application/json") -> str:
        handler = type("H", (_Canned,), {"body": body, "content_type": content_type, "status": status})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/v1"

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


@pytest.fixture
def canned(canned_status):
    return lambda body, content_type="application/json": canned_status(200, body, content_type)


def test_llm_html_answer_is_a_bad_response(canned):
    """rule OP3: a URL pointing at a web page (not the API) says so instead of failing obscurely."""
    url = canned(b"<html>KoboldAI Lite</html>", "text/html")
    with pytest.raises(LLMBadResponse, match="not JSON") as info:
        OpenAICompatible(url, "m", **call(sleep=Sleeps())).complete(MESSAGES, max_tokens=5)
    assert not info.value.retryable


def test_llm_empty_completion_is_a_retryable_bad_response(canned):
    url = canned(json.dumps({"choices": [{"message": {"content": "  "}}]}).encode())
    with pytest.raises(LLMBadResponse, match="empty") as info:
        OpenAICompatible(url, "m", **call(sleep=Sleeps())).complete(MESSAGES, max_tokens=5)
    assert info.value.retryable


def test_llm_answer_cut_at_max_tokens_is_repaired_and_noted(canned):
    """rule MJ2: JSON cut off where the model hit max_tokens is repaired, used, and the change noted."""
    body = {"choices": [{"message": {"content": '{"summary": "Ayla went'}, "finish_reason": "length"}]}
    backend = OpenAICompatible(canned(json.dumps(body).encode()), "m", **call(sleep=Sleeps()))
    prompt = chunk_summary([ChatMessage("a", "Ayla", "I went home.")], **limits("chunk_summary"))
    outcome = run_job_prompt(prompt, backend)
    assert outcome.result.text == "Ayla went" and outcome.answer == "first_try"
    assert any("repaired" in c for c in outcome.report.changed)


# --- the pipeline ----------------------------------------------------------------------------

CHUNK = [ChatMessage("id-1", "Sam", "Call me Red. I will be back at dawn.", "user"),
         ChatMessage("id-2", "Ayla", "\u201cThen I\u2019ll wait by the gate,\u201d she says.", "assistant")]


def test_llm_run_prompt_openai_mode_renders_completes_parses(fake):
    """rules OP1, OP2 (openai mode): render -> complete over HTTP -> strict parse, labels mapped to ids."""
    fake.script([json.dumps({"summary": "Sam asked to be called Red and promised to return at dawn.",
                             "quotes": [{"speaker": "Ayla", "text": "Then I'll wait by the gate",
                                         "message": "m2"}]})])
    backend, _ = client(fake)
    result = run_prompt(chunk_summary(CHUNK, **limits("chunk_summary")), backend)
    assert isinstance(result, Summary)
    assert result.covers == ("id-1", "id-2")
    assert [(q.text, q.message_id) for q in result.quotes] == [("Then I\u2019ll wait by the gate", "id-2")]
    sent = fake.completions()[-1]["messages"]
    assert sent[0]["role"] == "system" and "JSON" in sent[0]["content"]
    assert "[m2] Ayla: \u201cThen I\u2019ll wait by the gate,\u201d she says." in sent[1]["content"]


def test_llm_garbage_answer_is_a_parse_error_and_nothing_is_returned(fake):
    """rule OP2: a malformed answer fails the job with a clear error (PromptParseError)."""
    fake.garbage_next(1)
    backend, _ = client(fake)
    with pytest.raises(PromptParseError, match="chunk_summary"):
        run_prompt(chunk_summary(CHUNK, **limits("chunk_summary")), backend)


def test_llm_run_prompt_extractive_mode_needs_no_server():
    """rule OP1 (extractive mode): no backend -> the extractive result, same type as the parser's."""
    prompt = chunk_summary(CHUNK, **limits("chunk_summary"))
    result = run_prompt(prompt, None)
    assert isinstance(result, Summary)
    assert result == fallback(prompt)


def test_llm_client_mode_payload_round_trip(fake):
    """rule OP1 (client mode): the job carries Prompt.to_payload(); the extension's text comes back
    and goes through the same parser (here the text comes from the fake model over HTTP)."""
    payload = json.loads(json.dumps(chunk_summary(CHUNK, **limits("chunk_summary")).to_payload()))
    fake.script([json.dumps({"summary": "Red will return at dawn.", "quotes": []})])
    backend, _ = client(fake)
    text = backend.complete([{"role": "system", "content": payload["system"]},
                             {"role": "user", "content": payload["user"]}],
                            max_tokens=payload["max_tokens"])
    result = parse(Prompt.from_payload(payload), text)
    assert result.text == "Red will return at dawn." and result.covers == ("id-1", "id-2")


def test_llm_run_prompt_json_mode(fake):
    fake.script([json.dumps({"summary": "x", "quotes": []})])
    backend, _ = client(fake)
    run_prompt(chunk_summary(CHUNK, **limits("chunk_summary")), backend, json_mode="json_schema")
    fmt = fake.completions()[-1]["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["schema"] == TASKS["chunk_summary"].schema


def test_llm_make_backend_per_mode(fake, tmp_path):
    """rule OP1: the three LLM modes — openai gets a client, extractive none, client none server-side."""
    base = {"data_dir": str(tmp_path)}
    openai = load_settings({**base, "llm_mode": "openai", "llm_url": fake.url, "llm_model": "m"}, environ={})
    backend = llm.make_backend(openai, sleep=Sleeps())
    assert isinstance(backend, OpenAICompatible)
    assert llm.make_backend(load_settings(base, environ={})) is None
    with pytest.raises(LLMConfigError, match="extension"):
        llm.make_backend(load_settings({**base, "llm_mode": "client"}, environ={}))
    with pytest.raises(LLMConfigError, match="llm_mode"):
        llm.make_backend(SimpleNamespace(llm_mode="gpt"))  # load_settings refuses it already


def test_llm_backend_from_settings(fake, tmp_path):
    """rule OP1: the mode and the llm_* settings build the backend; extractive and client need none."""
    from server_plugin.settings import SettingsError
    base = {"data_dir": str(tmp_path)}
    assert llm.backend_from_settings(load_settings(base, environ={})) is None
    assert llm.backend_from_settings(load_settings({**base, "llm_mode": "client"}, environ={})) is None
    s = load_settings({**base, "llm_mode": "openai", "llm_url": fake.url, "llm_model": "m",
                       "llm_key": KEY, "llm_read_timeout": 7, "llm_retries": 1}, environ={})
    backend = llm.backend_from_settings(s, sleep=Sleeps())
    assert backend.timeout == (10.0, 7.0) and backend.retries == 1
    fake.script(["via settings"])
    assert backend.complete(MESSAGES, max_tokens=5) == "via settings"
    with pytest.raises(SettingsError, match="llm_json_mode"):
        load_settings({**base, "llm_json_mode": "yaml"}, environ={})
