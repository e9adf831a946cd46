"""Character sheets (rule SW1): rendered for one viewer, and grown with play.

- **Rendering**: a sheet as text for one viewer — the fields as written, and only the secrets that
  viewer knows (decided by retrieval/visibility).
- **Minimal drafts** (`sheet_drafts` jobs, no model, every LLM mode): when a session ends, a named
  speaker the cast does not know yet and who spoke at least `sheet_draft_min_lines` times gets a
  minimal sheet — its name, where it first appeared, and a few of its lines verbatim (SW8). It is
  written as a background job's, so a person's later edits are protected and the fields stay open
  to a model's later, fuller draft.
- **Updates with a model** (`sheet_updates` jobs): when a session ends, a job reads it (its newest
  messages within `episodes_prompt_max_tokens`) and
  - drafts a sheet for each recurring newcomer: a named speaker no character is (by id, name or
    alias), who spoke in this session and in at least `sheet_newcomer_min_sessions` sessions of
    the chat, or in at least `sheet_newcomer_min_lines` of its messages;
  - proposes updates to the sheets of the characters present who learn from chat (RV14): the
    chat's members, the registered speakers, and speakers known by name only (e.g. a character
    whose minimal sheet a `sheet_drafts` job wrote at an earlier session end).
  Fields a person wrote or locked are shown to the model as kept and are never overwritten:
  `characters.update_sheet` refuses them whatever the model answers, and the job's result lists
  them as refused. Secrets are neither shown nor written (who knows a secret is visibility's).
  Not queued in extractive mode (without a model nothing is inferred about a character), nor
  when the chat's memory is off (RV16).
- **Campaigns** (CP1): what a job writes is learned in the chat's campaign (story/learned): the
  context and the next job's prompt read the campaign's view of a sheet, so a field learned in
  one campaign is not in another's.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Sequence

from ..core.text import fold, sentence_ends
from ..hooks import Hooks
from ..jobs import batch, queue
from ..jobs.queue import JobKinds
from ..jobs.tasks.base import CharacterRef
from ..jobs.tasks.sheets import Newcomer, SheetInput, sheet_updates
from ..retrieval.visibility import knows_secret
from ..services import Services
from ..store.db import Connection
from . import characters, chats, extraction, learned, messages, parts

if TYPE_CHECKING:
    from ..jobs.tasks.base import Prompt
    from ..jobs.tasks.sheets import SheetProposals

SECRETS = "secrets"


def label(field: str) -> str:
    """A sheet field's name as a person reads it: "first_appearance" -> "First appearance"."""
    return field.replace("_", " ").capitalize()


def visible_secrets(character: dict[str, Any], viewer_id: str | None) -> list[str]:
    """The texts of the character's secrets the viewer knows."""
    return [s["text"] for s in character["sheet"].get(SECRETS, [])
            if knows_secret(viewer_id, character["id"], s.get("known_by"))]


def render(character: dict[str, Any], viewer_id: str | None) -> str:
    """The sheet as the viewer may read it: a name line, one line per field, then secrets.

    `viewer_id` None is a person (the panel): every secret shows.
    """
    head = character["name"]
    notes = []
    if character.get("aliases"):
        notes.append("also called " + ", ".join(character["aliases"]))
    if character.get("is_player"):
        notes.append("the player's character")
    lines = [f"{head} ({'; '.join(notes)})" if notes else head]
    for field, value in character["sheet"].items():
        if field != SECRETS and isinstance(value, str) and value.strip():
            lines.append(f"{label(field)}: {value.strip()}")
    secrets = visible_secrets(character, viewer_id)
    if secrets:
        lines.append("Secrets:")
        lines += [f"- {text.strip()}" for text in secrets]
    return "\n".join(lines)


# --- minimal drafts, no model -----------------------------------------------------------------
DRAFTS_KIND = "sheet_drafts"
QUOTE_MAX_CHARS = 200


def character_id_for(name: str) -> str:
    """The id of a cast member without a card (API.md: a slug): 'Old Tom' -> 'old-tom'."""
    return re.sub(r"[^\w]+", "-", name.casefold()).strip("-") or "unnamed"


def _known_names(conn: Connection) -> tuple[set[str], set[str]]:
    """Ids and case-folded names and aliases of the whole cast."""
    ids, names = set(), set()
    for character_id, name, aliases in characters.names(conn):
        ids.add(character_id)
        names.add(name.casefold())
        names.update(a.casefold() for a in aliases)
    return ids, names


def _line(text: str) -> str:
    """A verbatim line: the message's opening sentences, up to QUOTE_MAX_CHARS, cut at a
    sentence end when one is near (a prefix of what was said, never a paraphrase)."""
    text = " ".join(text.split())
    if len(text) <= QUOTE_MAX_CHARS:
        return text
    cut = text[:QUOTE_MAX_CHARS]
    ends = sentence_ends(cut)
    return cut[:ends[-1]] if ends else cut.rsplit(" ", 1)[0] + "…"


def new_speakers(conn: Connection, chat_id: str, n: int, min_lines: int) -> dict[str, list[Any]]:
    """The session's speakers (by name, in order of first appearance) nobody in the cast is,
    with their messages; only those with at least `min_lines` messages."""
    ids, names = _known_names(conn)
    spoken: dict[str, list[Any]] = {}
    for row in messages.ordered(conn, chat_id, "session_n=? AND role='assistant'", [n]):
        name = " ".join((row["name"] or "").split())
        if not name or name.casefold() in names or (row["speaker_id"] or "") in ids:
            continue
        spoken.setdefault(name, []).append(row)
    return {k: v for k, v in spoken.items() if len(v) >= min_lines}


def _queue_drafts(svc: Services, conn: Connection, chat_id: str, n: int) -> int:
    queue.enqueue(svc, DRAFTS_KIND, chat_id=chat_id, ref=str(n), target={"n": n})
    return 1


def _apply_drafts(svc: Services, conn: Connection, job: queue.Job, result: Any, prepared: Any) -> dict[str, Any]:
    """Draft a minimal sheet for each new speaker of the ended session."""
    n = int(job.target["n"])
    where = chats.title(conn, job.chat_id) or job.chat_id
    drafted = []
    speakers = new_speakers(conn, job.chat_id, n, svc.settings.sheet_draft_min_lines)
    for name, rows in speakers.items():
        character_id = character_id_for(name)
        if characters.fetch(conn, character_id) is not None:
            continue  # a character of that id exists: a model's update, not a draft
        quotes = [f'"{_line(r["text"])}"' for r in rows[: svc.settings.sheet_draft_quotes]]
        fields = {"first_appearance": f"Session {n} of {where}, {rows[0]['sent_at'][:10]}",
                  "quotes": "\n".join(quotes)}
        characters.update_sheet(svc, character_id, fields, actor="background", name=name)
        learned.record(svc, conn, character_id, job.chat_id, fields)
        drafted.append(character_id)
    return {"drafted": drafted}


# --- updates with a model ------------------------------------------------------------------------
UPDATES_KIND = "sheet_updates"


def _queue_updates(svc: Services, conn: Connection, chat_id: str, n: int) -> int:
    """Queue the session's sheet updates (not in extractive mode, not with memory off: RV16)."""
    if svc.settings.llm_mode == "extractive" or not chats.memory_enabled(conn, chat_id) or batch.in_parts(svc):
        return 0  # with parts (MJ1) they come with each part (parts.reader in register)
    queue.enqueue(svc, UPDATES_KIND, chat_id=chat_id, ref=str(n), target={"n": n})
    return 1


# --- who is who ------------------------------------------------------------------------------
def _speaker(row: Any) -> str:
    return " ".join((row["name"] or "").split())


def _known(conn: Connection) -> tuple[set[str], dict[str, str]]:
    """Every character id, and case-folded names and aliases to an id (first one wins)."""
    ids: set[str] = set()
    names: dict[str, str] = {}
    for character_id, name, aliases in characters.names(conn):
        ids.add(character_id)
        for each in [name, *aliases]:
            names.setdefault(fold(each), character_id)
    return ids, names


def newcomers(svc: Services, conn: Connection, chat_id: str, n: int) -> list[Newcomer]:
    """Named speakers of session n that no character is (by id, name or alias) and who recur:
    in `sheet_newcomer_min_sessions` sessions of the chat or `sheet_newcomer_min_lines` messages."""
    ids, names = _known(conn)
    seen: dict[str, dict[str, Any]] = {}
    for row in messages.reply_speakers(conn, chat_id):
        name = _speaker(row)
        if not name or name.casefold() in names or (row["speaker_id"] or "") in ids:
            continue
        entry = seen.setdefault(name, {"lines": 0, "sessions": set()})
        entry["lines"] += 1
        entry["sessions"].add(row["session_n"])
    min_sessions = svc.settings.sheet_newcomer_min_sessions
    min_lines = svc.settings.sheet_newcomer_min_lines
    return [Newcomer(name, e["lines"], len(e["sessions"])) for name, e in seen.items()
            if n in e["sessions"] and (len(e["sessions"]) >= min_sessions or e["lines"] >= min_lines)]


def present(conn: Connection, chat_id: str, rows: Sequence[Any]) -> list[CharacterRef]:
    """The cast of these messages: `extraction.cast` (members and registered speakers) plus
    speakers who match a character by name or alias only."""
    cast = extraction.cast(conn, chat_id, rows)
    have = {c.id for c in cast}
    _, names = _known(conn)
    for row in rows:
        character_id = names.get(_speaker(row).casefold())
        if character_id is None or character_id in have:
            continue
        found = characters.fetch(conn, character_id)
        if found is not None:
            cast.append(CharacterRef(found["id"], found["name"], found["is_player"],
                                     tuple(found["aliases"])))
            have.add(character_id)
    return cast


def newest_within(svc: Services, rows: Sequence[Any]) -> list[Any]:
    """The newest messages whose cost (each capped at `prompt_message_max_tokens`) fits in
    `episodes_prompt_max_tokens`; always at least the newest one."""
    return messages.newest_within(rows, svc.settings.episodes_prompt_max_tokens,
                                  svc.settings.prompt_message_max_tokens)


def _sheet(character: dict[str, Any]) -> SheetInput:
    """A sheet as the model sees it: text fields only (never the secrets)."""
    fields = {k: v for k, v in character["sheet"].items() if k != "secrets" and isinstance(v, str)}
    return SheetInput(character["id"], fields, tuple(sorted(characters.protected_fields(character))))


# --- the job ---------------------------------------------------------------------------------
def _build_updates(svc: Services, job: queue.Job) -> Prompt | None:
    conn = svc.db.reader()
    if not chats.memory_enabled(conn, job.chat_id):
        return None
    if "message_ids" in job.target:  # a part (MJ1): it may hold the ends of several sessions
        rows = messages.by_ids(conn, job.chat_id, job.target["message_ids"])
    else:
        rows = newest_within(svc, messages.ordered(conn, job.chat_id, "session_n=?", [int(job.target["n"])]))
    if not rows:
        return None
    cast = present(conn, job.chat_id, rows)
    campaign = chats.campaign_of(conn, job.chat_id)
    sheets = [_sheet(learned.view(conn, characters.fetch(conn, c.id), campaign)) for c in cast  # type: ignore[arg-type]
              if characters.learning_enabled(conn, c.id)]
    shown = {_speaker(r) for r in rows}
    sessions = sorted({r["session_n"] for r in rows if r["session_n"] is not None})
    found = list({x.name: x for n in sessions for x in newcomers(svc, conn, job.chat_id, n)
                  if x.name in shown}.values())
    if not sheets and not found:
        return None
    return sheet_updates([messages.chat_message(svc, r) for r in rows], cast, sheets, found,
                         max_fields=svc.settings.sheet_max_fields,
                         field_max_chars=svc.settings.sheet_field_max_chars)


def _draft_target(conn: Connection, name: str) -> tuple[str | None, str]:
    """Where a newcomer's draft goes: (character id, why not). A character who got that name
    since the prompt was built takes it; otherwise a new character whose id is the name's slug,
    unless another character already holds that id."""
    _, names = _known(conn)
    known = names.get(fold(name))
    if known is not None:
        return known, ""
    character_id = character_id_for(name)
    holder = characters.fetch(conn, character_id)
    if holder is not None:
        return None, f"{name}: the id {character_id} belongs to {holder['name']}"
    return character_id, ""


def _write(svc: Services, conn: Connection, character_id: str, fields: dict[str, str], name: str | None,
           out: dict[str, Any], chat_id: str | None = None) -> None:
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
    learned.record(svc, conn, character_id, chat_id, fields,
                   kept=characters.protected_fields(written["character"]))
    if created:
        out["drafted"].append(character_id)
    if written["applied"]:
        out["updated"][character_id] = written["applied"]
    if written["refused"]:
        out["refused"][character_id] = written["refused"]


def _apply_updates(svc: Services, conn: Connection, job: queue.Job, result: SheetProposals,
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
            _write(svc, conn, character_id, draft.fields, draft.name, out, job.chat_id)
    for update in result.updates:
        _write(svc, conn, update.character_id, update.fields, None, out, job.chat_id)
    return out


def register(jobs: JobKinds, hooks: Hooks) -> None:
    """The session-end sheet jobs. The minimal draft is queued first, so a model's update then
    fills that sheet in rather than the other way round."""
    # A drafted sheet is in the same session's sheet updates prompt: they never run before it.
    jobs.register(DRAFTS_KIND, _apply_drafts, llm=False, feeds=(UPDATES_KIND,))
    jobs.register(UPDATES_KIND, _apply_updates, build=_build_updates)
    hooks.session_ended.connect(_queue_drafts)
    hooks.session_ended.connect(_queue_updates)
    hooks.part_closed.connect(parts.reader(UPDATES_KIND))
    hooks.chat_moved.connect(learned.chat_moved)
    hooks.character_deleted.connect(_character_deleted)


def _character_deleted(svc: Services, conn: Connection, character_id: str) -> dict[str, int]:
    learned.forget_character(conn, character_id)
    return {}
