"""Sheets grow with play (SW1): when a session ends, a named speaker the cast does not know yet
and who spoke at least `sheet_draft_min_lines` times gets a minimal sheet — its name, where it
first appeared, and a few of its lines verbatim (SW8). No model is needed (the job runs in every
LLM mode); the sheet is written as a background job's, so a person's later edits are protected
and the fields stay open to a model's later, fuller draft.
"""

from __future__ import annotations

import re
from typing import Any

from . import characters, sessions
from ..jobs import queue
from ..store.db import Connection, loads
from ..services import Services

KIND = "sheet_drafts"
QUOTE_MAX_CHARS = 200
_SENTENCE_END = re.compile(r"(?<=[.!?…])\s")


def character_id_for(name: str) -> str:
    """The id of a cast member without a card (API.md: a slug): 'Old Tom' -> 'old-tom'."""
    return re.sub(r"[^\w]+", "-", name.casefold()).strip("-") or "unnamed"


def _known_names(conn: Connection) -> tuple[set[str], set[str]]:
    """Ids and case-folded names and aliases of the whole cast."""
    ids, names = set(), set()
    for row in conn.execute("SELECT id, name, aliases FROM characters"):
        ids.add(row["id"])
        names.add(row["name"].casefold())
        names.update(a.casefold() for a in loads(row["aliases"]))
    return ids, names


def _line(text: str) -> str:
    """A verbatim line: the message's opening sentences, up to QUOTE_MAX_CHARS, cut at a
    sentence end when one is near (a prefix of what was said, never a paraphrase)."""
    text = " ".join(text.split())
    if len(text) <= QUOTE_MAX_CHARS:
        return text
    cut = text[:QUOTE_MAX_CHARS]
    ends = [m.start() for m in _SENTENCE_END.finditer(cut)]
    return cut[:ends[-1]] if ends else cut.rsplit(" ", 1)[0] + "…"


def new_speakers(conn: Connection, chat_id: str, n: int, min_lines: int) -> dict[str, list[Any]]:
    """The session's speakers (by name, in order of first appearance) nobody in the cast is,
    with their messages; only those with at least `min_lines` messages."""
    ids, names = _known_names(conn)
    spoken: dict[str, list[Any]] = {}
    for row in conn.execute("SELECT * FROM messages WHERE chat_id=? AND session_n=? AND"
                            " role='assistant' ORDER BY position, seq", (chat_id, n)):
        name = " ".join((row["name"] or "").split())
        if not name or name.casefold() in names or (row["speaker_id"] or "") in ids:
            continue
        spoken.setdefault(name, []).append(row)
    return {k: v for k, v in spoken.items() if len(v) >= min_lines}


@sessions.on_session_end
def _queue(svc: Services, conn: Connection, chat_id: str, n: int) -> int:
    queue.enqueue(svc, KIND, chat_id=chat_id, ref=str(n), target={"n": n})
    return 1


def _apply(svc: Services, conn: Connection, job: queue.Job, result: Any, prepared: Any) -> dict[str, Any]:
    """Draft a minimal sheet for each new speaker of the ended session."""
    n = int(job.target["n"])
    chat = conn.execute("SELECT title FROM chats WHERE id=?", (job.chat_id,)).fetchone()
    where = chat["title"] if chat is not None and chat["title"] else job.chat_id
    drafted = []
    speakers = new_speakers(conn, job.chat_id, n, int(svc.settings.sheet_draft_min_lines))
    for name, rows in speakers.items():
        character_id = character_id_for(name)
        if characters.fetch(conn, character_id) is not None:
            continue  # a character of that id exists: a model's update, not a draft
        quotes = [f'"{_line(r["text"])}"' for r in rows[: int(svc.settings.sheet_draft_quotes)]]
        fields = {"first_appearance": f"Session {n} of {where}, {rows[0]['sent_at'][:10]}",
                  "quotes": "\n".join(quotes)}
        characters.update_sheet(svc, character_id, fields, actor="background", name=name)
        drafted.append(character_id)
    return {"drafted": drafted}


queue.register(KIND, _apply, llm=False)
