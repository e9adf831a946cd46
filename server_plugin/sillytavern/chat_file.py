"""`chronicler import-chat`: feed an existing SillyTavern chat file through the normal pipeline.

A SillyTavern chat file is JSON Lines: the first line is the chat's metadata (`user_name`,
`character_name`, `create_date`, `chat_metadata`), then one message per line (`name`, `is_user`,
`is_system`, `send_date`, `mes`, `extra`, `swipes`, `swipe_id`, and in group chats
`original_avatar`). Each message becomes the record the extension would send (sync.js `toRecord`):

- hidden messages (`is_system`) are skipped, as SillyTavern leaves them out of the prompt;
  a narrator message (`extra.type == "narrator"`) is a `system` message;
- only the chosen swipe (`mes`) is imported: the other swipes were never part of the story;
- the id is `extra.chronicler_id` when the extension gave it one, else derived from the line
  and a hash of send_date, name and text (`st<line>-<hash>`), so a rerun finds the same ids;
- `send_date` may be ISO 8601, epoch milliseconds or SillyTavern's "November 29, 2026 4:52pm"
  (local time, as the browser read it); an unreadable one takes the previous message's time;
- the speaker of a reply is `original_avatar` (group chats), else the character given with
  `--character-id`, else "<name>.png" (SillyTavern's usual avatar file name; reported).

The records go through the same domain functions as `POST /v1/chats/{id}/messages` (schema check,
`conversation.ingest`: sessions by gap, compaction, summaries, deep memory), in batches, each batch
one transaction. A rerun skips what is stored, so an interrupted import resumes where it stopped.
Two ways to run it: offline on the data folder (holding its lock; the jobs run here between
batches) or against a running sidecar (`--url`, `--token`; its worker runs the jobs).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, Sequence

from ..clock import to_iso

HUMAN_DATE = re.compile(r"^\s*([A-Za-z]+)\s+(\d{1,2}),\s*(\d{4})\s+(\d{1,2}):(\d{2})\s*([ap]m)\s*$", re.I)
ID_PATTERN = re.compile(r"^[^\u0000-\u001f\u007f/]{1,256}$")  # common.json's id rule


class ChatFileError(ValueError):
    """The file is not a SillyTavern chat (says which line and why)."""


# --- reading the file --------------------------------------------------------------------------
def parse_send_date(value: Any) -> str | None:
    """SillyTavern's send_date in any of its three forms -> our ISO form; None when unreadable."""
    if value is None or value == "" or isinstance(value, bool):
        return None
    try:
        if isinstance(value, (int, float)) or (isinstance(value, str) and value.strip().isdigit()):
            return to_iso(datetime.fromtimestamp(float(value) / 1000, tz=timezone.utc))
        text = str(value).strip()
        match = HUMAN_DATE.match(text)
        if match:
            month, day, year, hour, minute, half = match.groups()
            naive = datetime.strptime(f"{month} {day} {year} {int(hour)}:{minute} {half.upper()}",
                                      "%B %d %Y %I:%M %p")
            return to_iso(naive.astimezone())  # the browser's local time, as JavaScript read it
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        return to_iso(moment if moment.tzinfo else moment.astimezone())
    except (ValueError, OverflowError, OSError):
        return None


@dataclass
class ChatFile:
    """The metadata line and the message lines (with their line numbers, 1-based)."""

    meta: dict[str, Any]
    lines: list[tuple[int, dict[str, Any]]]


def read_chat_file(path: Path) -> ChatFile:
    """Parse a SillyTavern .jsonl chat file (blank lines allowed)."""
    meta: dict[str, Any] | None = None
    lines: list[tuple[int, dict[str, Any]]] = []
    with path.open(encoding="utf-8") as fh:
        for number, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                value = json.loads(raw)
            except ValueError as exc:
                raise ChatFileError(f"{path}:{number}: not JSON ({exc})") from None
            if not isinstance(value, dict):
                raise ChatFileError(f"{path}:{number}: a line must be a JSON object")
            if meta is None:
                if "mes" in value and "chat_metadata" not in value and "user_name" not in value:
                    raise ChatFileError(f"{path}:1: the first line must be the chat's metadata")
                meta = value
            else:
                lines.append((number, value))
    if meta is None:
        raise ChatFileError(f"{path}: the file is empty")
    return ChatFile(meta, lines)


# --- turning it into records -------------------------------------------------------------------
def derived_id(line: int, message: dict[str, Any]) -> str:
    """A stable id for a message the extension never saw: the line and a hash of its content."""
    digest = hashlib.sha256("\u0000".join(
        str(message.get(k, "")) for k in ("send_date", "name", "mes")).encode("utf-8")).hexdigest()
    return f"st{line}-{digest[:12]}"


def message_id(line: int, message: dict[str, Any]) -> str:
    given = (message.get("extra") or {}).get("chronicler_id") if isinstance(message.get("extra"), dict) else None
    return given if isinstance(given, str) and ID_PATTERN.match(given) else derived_id(line, message)


def avatar_guess(name: str) -> str:
    """SillyTavern's usual avatar file name for a card called `name`."""
    cleaned = re.sub(r"[\u0000-\u001f\u007f/]", "", name).strip() or "character"
    return f"{cleaned[:200]}.png"


@dataclass
class Plan:
    """What the import will send: characters to register, the chat's members, the records."""

    chat_id: str
    characters: dict[str, dict[str, Any]]      # id -> PUT body
    members: list[str]
    records: list[dict[str, Any]]
    skipped_hidden: int = 0
    guessed: dict[str, str] = field(default_factory=dict)   # name -> guessed id
    undated: int = 0


def parse_character_ids(values: Sequence[str]) -> tuple[dict[str, str], str | None]:
    """`--character-id` values: "NAME=ID" pairs, or one bare ID for the chat's only character."""
    by_name: dict[str, str] = {}
    bare: str | None = None
    for value in values:
        if "=" in value:
            name, _, cid = value.partition("=")
            by_name[name.strip()] = cid.strip()
        else:
            bare = value.strip()
    return by_name, bare


def plan(chat: ChatFile, chat_id: str, character_ids: Sequence[str] = (),
         user_id: str | None = None) -> Plan:
    """The records of a chat file, as the extension would have sent them (module doc)."""
    by_name, bare = parse_character_ids(character_ids)
    result = Plan(chat_id, {}, [], [])
    if user_id:
        result.characters[user_id] = {"name": str(chat.meta.get("user_name") or "User"), "is_player": True}
    previous = parse_send_date(chat.meta.get("create_date")) or to_iso(datetime(1970, 1, 1, tzinfo=timezone.utc))
    for index, (line, m) in enumerate(chat.lines):
        if m.get("is_system"):
            result.skipped_hidden += 1
            continue
        name = str(m.get("name") or "")[:200]
        sent_at = parse_send_date(m.get("send_date"))
        if sent_at is None:
            result.undated += 1
            sent_at = previous
        previous = sent_at
        extra = m.get("extra") if isinstance(m.get("extra"), dict) else {}
        narrator = extra.get("type") == "narrator"
        record: dict[str, Any] = {
            "id": message_id(line, m),
            "role": "user" if m.get("is_user") else "system" if narrator else "assistant",
            "name": name, "text": str(m.get("mes") or ""), "sent_at": sent_at, "index": index}
        turn = extra.get("chronicler_turn_id")
        if isinstance(turn, str) and ID_PATTERN.match(turn) and record["role"] == "assistant":
            record["turn_id"] = turn
        if record["role"] == "user":
            if user_id:
                record["speaker_id"] = user_id
        elif record["role"] == "assistant":
            speaker = _speaker(m, name, chat.meta, by_name, bare, result)
            record["speaker_id"] = speaker
            result.characters.setdefault(speaker, {"name": name or speaker})
            if speaker not in result.members:
                result.members.append(speaker)
        result.records.append(record)
    return result


def _speaker(m: dict[str, Any], name: str, meta: dict[str, Any], by_name: dict[str, str],
             bare: str | None, result: Plan) -> str:
    if name in by_name:
        return by_name[name]
    avatar = m.get("original_avatar")
    if isinstance(avatar, str) and ID_PATTERN.match(avatar):
        return avatar
    if bare and (name == meta.get("character_name") or not meta.get("character_name")):
        return bare
    guess = avatar_guess(name)
    result.guessed[name] = guess
    return guess


# --- where the records go ----------------------------------------------------------------------
class Sink(Protocol):
    """A store: the local data folder, or a running sidecar over HTTP."""

    def stored_ids(self, chat_id: str) -> set[str]: ...
    def register(self, plan: Plan) -> None: ...
    def ingest(self, chat_id: str, batch: list[dict[str, Any]]) -> dict[str, Any]: ...
    def drain(self) -> int: ...
    def wait_settled(self, timeout: float) -> int: ...


Validate = Callable[[str, Any], None]  # (schema name, payload): raises when it does not match


class LocalSink:
    """The data folder, opened here (the caller holds its lock): the same domain functions as the
    HTTP routes, and the jobs run between batches as the sidecar's worker would run them.

    `validate` checks a record against the routes' schema of that name (the API's schemas: the
    caller hands them in, as nothing below the API imports it)."""

    def __init__(self, svc: Any, validate: Validate) -> None:
        from ..jobs import queue as jobs

        self.svc = svc
        self.validate = validate
        jobs.recover(svc)  # jobs an interrupted run left running go back to the queue

    def stored_ids(self, chat_id: str) -> set[str]:
        from ..story import messages

        return set(messages.ids(self.svc.db.reader(), chat_id))

    def register(self, plan: Plan) -> None:
        from ..story import characters, chats

        for cid, body in plan.characters.items():
            if characters.fetch(self.svc.db.reader(), cid) is None:  # never clobber a person's edits
                self.validate("character_put.request", body)
                characters.put(self.svc, cid, body)
        existing = chats.fetch(self.svc.db.reader(), plan.chat_id)
        members = list(dict.fromkeys((existing or {}).get("member_ids", []) + plan.members))
        if existing is None or members != existing["member_ids"]:
            chats.put(self.svc, plan.chat_id, {"member_ids": members})

    def ingest(self, chat_id: str, batch: list[dict[str, Any]]) -> dict[str, Any]:
        from ..story import conversation

        self.validate("messages_upsert.request", {"messages": batch})
        return conversation.ingest(self.svc, chat_id, batch)

    def drain(self) -> int:
        from ..jobs import worker

        return worker.run_pending(self.svc)

    def wait_settled(self, timeout: float) -> int:
        return self.drain()


class HttpSink:
    """A running sidecar: the same routes the extension uses; its own worker runs the jobs."""

    def __init__(self, url: str, token: str, timeout: float = 300.0, user: str | None = None) -> None:
        import requests

        self.base = url.rstrip("/")
        if not self.base.endswith("/v1"):
            self.base += "/v1"
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {token}"
        if user:  # the store of one SillyTavern user, on the server plugin's sidecar
            self.http.headers["X-Chronicler-User"] = user
        self.timeout = timeout

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        response = self.http.request(method, self.base + path, timeout=self.timeout, **kw)
        if response.status_code >= 400:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text[:300]
            raise SidecarError(f"{method} {path}: {response.status_code}: {message}", response.status_code)
        return response.json()

    @staticmethod
    def _q(value: str) -> str:
        from urllib.parse import quote

        return quote(value, safe="")

    def stored_ids(self, chat_id: str) -> set[str]:
        ids: set[str] = set()
        offset = 0
        while True:
            try:
                page = self._call("GET", f"/chats/{self._q(chat_id)}/messages",
                                  params={"ids_only": "true", "offset": offset})
            except SidecarError as exc:
                if exc.status == 404:
                    return set()
                raise
            ids.update(page["ids"])
            offset += len(page["ids"])
            if not page["ids"] or offset >= page["total"]:
                return ids

    def register(self, plan: Plan) -> None:
        for cid, body in plan.characters.items():
            try:
                self._call("GET", f"/characters/{self._q(cid)}")
            except SidecarError as exc:
                if exc.status != 404:
                    raise
                self._call("PUT", f"/characters/{self._q(cid)}", json=body)
        try:
            existing = self._call("GET", f"/chats/{self._q(plan.chat_id)}")["chat"]["member_ids"]
        except SidecarError as exc:
            if exc.status != 404:
                raise
            existing = None
        members = list(dict.fromkeys((existing or []) + plan.members))
        if existing is None or members != existing:
            self._call("PUT", f"/chats/{self._q(plan.chat_id)}", json={"member_ids": members})

    def ingest(self, chat_id: str, batch: list[dict[str, Any]]) -> dict[str, Any]:
        return self._call("POST", f"/chats/{self._q(chat_id)}/messages", json={"messages": batch})

    def drain(self) -> int:
        return 0  # the sidecar's worker runs them

    def wait_settled(self, timeout: float) -> int:
        """Wait until the sidecar has no pending or running job; returns how many are left."""
        deadline = time.monotonic() + timeout
        while True:
            left = sum(len(self._call("GET", "/jobs", params={"state": s})["jobs"])
                       for s in ("pending", "running"))
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.5)


class SidecarError(Exception):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


# --- the run -----------------------------------------------------------------------------------
@dataclass
class Report:
    total: int
    already: int
    sent: int = 0
    inserted: int = 0
    jobs_run: int = 0
    jobs_left: int = 0
    sessions_ended: int = 0
    seconds: float = 0.0


def run(the_plan: Plan, sink: Sink, batch_size: int = 100, progress: bool = True,
        wait_seconds: float = 600.0, after_batch: Callable[[int], None] | None = None) -> Report:
    """Send what is not stored yet, in batches (each one transaction), draining jobs in between."""
    started = time.monotonic()
    sink.register(the_plan)
    report = Report(total=len(the_plan.records), already=0)
    report.jobs_run += sink.drain()  # what an interrupted run left queued, before going on
    stored = sink.stored_ids(the_plan.chat_id)
    todo = [r for r in the_plan.records if r["id"] not in stored]
    report.already = report.total - len(todo)
    bar = _bar(progress, report.total, report.already)
    try:
        for n, batch in enumerate(_batches(todo, batch_size)):
            outcome = sink.ingest(the_plan.chat_id, batch)
            report.sent += len(batch)
            report.inserted += int(outcome.get("inserted", 0))
            report.sessions_ended += len(outcome.get("sessions_ended", []))
            report.jobs_run += sink.drain()
            if bar is not None:
                bar.update(len(batch))
                bar.set_postfix(jobs=report.jobs_run, refresh=False)
            if after_batch is not None:
                after_batch(n)
    finally:
        if bar is not None:
            bar.close()
    report.jobs_left = sink.wait_settled(wait_seconds)
    report.seconds = time.monotonic() - started
    return report


def _batches(items: list[dict[str, Any]], size: int) -> Iterable[list[dict[str, Any]]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _bar(enabled: bool, total: int, done: int) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=done, unit="msg", desc="import-chat", dynamic_ncols=True)
