"""Helpers for the episode and secret tests: a cast of four, chats, ended sessions, and a fake model
that answers each extraction task from the labels its prompt shows (so answers never guess ids)."""

from __future__ import annotations

import json
import re
from typing import Any, Callable

from server_plugin.retrieval import docs as index
from tests.helpers import world
from tests.helpers.api import expect_ok
from tests.helpers.conversation import drain, iso, post
from tests.helpers.world import character

# Compaction and deep memory stay out of the way unless a test asks for them.
# Parts off (MJ1): these tests read each session-end task's own job; tests/test_part_calls.py and
# tests/test_parts.py read them in parts.
QUIET = {"live_window_max_messages": 50, "deep_memory_min_new_messages": 10_000, "part_tokens": 0}

CAST = {"ayla.png": "Ayla", "bren.png": "Bren", "cora.png": "Cora", "kai.png": "Kai"}


def register_cast(api) -> None:
    for character_id, name in CAST.items():
        character(api, character_id, name, is_player=character_id == "kai.png")


def chat(api, chat_id: str, *members: str) -> None:
    world.chat(api, chat_id, members)


def line(message_id: str, speaker_id: str, text: str, minutes: float, **extra: Any) -> dict[str, Any]:
    role = "user" if speaker_id == "kai.png" else "assistant"
    return {"id": message_id, "role": role, "name": CAST[speaker_id], "text": text,
            "sent_at": iso(minutes), "speaker_id": speaker_id,
            **{k: v for k, v in extra.items() if v is not None}}


def end_session(api, chat_id: str) -> dict[str, Any]:
    return expect_ok(api.post(f"/v1/chats/{chat_id}/sessions/end", json={}), 200, "session.response")["session"]


def episodes(api, **params: Any) -> list[dict[str, Any]]:
    qs = "&".join(f"{k}={v}" for k, v in params.items())
    return expect_ok(api.get(f"/v1/episodes?{qs}"), 200, "episodes.response")["episodes"]


def messages_by_id(api, chat_id: str) -> dict[str, dict[str, Any]]:
    page = expect_ok(api.get(f"/v1/chats/{chat_id}/messages"), 200, "messages.response")
    return {m["id"]: m for m in page["messages"]}


def index_entry(services, kind: str, ref: str) -> dict[str, Any] | None:
    """The search index entry of an item (kind, ref) as {known_by, text}, or None."""
    row = services.db.reader().execute("SELECT known_by, text FROM docs WHERE kind=? AND ref_id=?",
                                       (kind, ref)).fetchone()
    return None if row is None else {"known_by": json.loads(row[0]) if row[0] else None, "text": row[1]}


def index_count(services, kind: str) -> int:
    return services.db.reader().execute("SELECT count(*) FROM docs WHERE kind=?", (kind,)).fetchone()[0]


def no_orphans(services) -> None:
    found = index.orphans(services.db.reader())
    assert set(found) >= {"docs_without_fts", "docs_without_vec", "fts_without_doc", "vec_without_doc"}
    assert found == {k: 0 for k in found}, found


def message_seq(services, chat_id: str, message_id: str) -> str:
    return str(services.db.reader().execute("SELECT seq FROM messages WHERE chat_id=? AND id=?",
                                            (chat_id, message_id)).fetchone()[0])


# --- a fake model that reads the labels of the prompt it gets --------------------------------
class Labels:
    """The labels a rendered prompt shows: characters by name, messages by text, secrets by text."""

    def __init__(self, body: dict[str, Any]) -> None:
        user = body["messages"][1]["content"]
        self.system = body["messages"][0]["content"]
        self.user = user
        self.characters = {m.group(2).split(" (")[0].split(",")[0]: m.group(1)
                           for m in re.finditer(r"^(c\d+) = (.+)$", user, re.M)}
        self.messages = [(m.group(1), m.group(2)) for m in re.finditer(
            r"^\[(m\d+)\] [^:\n]+: (.*?)(?=\n\n\[m\d+\]|\n</messages>)", user, re.M | re.S)]
        self.secrets = [(m.group(1), m.group(2)) for m in re.finditer(r"^\[(k\d+)\] (.*)$", user, re.M)]
        self.entries = [(m.group(1), m.group(2)) for m in re.finditer(r"^\[(e\d+)\] (.*)$", user, re.M)]

    def c(self, name: str) -> str:
        return self.characters[name]

    def m(self, containing: str) -> str:
        return next(label for label, text in self.messages if containing in text)

    def k(self, containing: str) -> str:
        return next(label for label, text in self.secrets if containing in text)

    def e(self, containing: str) -> str:
        return next(label for label, text in self.entries if containing in text)


TASKS = {
    "character_memories": "write the memories that characters keep",
    "scene_summaries": "split a stretch of a roleplay chat into scenes",
    "told_events": "reveals one of the listed",
    "session_summary": "finished session",
    "chunk_summary": "summarise a stretch",
    "merge_summaries": "merge consecutive summaries",
    "durable_memories": "file the few facts",
    "sheet_updates": "keep the character sheets",
    "lore_growth": "keep the lore of a roleplay campaign's world",
}
EMPTY = {"character_memories": {"memories": []}, "scene_summaries": {"scenes": []},
         "told_events": {"events": []}, "durable_memories": {"memories": []},
         "session_summary": {"full": "They talked.", "short": "They talked.", "quotes": [],
                             "open_threads": [], "resolved": []},
         "chunk_summary": {"summary": "They talked.", "quotes": []},
         "merge_summaries": {"summary": "They talked.", "keep_quotes": []},
         "sheet_updates": {"new": [], "updates": []}, "lore_growth": {"entries": []}}


SHARED = "do several tasks with it"  # the marker of a shared call (jobs/tasks/parts.py)


def task_of(body: dict[str, Any]) -> str:
    system = body["messages"][0]["content"]
    if SHARED in system:
        return "part_notes"
    return next(task for task, marker in TASKS.items() if marker in system)


def sections_of(system: str) -> dict[str, str]:
    """A shared call's sections: answer key -> the task whose rules that section gives."""
    out = {}
    # Each block of rules opens with the keys it is for (several when their rules are the same).
    for block in re.finditer(r'\n- ((?:"[a-z_0-9]+"(?:, )?)+): (.*?)(?=\n\n- "|\Z)', system, re.DOTALL):
        task = next(task for task, marker in TASKS.items() if marker in block.group(2))
        out.update({key: task for key in re.findall(r'"([a-z_0-9]+)"', block.group(1))})
    return out


class Answers:
    """Per-task answer builders (functions of the prompt's Labels); an empty answer otherwise.
    A shared call is answered section by section, each by its task's builder."""

    def __init__(self) -> None:
        self.builders: dict[str, Callable[[Labels], dict[str, Any]]] = {}
        self.seen: list[str] = []
        self.calls = 0

    def answer(self, task: str, labels: Labels) -> dict[str, Any]:
        self.seen.append(task)
        build = self.builders.get(task)
        return build(labels) if build else EMPTY[task]

    def __call__(self, body: dict[str, Any]) -> str:
        self.calls += 1
        labels = Labels(body)
        if task_of(body) == "part_notes":
            return json.dumps({key: self.answer(task, labels)
                               for key, task in sections_of(labels.system).items()})
        return json.dumps(self.answer(task_of(body), labels))


def told_answer(teller: str, listeners: list[str], secret_words: str, message_words: str,
                evidence: str) -> Callable[[Labels], dict[str, Any]]:
    def build(lb: Labels) -> dict[str, Any]:
        return {"events": [{"teller": lb.c(teller), "listeners": [lb.c(x) for x in listeners],
                            "secret": lb.k(secret_words), "message": lb.m(message_words),
                            "evidence": evidence}]}
    return build


def run_jobs(services) -> int:
    return drain(services)


def post_lines(api, chat_id: str, lines: list[dict[str, Any]]) -> None:
    post(api, lines, chat_id)
