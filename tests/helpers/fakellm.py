"""A small OpenAI-compatible model server for tests: the only stand-in we allow (for the paid LLM).

It is a real HTTP server on loopback. It answers `GET /v1/models` and `POST /v1/chat/completions`
(plain JSON, or SSE chunks when the request asks for `"stream": true`), deterministically, and
records every request it received so a test can read the exact prompt that reached "the model".
It also answers `POST /v1/embeddings` (as Ollama, llama.cpp and OpenAI do) with hashed bag-of-words
vectors of `EMBED_DIM` dimensions (`embed_vector`): texts that share words are near, so search
over them means something, and every answer is the same for the same text.

Control, from the same process (`FakeLLM` object) or over HTTP when run as a script:
- `script(replies)`: the next completions answer these texts in order (then the default again);
- `script_tool_calls(calls)`: the next completion offering tools asks to call them instead of answering text
  (`calls`: `[{"name": ..., "arguments": {...}}]`), as an OpenAI model with function calling does;
- `fail_next(n, status, retry_after=None)`: the next n completions fail with that HTTP status
  (and a `Retry-After` header when `retry_after` is given);
- `garbage_next(n)`: the next n completions answer text that no strict parser accepts;
- `delay`: seconds to wait before answering (for timeout tests);
- `chunk_delay`: seconds between the chunks of a streamed answer (a slow model that writes);
- `usage`: the `usage` a plain JSON answer reports (zeros by default; streamed answers report none);
- `responder`: a function(request_body) -> reply text, replacing the default;
- `embeddings_down`: while True, `/v1/embeddings` answers 503 (an endpoint that is down);
  `embedded` counts the texts it embedded.
HTTP control: `GET /_fake/requests`, `POST /_fake/reset`, `POST /_fake/script {"replies": [...]}`,
`POST /_fake/tool_calls {"calls": [{"name": ..., "arguments": {...}}]}`,
`POST /_fake/fail {"n": 1, "status": 500, "retry_after": 2}`, `POST /_fake/garbage {"n": 1}`, `POST /_fake/delay {"seconds": 2}`.

Run alone: `python tests/helpers/fakellm.py --port 5001` (prints its base URL, ending in /v1).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

MODEL_ID = "fake-model"
EMBED_DIM = 256  # another size than the packaged model's 384: a switch resizes the vector tables
GARBAGE = "<<garbage: this is not the format you asked for>> {unclosed"


def default_reply(body: dict[str, Any]) -> str:
    """A deterministic reply naming a digest of the prompt, so equal prompts give equal replies."""
    messages = body.get("messages") or []
    last_user = next((m for m in reversed(messages) if m.get("role") == "user"), {})
    content = last_user.get("content")
    if isinstance(content, list):  # multi-part content
        content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    text = str(content or "")
    digest = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()[:8]
    return f"Fake reply {digest} to: {text[:80]}"


def embed_vector(text: str) -> list[float]:
    """A unit vector of the text's words (lower-cased), each hashed to a few dimensions."""
    vector = [0.0] * EMBED_DIM
    for word in "".join(c if c.isalnum() else " " for c in text.lower()).split():
        digest = hashlib.sha256(word.encode()).digest()
        for i in range(3):
            vector[int.from_bytes(digest[2 * i:2 * i + 2], "big") % EMBED_DIM] += 1.0 if digest[10 + i] % 2 else -1.0
    norm = sum(v * v for v in vector) ** 0.5 or 1.0
    return [v / norm for v in vector]


class FakeLLM:
    """The server and its controls. Use as a context manager or call start()/stop()."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.requests: list[dict[str, Any]] = []
        self.responder: Callable[[dict[str, Any]], str] = default_reply
        self.delay = 0.0
        self.chunk_delay = 0.0
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        self.embeddings_down = False
        self.embedded = 0
        self._scripted: deque[str] = deque()
        self._failures: deque[tuple[int, str | None]] = deque()
        self._garbage = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), _make_handler(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # --- lifecycle -------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        """Base URL as OpenAI clients want it (ends with /v1, no trailing slash)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "FakeLLM":
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "FakeLLM":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- controls --------------------------------------------------------------------------
    def script(self, replies: list[str]) -> None:
        with self._lock:
            self._scripted.extend(replies)

    def script_tool_calls(self, calls: list[dict[str, Any]], content: str = "") -> None:
        """The next completion that offers tools answers with these tool calls (name + arguments)
        and `content`."""
        reply = ToolCalls([{"name": c["name"], "arguments": c.get("arguments", {})} for c in calls], content)
        with self._lock:
            self._scripted.append(reply)  # type: ignore[arg-type]

    def fail_next(self, n: int = 1, status: int = 500, retry_after: str | float | None = None) -> None:
        header = None if retry_after is None else str(retry_after)
        with self._lock:
            self._failures.extend([(status, header)] * n)

    def garbage_next(self, n: int = 1) -> None:
        with self._lock:
            self._garbage += n

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self._scripted.clear()
            self._failures.clear()
            self._garbage = 0
            self.delay = 0.0
            self.chunk_delay = 0.0
            self.responder = default_reply

    def completions(self) -> list[dict[str, Any]]:
        """Bodies of the chat-completion requests received so far."""
        return [r["body"] for r in self.requests if r["path"].endswith("/chat/completions")]

    # --- answering -------------------------------------------------------------------------
    def _next_outcome(self, body: dict[str, Any]) -> tuple[int, str, str | None]:
        """(status, reply text, Retry-After header or None)."""
        with self._lock:
            if self._failures:
                status, retry_after = self._failures.popleft()
                return status, "", retry_after
            if self._garbage:
                self._garbage -= 1
                return 200, GARBAGE, None
            # A model only calls tools it was offered: a scripted tool call waits for a request
            # with `tools` (background jobs on the same connection offer none).
            if self._scripted and (not isinstance(self._scripted[0], ToolCalls) or body.get("tools")):
                return 200, self._scripted.popleft(), None
        return 200, self.responder(body), None


class ToolCalls(str):
    """A scripted reply that calls tools: a str (its content) carrying the calls."""

    calls: list[dict[str, Any]]

    def __new__(cls, calls: list[dict[str, Any]], content: str = "") -> "ToolCalls":
        obj = super().__new__(cls, content)
        obj.calls = calls
        return obj

    def openai(self) -> list[dict[str, Any]]:
        """The calls in OpenAI's shape (arguments as a JSON string)."""
        return [{"id": f"call_{i}", "type": "function",
                 "function": {"name": c["name"], "arguments": c["arguments"] if isinstance(c["arguments"], str)
                              else json.dumps(c["arguments"])}}
                for i, c in enumerate(self.calls)]


def _completion(text: str, created: int, usage: dict[str, Any] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": str(text)}
    finish = "stop"
    if isinstance(text, ToolCalls):
        message["tool_calls"] = text.openai()
        finish = "tool_calls"
    return {
        "id": f"chatcmpl-fake-{created}",
        "object": "chat.completion",
        "created": created,
        "model": MODEL_ID,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": dict(usage or {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}),
    }


def _chunks(text: str, created: int) -> list[dict[str, Any]]:
    base = {"id": f"chatcmpl-fake-{created}", "object": "chat.completion.chunk",
            "created": created, "model": MODEL_ID}
    if isinstance(text, ToolCalls):
        calls = [{"index": i, **call} for i, call in enumerate(text.openai())]
        return [
            {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": str(text) or None,
                                                         "tool_calls": calls}, "finish_reason": None}]},
            {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        ]
    words = text.split(" ")
    pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]
    out = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                 "finish_reason": None}]}]
    out += [{**base, "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]}
            for p in pieces]
    out.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    return out


def _make_handler(fake: FakeLLM) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # keep test output clean
            pass

        def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Access-Control-Allow-Origin", "*")
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                return json.loads(raw or b"{}")
            except ValueError:
                return {"_raw": raw.decode("utf-8", "replace")}

        def do_OPTIONS(self) -> None:  # noqa: N802 (http.server naming)
            self.send_response(204)
            self.send_header("Access-Control-Allow-Origin", "*")
            self.send_header("Access-Control-Allow-Headers", "*")
            self.send_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:  # noqa: N802
            if self.path.rstrip("/").endswith("/models"):
                self._send_json(200, {"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]})
            elif self.path == "/_fake/requests":
                self._send_json(200, {"requests": fake.requests})
            else:
                self._send_json(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:  # noqa: N802
            body = self._body()
            if self.path.startswith("/_fake/"):
                self._control(self.path[len("/_fake/"):], body)
                return
            if self.path.rstrip("/").endswith("/embeddings"):
                self._embeddings(body if isinstance(body, dict) else {})
                return
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send_json(404, {"error": {"message": "not found"}})
                return
            fake.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
            # The outcome is decided on arrival: a request still sleeping when its client gave up
            # must not take a failure or script meant for the next test's requests.
            status, text, retry_after = fake._next_outcome(body if isinstance(body, dict) else {})
            if fake.delay:
                time.sleep(fake.delay)
            if status != 200:
                headers = {"Retry-After": retry_after} if retry_after is not None else None
                self._send_json(status, {"error": {"message": f"fake failure {status}"}}, headers)
                return
            created = int(time.time())
            if isinstance(body, dict) and body.get("stream"):
                self._stream(text, created)
            else:
                self._send_json(200, _completion(text, created, fake.usage))

        def _embeddings(self, body: dict[str, Any]) -> None:
            if fake.embeddings_down:
                self._send_json(503, {"error": {"message": "fake embeddings endpoint down"}})
                return
            texts = body.get("input")
            texts = [texts] if isinstance(texts, str) else list(texts or [])
            fake.embedded += len(texts)
            self._send_json(200, {"object": "list", "model": body.get("model"),
                                  "data": [{"object": "embedding", "index": i, "embedding": embed_vector(str(t))}
                                           for i, t in enumerate(texts)]})

        def _stream(self, text: str, created: int) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            for chunk in _chunks(text, created):
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
                if fake.chunk_delay:
                    time.sleep(fake.chunk_delay)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

        def _control(self, verb: str, body: Any) -> None:
            body = body if isinstance(body, dict) else {}
            if verb == "reset":
                fake.reset()
            elif verb == "script":
                fake.script([str(r) for r in body.get("replies", [])])
            elif verb == "tool_calls":
                fake.script_tool_calls(list(body.get("calls", [])), str(body.get("content", "")))
            elif verb == "fail":
                fake.fail_next(int(body.get("n", 1)), int(body.get("status", 500)),
                               body.get("retry_after"))
            elif verb == "garbage":
                fake.garbage_next(int(body.get("n", 1)))
            elif verb == "delay":
                fake.delay = float(body.get("seconds", 0))
            else:
                self._send_json(404, {"error": {"message": f"unknown control {verb}"}})
                return
            self._send_json(200, {"ok": True})

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    fake = FakeLLM(port=args.port).start()
    print(fake.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        fake.stop()


if __name__ == "__main__":
    main()
