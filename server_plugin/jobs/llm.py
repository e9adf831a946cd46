"""Model backends behind one small interface, and the one function a job runner calls.

Modes (setting `llm_mode`):
- `openai`: any OpenAI-compatible `/v1/chat/completions` endpoint (KoboldCpp, llama.cpp server,
  Ollama, LM Studio, vLLM, OpenRouter, OpenAI…) through `OpenAICompatible`;
- `client`: the SillyTavern extension claims the job, runs `Prompt.to_payload()` through
  `generateRaw`, and posts the text back; the worker then parses it with the prompt's Task
  (`tasks/registry.py`; no backend here);
- `extractive`: no model at all; the prompt's `Task.fallback` builds the result from the text itself.

`run_prompt(prompt, backend)` is the whole pipeline for the two server-side modes:
render (done by the caller) -> complete -> parse. Errors say whether retrying can help
(`LLMError.retryable`), so the queue knows whether to back off or give up.
"""

from __future__ import annotations

import email.utils
import json
import logging
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol
from urllib.parse import urlsplit, urlunsplit

import requests

from .tasks.base import PromptParseError
from .tasks.registry import task_of

if TYPE_CHECKING:
    from ..settings import Settings
    from .tasks.base import Prompt

log = logging.getLogger(__name__)

RETRYABLE_4XX = (408, 425)  # request timeout, too early: transient, unlike the other 4xx


class LLMError(Exception):
    """A model call failed. `retryable` says whether the same call later may succeed."""

    retryable = False


class LLMConfigError(LLMError):
    """The backend is not usable as configured (no URL, a URL that is not http(s), no model)."""


class LLMUnavailable(LLMError):
    """The server could not be reached, timed out, was overloaded or failed (after retries).
    `retry_after`: seconds the server asked us to wait (Retry-After), if it said."""

    retryable = True

    def __init__(self, message: str, retry_after: float | None = None, reached: bool = False) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.reached = reached  # the model got the prompt (it timed out or went silent while writing)


class LLMRateLimited(LLMUnavailable):
    """The server said 429 (too many requests); `retry_after` as for LLMUnavailable."""


class LLMRejected(LLMError):
    """The server refused the request (4xx other than 429): a wrong key, model, URL or parameter.
    Retrying the same request cannot help; `status` is the HTTP status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class LLMBadResponse(LLMError):
    """The server answered 200 but not with a usable completion (not JSON, no text, cut off)."""

    def __init__(self, message: str, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class Backend(Protocol):
    """What a job runner needs from a model."""

    name: str

    def complete(self, messages: list[dict[str, Any]], *, max_tokens: int, temperature: float = 0.0,
                 response_format: dict[str, Any] | None = None) -> str: ...


@dataclass(frozen=True)
class Completion:
    """A completion and what the server said about it."""

    text: str
    finish_reason: str | None
    model: str | None
    usage: dict[str, Any] | None


def normalise_url(url: str) -> str:
    """The chat-completions URL for what a person typed.

    `http://host:5001` -> `http://host:5001/v1/chat/completions` (KoboldCpp, llama.cpp, Ollama);
    a base with a path (`…/v1`, `…/api/v1`, `…/v1beta/openai/`) gets `/chat/completions`;
    a full `…/chat/completions` is kept. Trailing slashes and spaces do not matter.
    """
    raw = (url or "").strip()
    if not raw:
        raise LLMConfigError("No model URL is set (setting llm_url), e.g. http://127.0.0.1:5001/v1")
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise LLMConfigError(f"The model URL {redact(raw)!r} is not an http(s) URL "
                             "(e.g. http://127.0.0.1:5001/v1)")
    path = parts.path.rstrip("/")
    if not path:
        path = "/v1/chat/completions"
    elif not path.endswith("/chat/completions"):
        path += "/chat/completions"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def redact(url: str) -> str:
    """A URL safe to show or log: no user:password, no query string (keys hide in both)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _retry_after(response: requests.Response) -> float | None:
    """Seconds from a Retry-After header (a number or an HTTP date), or None."""
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _server_message(response: requests.Response) -> str:
    """The server's own error text, short (OpenAI-style `{"error": {"message"}}` or raw body)."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:200]
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or err)[:200]
        return str(err)[:200]
    return str(body)[:200]


_REJECTED_HINTS = {
    400: "the server did not accept the request; check the model name, max tokens "
         "and JSON mode (setting llm_json_mode) for this server",
    401: "the server refused the API key (setting llm_key)",
    403: "the server refused access with this API key (setting llm_key)",
    404: "nothing answers at this URL, or the model does not exist; check llm_url and llm_model",
    413: "the prompt is too large for this server",
    422: "the server did not accept the request's parameters",
}


class OpenAICompatible:
    """A client for any OpenAI-compatible chat-completions server, with retries and backoff.

    `timeout` is (connect, read) seconds. Retries (at most `retries` times after the first
    attempt) on connection errors, timeouts, 408, 425, 429 and 5xx, waiting
    `min(backoff_max, backoff_base * 2**n)` scaled by a random factor in [0.5, 1] (jitter spreads
    out clients that failed together), or exactly what a Retry-After header (on 429 or 5xx) asks
    when it asks at most `retry_after_max` seconds. Other 4xx are not retried. Make one from the
    llm_* settings with `make_backend`.
    The API key is sent only as a Bearer header and never appears in logs or error messages.
    """

    name = "openai"

    def __init__(self, url: str, model: str, key: str | None = None, *,
                 timeout: tuple[float, float], retries: int, backoff_base: float,
                 backoff_max: float, retry_after_max: float,
                 sleep: Callable[[float], None] = time.sleep,
                 rand: Callable[[], float] = random.random,
                 extra_headers: dict[str, str] | None = None,
                 session: requests.Session | None = None) -> None:
        self.url = normalise_url(url)
        if not (model or "").strip():
            raise LLMConfigError("No model name is set (setting llm_model); local servers that "
                                 "serve one model accept any name, e.g. 'local'")
        self.model = model.strip()
        self._key = (key or "").strip() or None
        self.timeout = timeout
        self.retries = max(0, int(retries))
        self.backoff_base, self.backoff_max = backoff_base, backoff_max
        self.retry_after_max = retry_after_max
        self._sleep, self._rand = sleep, rand
        self._extra_headers = dict(extra_headers or {})
        self._session = session or requests.Session()

    def __repr__(self) -> str:  # never shows the key
        return f"OpenAICompatible(url={redact(self.url)!r}, model={self.model!r}, key={'set' if self._key else 'none'})"

    @property
    def safe_url(self) -> str:
        return redact(self.url)

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json",
                   **self._extra_headers}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        return headers

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before retry number `attempt` (0-based), with jitter."""
        ceiling = min(self.backoff_max, self.backoff_base * (2 ** attempt))
        return ceiling * (0.5 + 0.5 * self._rand())

    def complete(self, messages: list[dict[str, Any]], *, max_tokens: int, temperature: float = 0.0,
                 response_format: dict[str, Any] | None = None) -> str:
        """The text of one completion. Raises LLMError subclasses (see `retryable`)."""
        return self.complete_full(messages, max_tokens=max_tokens, temperature=temperature,
                                  response_format=response_format).text

    def complete_full(self, messages: list[dict[str, Any]], *, max_tokens: int,
                      temperature: float = 0.0,
                      response_format: dict[str, Any] | None = None) -> Completion:
        """One completion with its finish reason and usage (no check that it was complete)."""
        body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": int(max_tokens),
                                "temperature": temperature, "stream": False}
        if response_format is not None:
            body["response_format"] = response_format
        attempt = 0
        while True:
            try:
                return self._once(body)
            except LLMUnavailable as e:
                wait = self._wait_for(e, attempt)
                if attempt >= self.retries or wait is None:
                    raise
                log.warning("model call to %s failed (%s); retry %d/%d in %.1f s",
                            self.safe_url, e, attempt + 1, self.retries, wait)
                self._sleep(wait)
                attempt += 1

    def _wait_for(self, error: LLMUnavailable, attempt: int) -> float | None:
        """How long to wait before the next attempt, or None to stop retrying now."""
        if error.retry_after is not None:
            if error.retry_after > self.retry_after_max:
                return None  # the queue reschedules the job; a worker should not sleep minutes
            return error.retry_after
        return self.backoff(attempt)

    def _once(self, body: dict[str, Any]) -> Completion:
        return self._read(self._post(body))

    def _post(self, body: dict[str, Any], stream: bool = False) -> requests.Response:
        """POST the request; failures to reach the server as LLMUnavailable, in plain words."""
        try:
            return self._session.post(self.url, data=json.dumps(body), headers=self._headers(),
                                      timeout=self.timeout, stream=stream)
        except requests.exceptions.ConnectTimeout:
            raise LLMUnavailable(f"Could not connect to the model server at {self.safe_url} within "
                                 f"{self.timeout[0]:g} s. Is it running? (setting llm_url)") from None
        except requests.exceptions.ReadTimeout:
            raise LLMUnavailable(f"The model server at {self.safe_url} did not answer within "
                                 f"{self.timeout[1]:g} s (setting llm_read_timeout).", reached=True) from None
        except requests.exceptions.ConnectionError:
            raise LLMUnavailable(f"Could not connect to the model server at {self.safe_url}. "
                                 "Is it running and is the URL right? (setting llm_url)") from None
        except requests.exceptions.RequestException as e:
            raise LLMUnavailable(f"The request to {self.safe_url} failed: {type(e).__name__}") from None

    def _said(self, response: requests.Response) -> str:
        """The server's error text with our key blanked out (some servers echo what they got)."""
        text = _server_message(response)
        return text.replace(self._key, "[key]") if self._key else text

    def _read(self, response: requests.Response) -> Completion:
        status = response.status_code
        if status == 429:
            wait = _retry_after(response)
            hint = f"; it asks to wait {wait:.0f} s" if wait is not None else ""
            raise LLMRateLimited(f"The model server at {self.safe_url} is rate limiting us (429){hint}: "
                                 f"{self._said(response)}", wait)
        if status >= 500 or status in RETRYABLE_4XX:
            # A 503 with Retry-After is common while a local server loads its model.
            raise LLMUnavailable(f"The model server at {self.safe_url} failed with HTTP {status}: "
                                 f"{self._said(response)}", _retry_after(response))
        if status >= 400:
            hint = _REJECTED_HINTS.get(status, "the server did not accept the request")
            raise LLMRejected(f"HTTP {status} from {self.safe_url}: {hint}. Server said: "
                              f"{self._said(response)}", status)
        if status != 200:
            raise LLMBadResponse(f"Unexpected HTTP {status} from {self.safe_url}.")
        return _completion_from(response, self.safe_url)

    def stream_full(self, messages: list[dict[str, Any]], *, max_tokens: int, temperature: float = 0.0,
                    response_format: dict[str, Any] | None = None, stop_repeats: int = 0,
                    frequency_penalty: float | None = None) -> Completion:
        """One completion read as a stream (`"stream": true`): the read timeout counts silence,
        not length, so a slow local model is not cut off while it writes. Reading stops at
        `max_tokens` pieces (finish_reason `length`) even if the server goes on, and, with
        `stop_repeats`, when the answer ends with the same words that many times in a row
        (finish_reason `repeat`: a stuck model). No retries here: the caller decides (a job
        tries at most twice)."""
        body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": int(max_tokens),
                                "temperature": temperature, "stream": True}
        if response_format is not None:
            body["response_format"] = response_format
        if frequency_penalty is not None:
            body["frequency_penalty"] = frequency_penalty
        try:
            response = self._post(body, stream=True)
        except LLMUnavailable as e:
            if e.reached:  # a read timeout before the first byte: the model got the prompt
                raise LLMUnavailable(f"The model server at {self.safe_url} did not start answering within "
                                     f"{self.timeout[1]:g} s (setting llm_read_timeout).", reached=True) from None
            raise
        with response:
            if response.status_code != 200 or "event-stream" not in response.headers.get("Content-Type", ""):
                return self._read(response)  # an error, or a server that does not stream
            return self._read_stream(response, max_tokens, stop_repeats)

    def _read_stream(self, response: requests.Response, max_tokens: int, stop_repeats: int = 0) -> Completion:
        parts: list[str] = []
        finish, model, usage, pieces, tail = None, None, None, 0, ""
        try:
            for line in response.iter_lines(decode_unicode=True):
                if not line or not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    chunk = json.loads(data)
                except ValueError:
                    continue
                model = chunk.get("model") or model
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    if isinstance(delta.get("content"), str) and delta["content"]:
                        parts.append(delta["content"])
                        pieces += 1
                        tail = (tail + delta["content"])[-REPEAT_TAIL_CHARS:]
                    finish = choice.get("finish_reason") or finish
                if pieces > max_tokens:
                    finish = "length"  # the server did not stop at max_tokens: we do
                    break
                if stop_repeats > 1 and pieces % REPEAT_CHECK_PIECES == 0 and repeats(tail, stop_repeats):
                    finish = "repeat"
                    break
        except (requests.exceptions.ConnectionError, requests.exceptions.Timeout):
            raise LLMUnavailable(f"The model server at {self.safe_url} went silent for "
                                 f"{self.timeout[1]:g} s while answering (setting llm_read_timeout).",
                                 reached=True) from None
        text = "".join(parts)
        if not text.strip():
            raise LLMBadResponse(f"{self.safe_url} answered with an empty completion.")
        return Completion(text, finish, model, usage)

    def list_models(self) -> list[str]:
        """Model ids the server offers (GET …/models), for a settings screen or a health check."""
        url = self.url[: -len("/chat/completions")] + "/models"
        try:
            response = self._session.get(url, headers=self._headers(), timeout=self.timeout)
        except requests.exceptions.RequestException:
            raise LLMUnavailable(f"Could not reach {redact(url)}.") from None
        if response.status_code != 200:
            raise LLMRejected(f"HTTP {response.status_code} from {redact(url)}: "
                              f"{self._said(response)}", response.status_code)
        try:
            return [str(m["id"]) for m in response.json().get("data", [])]
        except (ValueError, AttributeError, KeyError, TypeError):
            raise LLMBadResponse(f"{redact(url)} did not answer with a model list.") from None


# A stuck model repeats a sentence or more (seen: an 85-character one, for 3,400 tokens); shorter
# runs ("No. No. No.", a laugh) are left alone. The tail is checked every few pieces.
REPEAT_MIN_CHARS = 30
REPEAT_MAX_CHARS = 400
REPEAT_CHECK_PIECES = 16
REPEAT_TAIL_CHARS = REPEAT_MAX_CHARS * 8


def repeats(text: str, times: int) -> bool:
    """Whether `text` ends with the same run of REPEAT_MIN_CHARS to REPEAT_MAX_CHARS characters
    `times` times in a row."""
    for size in range(REPEAT_MIN_CHARS, min(REPEAT_MAX_CHARS, len(text) // times) + 1):
        last = text[-size:]
        if all(text[-(k + 1) * size: -k * size] == last for k in range(1, times)):
            return True
    return False


def _completion_from(response: requests.Response, where: str) -> Completion:
    try:
        body = response.json()
    except ValueError:
        kind = response.headers.get("Content-Type", "unknown content")
        raise LLMBadResponse(f"{where} answered with {kind}, not JSON: is this the OpenAI-compatible "
                             "endpoint? (setting llm_url)", retryable=False) from None
    try:
        choice = body["choices"][0]
        content = choice["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise LLMBadResponse(f"{where} answered JSON without choices[0].message.content; "
                             "is this a chat-completions endpoint?", retryable=False) from None
    if isinstance(content, list):  # some servers answer in content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not isinstance(content, str) or not content.strip():
        raise LLMBadResponse(f"{where} answered with an empty completion.")
    return Completion(content, choice.get("finish_reason"), body.get("model"), body.get("usage"))


MODES = ("extractive", "openai", "client")


def make_backend(settings: Settings, **options: Any) -> Backend | None:
    """The backend for `settings.llm_mode`: an OpenAICompatible for `openai` (llm_url, llm_model,
    llm_key and the llm_* timeouts and retry settings; `options` replace any of its arguments, e.g.
    a shorter timeout for a waiting person), None for `extractive` (run_prompt then builds results
    without a model). `client` has no server-side backend: the job queue hands the prompt to the
    extension instead, so asking for one is an error."""
    mode = settings.llm_mode
    if mode == "openai":
        call = {"timeout": (settings.llm_connect_timeout, settings.llm_read_timeout),
                "retries": settings.llm_retries, "backoff_base": settings.llm_backoff_base,
                "backoff_max": settings.llm_backoff_max, "retry_after_max": settings.llm_retry_after_max}
        return OpenAICompatible(settings.llm_url, settings.llm_model, settings.llm_key or None,
                                **{**call, **options})
    if mode == "extractive":
        return None
    if mode == "client":
        raise LLMConfigError("In client mode the SillyTavern extension runs the jobs; the sidecar "
                             "calls no model itself")
    raise LLMConfigError(f"Unknown LLM mode {mode!r} (setting llm_mode): use one of {', '.join(MODES)}")


def backend_from_settings(settings: Settings, **options: Any) -> Backend | None:
    """The backend a background job uses: `make_backend`'s, and None in client mode too."""
    if settings.llm_mode == "client":
        return None
    return make_backend(settings, **options)


def run_prompt(prompt: Prompt, backend: Backend | None, *, json_mode: str = "off",
               temperature: float = 0.0) -> Any:
    """Run one task: through `backend` then the task's strict parser, or its extractive fallback
    when `backend` is None.

    Raises LLMError (the call failed) or PromptParseError (the answer was malformed); either way
    nothing has been stored, and the job may be retried.
    """
    task = task_of(prompt)
    if backend is None:
        return task.fallback(prompt, None)
    kwargs = {"max_tokens": prompt.max_tokens, "temperature": temperature,
              "response_format": prompt.response_format(json_mode)}
    finish = None
    if isinstance(backend, OpenAICompatible):
        completion = backend.complete_full(prompt.messages, **kwargs)
        text, finish = completion.text, completion.finish_reason
    else:
        text = backend.complete(prompt.messages, **kwargs)
    try:
        return task.parse_answer(prompt, text)
    except PromptParseError as e:
        if finish == "length":  # say why the JSON is broken: the same call would break it again
            raise LLMBadResponse(
                f"The model's answer was cut off at max_tokens={prompt.max_tokens} "
                f"(finish_reason=length), so it could not be parsed: {e}", retryable=False) from e
        raise
