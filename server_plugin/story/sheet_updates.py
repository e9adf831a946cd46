"""Sheets grow with play, with a model (rule SW1).

When a session ends, a `sheet_updates` job reads it (its newest messages within
`episodes_prompt_max_tokens`) and
- drafts a sheet for each recurring newcomer: a named speaker no character is (by id, name or
  alias), who spoke in this session and in at least `sheet_newcomer_min_sessions` sessions of the
  chat, or in at least `sheet_newcomer_min_lines` of its messages;
- proposes updates to the sheets of the characters present who learn from chat (RV14): the chat's
  members, the registered speakers, and speakers known by name only (e.g. a character whose
  minimal sheet `sheet_drafts` wrote at an earlier session end).
Fields a person wrote or locked are shown to the model as kept and are never overwritten:
`characters.update_sheet` refuses them whatever the model answers, and the job's result lists
them as refused. Secrets are neither shown nor written (who knows a secret is visibility.py's).

Not queued in extractive mode: without a model nothing is inferred about a character, and the
minimal sheet (name, first appearance, verbatim lines) comes from `sheet_drafts` in every mode.
Not queued either when the chat's memory is off (RV16).
"""

from __future__ import annotations

from typing import Any, Sequence

from . import characters, chats, episodes, messages, sessions
from ..jobs import queue as jobs, prompts
from ..store.db import Connection, loads
from ..services import Services
# Imported first so its session-end job is queued before ours: the minimal sheet is written
# first and our model then fills it in, rather than the other way round.
from .sheet_drafts import character_id_for

KIND = "sheet_updates"


@sessions.on_session_end
def queue(svc: Services, conn: Connection, chat_id: str, n: int) -> int:
    """Queue the session's sheet updates (not in extractive mode, not with memory off: RV16)."""
    if svc.settings.llm_mode == "extractive" or not chats.memory_enabled(conn, chat_id):
        return 0
    jobs.enqueue(svc, KIND, chat_id=chat_id, ref=str(n), target={"n": n})
    return 1


# --- who is who ------------------------------------------------------------------------------
def _speaker(row: Any) -> str:
    return " ".join((row["name"] or "").split())


def _known(conn: Connection) -> tuple[set[str], dict[str, str]]:
    """Every character id, and case-folded names and aliases to an id (first one wins)."""
    ids: set[str] = set()
    names: dict[str, str] = {}
    for row in conn.execute("SELECT id, name, aliases FROM characters ORDER BY created_at, id"):
        ids.add(row["id"])
        for name in [row["name"], *loads(row["aliases"])]:
            names.setdefault(" ".join(name.split()).casefold(), row["id"])
    return ids, names


def newcomers(svc: Services, conn: Connection, chat_id: str, n: int) -> list[prompts.Newcomer]:
    """Named speakers of session n that no character is (by id, name or alias) and who recur:
    in `sheet_newcomer_min_sessions` sessions of the chat or `sheet_newcomer_min_lines` messages."""
    ids, names = _known(conn)
    seen: dict[str, dict[str, Any]] = {}
    for row in conn.execute("SELECT name, speaker_id, session_n FROM messages WHERE chat_id=? AND"
                            " role='assistant' ORDER BY position, seq", (chat_id,)):
        name = _speaker(row)
        if not name or name.casefold() in names or (row["speaker_id"] or "") in ids:
            continue
        entry = seen.setdefault(name, {"lines": 0, "sessions": set()})
        entry["lines"] += 1
        entry["sessions"].add(row["session_n"])
    min_sessions = int(svc.settings.sheet_newcomer_min_sessions)
    min_lines = int(svc.settings.sheet_newcomer_min_lines)
    return [prompts.Newcomer(name, e["lines"], len(e["sessions"])) for name, e in seen.items()
            if n in e["sessions"] and (len(e["sessions"]) >= min_sessions or e["lines"] >= min_lines)]


def present(conn: Connection, chat_id: str, rows: Sequence[Any]) -> list[prompts.CharacterRef]:
    """The cast of these messages: `episodes.cast` (members and registered speakers) plus
    speakers who match a character by name or alias only."""
    cast = episodes.cast(conn, chat_id, rows)
    have = {c.id for c in cast}
    _, names = _known(conn)
    for row in rows:
        character_id = names.get(_speaker(row).casefold())
        if character_id is None or character_id in have:
            continue
        found = characters.fetch(conn, character_id)
        if found is not None:
            cast.append(prompts.CharacterRef(found["id"], found["name"], found["is_player"],
                                             tuple(found["aliases"])))
            have.add(character_id)
    return cast


def newest_within(svc: Services, rows: Sequence[Any]) -> list[Any]:
    """The newest messages whose cost (each capped at `prompt_message_max_tokens`) fits in
    `episodes_prompt_max_tokens`; always at least the newest one."""
    return messages.newest_within(rows, int(svc.settings.episodes_prompt_max_tokens),
                                  int(svc.settings.prompt_message_max_tokens))


def _sheet(character: dict[str, Any]) -> prompts.SheetInput:
    """A sheet as the model sees it: text fields only (never the secrets)."""
    fields = {k: v for k, v in character["sheet"].items() if k != "secrets" and isinstance(v, str)}
    return prompts.SheetInput(character["id"], fields, tuple(sorted(characters.protected_fields(character))))


# --- the job ---------------------------------------------------------------------------------
def _build(svc: Services, job: jobs.Job) -> prompts.Prompt | None:
    conn = svc.db.reader()
    n = int(job.target["n"])
    if not chats.memory_enabled(conn, job.chat_id):
        return None
    rows = newest_within(svc, messages.ordered(conn, job.chat_id, "session_n=?", [n]))
    if not rows:
        return None
    cast = present(conn, job.chat_id, rows)
    sheets = [_sheet(characters.fetch(conn, c.id)) for c in cast
              if characters.learning_enabled(conn, c.id)]
    shown = {_speaker(r) for r in rows}
    found = [x for x in newcomers(svc, conn, job.chat_id, n) if x.name in shown]
    if not sheets and not found:
        return None
    return prompts.sheet_updates([messages.chat_message(svc, r) for r in rows], cast, sheets, found,
                                 max_fields=int(svc.settings.sheet_max_fields),
                                 field_max_chars=int(svc.settings.sheet_field_max_chars))


def _draft_target(conn: Connection, name: str) -> tuple[str | None, str]:
    """Where a newcomer's draft goes: (character id, why not). A character who got that name
    since the prompt was built takes it; otherwise a new character whose id is the name's slug,
    unless another character already holds that id."""
    _, names = _known(conn)
    known = names.get(" ".join(name.split()).casefold())
    if known is not None:
        return known, ""
    character_id = character_id_for(name)
    holder = characters.fetch(conn, character_id)
    if holder is not None:
        return None, f"{name}: the id {character_id} belongs to {holder['name']}"
    return character_id, ""


def _write(svc: Services, conn: Connection, character_id: str, fields: dict[str, str], name: str | None,
           out: dict[str, Any]) -> None:
    """One proposal through `update_sheet` (protected fields refused), unless the character
    does not learn from chat (RV14) or is gone."""
    if not characters.learning_enabled(conn, character_id):
        out["skipped"].append(f"learning off (RV14): {character_id}")
        return
    if name is None and characters.fetch(conn, character_id) is None:
        out["skipped"].append(f"deleted meanwhile: {character_id}")
        return
    created = characters.fetch(conn, character_id) is None
    written = characters.update_sheet(svc, character_id, fields, actor="background", name=name)
    if created:
        out["drafted"].append(character_id)
    if written["applied"]:
        out["updated"][character_id] = written["applied"]
    if written["refused"]:
        out["refused"][character_id] = written["refused"]


def _apply(svc: Services, conn: Connection, job: jobs.Job, result: prompts.SheetProposals,
           prepared: Any) -> dict[str, Any]:
    """Write the proposals as a background job's: a newcomer's draft creates the character (its
    id the slug of its name), an update sets the fields nobody protected; protected fields are
    refused and listed. Returns {drafted, updated: {id: fields}, refused: {id: fields}, skipped}."""
    if not chats.memory_enabled(conn, job.chat_id):
        return {"skipped": "memory is switched off for this chat (RV16)"}
    out: dict[str, Any] = {"drafted": [], "updated": {}, "refused": {}, "skipped": list(result.dropped)}
    for draft in result.drafts:
        character_id, why_not = _draft_target(conn, draft.name)
        if character_id is None:
            out["skipped"].append(why_not)
        else:
            _write(svc, conn, character_id, draft.fields, draft.name, out)
    for update in result.updates:
        _write(svc, conn, update.character_id, update.fields, None, out)
    return out


jobs.register(KIND, _apply, build=_build)
