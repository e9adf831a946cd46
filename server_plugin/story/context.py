"""The per-turn context (`POST /v1/context`): gather one speaker's candidates, assemble, remember.

`answer()` is one pass, in this order (`prepare()` does steps 1–4 and writes nothing):
1. the request as a `Turn`, the chat (404 if unknown) and its switches (RV16 memory, RV14 learning);
2. the live window of the chat (history, RV2) and, from it and the last action, the texts of the
   `card_scan_min_actions` latest actions: presence (SW1) is decided on those, before any budget;
3. one small function per source, each returning `assemble` types already filtered for the
   speaker (visibility.py decides; nothing here does): client texts, pinned memories (RV11),
   sheets of present characters (SW1), story cards the speaker may know with their per-chat
   statistics (QS5), open campaign notes (SW3), story summary parts (SW2), the memory bank
   (QS8: the RV7 per-turn unpinned set ranked by cosine similarity to the last action, fused with
   hybrid search results for the same action: older memories, character memories, scene and
   session summaries, and messages that left the live window, as the speaker knows them, SW6/SW9b);
4. `assemble()` — every budget rule lives there;
5. `record_turn()` (always by the context call itself, also when it takes the answer assembled
   ahead at a prefetch, ahead.py): the chat remembers `context_tokens` (for the live window of the compaction
   after the turn, RV2); a new turn (not a swipe, a regenerate or a repeated call for the same
   action) counts one use for each card whose triggers fired. Nothing is written when nothing
   changed.

Speed: what is stable between turns is cached — the cast and rendered sheets until a character
changes, the parsed story cards until lore changes (per-table change counters, changes.py),
memory vectors per memory version, token counts in tokens.py, the query vector in embeddings.py.
The one query embedding (the last action) is computed first, in the request's own thread: on two
cores a worker thread running it while the database is read made both slower (the model's own
threads and the GIL contend), 44 ms against 27 ms sequential at p50 in bench/assemble_latency.py.

Owns: context_turns.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields
from typing import Any, Sequence

from ..core.assemble import (
    Assembly,
    Candidates,
    Card,
    CardStats,
    Item,
    LastAction,
    Message,
    Rules,
    assemble,
    resolve_last_action,
    scan_texts,
)
from ..core.triggers import CastMember, TriggerIndex, present_characters
from ..errors import NotFound
from ..hooks import Hooks
from ..jobs.queue import JobKinds
from ..retrieval import bank
from ..retrieval import prefetch as prefetcher
from ..retrieval.visibility import can_see
from ..services import Services
from ..settings import Settings
from ..store import changes
from ..store.db import Connection, loads
from . import (ahead, characters, chats, learned, lore, memories, messages, notes, sessions, sheets,
               summaries)

# The smallest context size a chat records (shared_schema/chat.json): a smaller budget is still
# assembled, but it is no model's real window and must not shrink the chat's live window (RV2).
MIN_REMEMBERED_CONTEXT = 256

# Generation types that re-run the current turn: they never count as a new use of a card.
SAME_TURN_TYPES = frozenset({"swipe", "regenerate", "quiet", "impersonate"})


@dataclass(frozen=True)
class Turn:
    """One `POST /v1/context` request, with its defaults applied."""

    chat_id: str
    speaker_id: str
    context_tokens: int
    last_action: LastAction
    present_ids: tuple[str, ...] = ()
    generation_type: str = "normal"
    memory_bank: bool = True
    instructions: str = ""
    plot_essentials: str = ""
    authors_note: str = ""
    front_memory: str = ""
    history_as_text: bool = False

    @classmethod
    def from_request(cls, data: dict[str, Any]) -> "Turn":
        action = data["last_action"]
        return cls(
            chat_id=data["chat_id"], speaker_id=data["speaker_id"],
            context_tokens=int(data["context_tokens"]),
            last_action=LastAction(action.get("text", ""), action.get("kind", "action"),
                                   action.get("id")),
            present_ids=tuple(data.get("present_ids", ())),
            generation_type=data.get("generation_type", "normal"),
            memory_bank=data.get("memory_bank", True),
            **{k: data.get(k, "") for k in ("instructions", "plot_essentials", "authors_note",
                                            "front_memory")},
            history_as_text=data.get("history_as_text", False),
        )


def rules_from(settings: Settings) -> Rules:
    """The QS numbers from the settings table (same names as `Rules`' fields)."""
    return Rules(**{f.name: getattr(settings, f.name) for f in fields(Rules)})


# --- what is read once per change (changes.py) ----------------------------------------------------

@dataclass(frozen=True)
class Cast:
    """Every character (as `characters.to_dict` gives them) and their names for presence."""

    by_id: dict[str, dict[str, Any]]
    members: tuple[CastMember, ...]


def cast(svc: Services) -> Cast:
    """The whole cast, read once per change of the characters table."""
    def read() -> Cast:
        rows = characters.every(svc.db.reader())
        return Cast({c["id"]: c for c in rows},
                    tuple(CastMember(c["id"], c["name"], tuple(c["aliases"])) for c in rows))

    return svc.cached("context_cast", changes.counter(svc, "characters"), read, size=2)


@dataclass(frozen=True)
class LoreCard:
    card: Card
    known_by: tuple[str, ...] | None
    chat_id: str | None = None  # grown in this chat (SW7): used there only


def all_cards(svc: Services) -> tuple[LoreCard, ...]:
    """Every enabled lore entry as a story card, read once per change of the lore table."""
    def read() -> tuple[LoreCard, ...]:
        out = []
        for r in lore.enabled_rows(svc.db.reader()):
            known = loads(r["known_by"])
            out.append(LoreCard(Card(r["id"], lore.index_text(r["title"], r["text"]),
                                     tuple(loads(r["triggers"])), bool(r["always"]),
                                     lore.matching(loads(r["metadata"]) or {})),
                                None if known is None else tuple(known), r["chat_id"]))
        return tuple(out)

    return svc.cached("context_lore", changes.counter(svc, "lore"), read, size=2)


# --- sources: one small function each ------------------------------------------------------------

def history(svc: Services, chat: dict[str, Any], turn: Turn) -> list[Message]:
    """The chat's live window for this context size (RV2), oldest -> newest."""
    return [Message(m["id"], m["text"], m["role"], m["name"] or "")
            for m in summaries.live_window(svc, chat["id"], turn.context_tokens)]


def character_sheets(svc: Services, the_cast: Cast, present: dict[str, str],
                     viewer_id: str, campaign_id: str | None = None) -> list[Item]:
    """Sheets of the present characters that have one, in presence order, as the speaker may
    read them (secrets filtered by visibility.knows_secret inside sheets.render), with the
    fields learned in this campaign only (CP1, story/learned)."""
    gen = changes.counters(svc, "characters", "chats")
    items = []
    for character_id in present:
        character = the_cast.by_id.get(character_id)
        if character is not None:
            text = svc.cached("context_sheet", (gen, character_id, viewer_id, campaign_id),
                              lambda c=character: sheets.render(
                                  learned.view(svc.db.reader(), c, campaign_id), viewer_id), size=4096)
            items.append(Item(character_id, text))
    return items


def card_index(svc: Services) -> TriggerIndex:
    """Every enabled card's triggers by word, built once per change of the lore table."""
    return svc.cached("context_card_index", changes.counter(svc, "lore"), lambda: TriggerIndex(
        (c.card.id, c.card.triggers, c.card.match) for c in all_cards(svc)), size=2)


def story_cards(svc: Services, viewer_id: str, texts: Sequence[str], chat_ids: Sequence[str] = ()) -> list[Card]:
    """The enabled story cards the speaker may know (SW9b), of every chat or grown in one of
    `chat_ids` (its campaign's chats: grown lore belongs to the campaign, SW7, CP1a), that could
    fire in `texts` (every text any scan window may hold) or need no trigger. The assembler
    decides which fire: this only spares it (and the report) hundreds of cards none of whose
    trigger words occur."""
    campaign = frozenset(chat_ids)

    def visible() -> list[Card]:
        return [c.card for c in all_cards(svc) if can_see(viewer_id, c.known_by)
                and (c.chat_id is None or c.chat_id in campaign)]

    cards = svc.cached("context_cards_for", (changes.counter(svc, "lore"), viewer_id, campaign),
                       visible, size=256)
    candidates = card_index(svc).candidates(texts)
    return [c for c in cards if c.always or c.id in candidates]


def card_stats(conn: Connection, chat_id: str, cards: Sequence[Card]) -> dict[str, CardStats]:
    """QS5's per-chat statistics of these cards: `last_used` is the turn the card last fired in."""
    return {k: CardStats(last_used=float(turn), uses=uses)
            for k, (uses, turn) in lore.chat_stats(conn, chat_id, [c.id for c in cards]).items()}


def campaign_notes(svc: Services, chat_id: str) -> list[Item]:
    """The chat's open campaign notes, most pressing first (SW3)."""
    return [Item(n["id"], n["text"]) for n in notes.open_notes(svc, chat_id)]


def story_summary(svc: Services, chat_id: str, viewer_id: str | None = None) -> list[Item]:
    """The latest full session summary, the 5 previous short ones, then the long-term,
    consolidated and recent summaries (SW2, RV3) of the campaign's chats the viewer witnessed
    (CP1), in sessions.story_summary_parts' order."""
    def read() -> list[Item]:
        return [Item(p["id"], p["text"] or "") for p in sessions.story_summary_parts(svc, chat_id, viewer_id)]
    # Hundreds of sessions' summaries are read again only when one of them (or a campaign) changes.
    key = (chat_id, viewer_id, changes.counters(svc, "summaries", "chats"))
    return list(svc.cached("context_story_summary", key, read, size=8))


def within_reach(items: Sequence[Item], context_tokens: int, counter: Any) -> list[Item]:
    """The story summary's items that any assembly of a `context_tokens` context could show: in
    order, up to the first whose tokens, with those before it, pass twice the context (a section's
    room is part of the context; twice, because a rendered item can count a token or so apart from
    its text). The older ones cannot appear, so they are not candidates: otherwise every turn would
    clean, render, count and list every summary of the campaign (1,663 items, 459,000 tokens at
    30,000 messages, most of the call's time)."""
    total = 0
    for i, item in enumerate(items):
        total += counter.count(item.text)
        if total > 2 * context_tokens:
            return list(items[:i + 1])
    return list(items)


@dataclass(frozen=True)
class SavedMemories:
    pinned: list[Item]
    unpinned: list[dict[str, Any]]  # newest first (RV7)


def saved_memories(svc: Services, chat: dict[str, Any], turn: Turn) -> SavedMemories:
    """The speaker's per-turn set (RV5, RV7, SW9b); none when memory is off (RV16) or the speaker
    does not learn from chat (RV14) — memories.for_turn applies both."""
    if not chat["memory_enabled"]:
        return SavedMemories([], [])
    chosen = memories.for_turn(svc, chat["id"], turn.speaker_id)["memories"]
    return SavedMemories([Item(m["id"], m["text"]) for m in chosen if m["pinned"]],
                         [m for m in chosen if not m["pinned"]])


# --- the turn -------------------------------------------------------------------------------------

def answer(svc: Services, data: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """One turn's context for the speaker (the `POST /v1/context` response), and whether it was
    assembled ahead (ahead.py: the same answer). A dry run (`dry_run`) records nothing and keeps
    its answer for the next call with the same request."""
    turn = Turn.from_request(data)
    box = ahead.of(svc)
    prepared = box.take(turn, lambda: svc.db.generation)
    made_ahead = prepared is not None
    if prepared is None:
        prepared = prepare(svc, turn)
    if data.get("dry_run"):  # recorded by the call that follows with this request, if it takes it
        box.keep(turn, prepared)
        return prepared.result, made_ahead
    box.asked(turn)
    record_turn(svc, prepared.chat, turn, prepared.last, prepared.out)
    return prepared.result, made_ahead


def prefetch(svc: Services, chat_id: str, text: str) -> bool:
    """`POST /v1/context/prefetch`: embed the action ahead and, when the chat has asked for a
    context before, assemble the turn it most likely starts (ahead.py). False when the model is
    not ready (nothing is started)."""
    if not prefetcher.can_prefetch(svc, text):
        return False
    box = ahead.of(svc)
    guess = box.guess(chat_id, text)
    claim = box.start(guess, svc.db.generation) if guess is not None else None
    if claim is None:
        return prefetcher.prefetch(svc, chat_id, text)

    def assemble_ahead(ran: bool) -> None:  # on the prefetch's thread, once its vector is made
        prepared = None
        try:
            if ran:
                prepared = prepare(svc, guess)
        finally:
            box.finish(claim, prepared)

    started = prefetcher.prefetch(svc, chat_id, text, assemble_ahead)
    if not started:
        box.finish(claim, None)
    return started


def prepare(svc: Services, turn: Turn) -> ahead.Prepared:
    """Everything of a turn but what it writes: its answer, as of the store's current generation."""
    generation = svc.db.generation
    rules = rules_from(svc.settings)
    # The one slow step, started first on its own thread (the rest of the turn is read meanwhile):
    # an action's own text is the query (QS8); a Continue's is the model's last output, known
    # once the live window is read.
    action = turn.last_action
    query = (bank.query_vector_soon(svc, action.text, turn.chat_id)
             if turn.memory_bank and action.kind == "action" else None)
    conn = svc.db.reader()
    chat = chats.fetch(conn, turn.chat_id)
    if chat is None:
        raise NotFound("chat_not_found", f"No chat with id {turn.chat_id!r}; register it with "
                       "PUT /v1/chats/{id}.")
    window = history(svc, chat, turn)
    last, _ = resolve_last_action(window, turn.last_action)
    bank_on = turn.memory_bank and chat["memory_enabled"]
    if not bank_on:
        query = None
    elif query is None and last is not None:
        query = bank.query_vector_soon(svc, last.text, turn.chat_id)

    the_cast = cast(svc)
    present = present_characters(the_cast.members,
                                 scan_texts(window, turn.last_action, rules.card_scan_min_actions),
                                 turn.speaker_id, chat["member_ids"], turn.present_ids)
    saved = saved_memories(svc, chat, turn)
    summary = story_summary(svc, chat["id"], turn.speaker_id)
    campaign_chats = chats.same_campaign(conn, chat["id"])
    # What needs no query vector is read before the bank's search waits for it.
    cards = story_cards(svc, turn.speaker_id,
                        [m.text for m in window] + ([last.text] if last is not None else []), campaign_chats)
    sheets_in = character_sheets(svc, the_cast, present, turn.speaker_id, chat["campaign_id"])
    notes_in = campaign_notes(svc, chat["id"])
    stats = card_stats(conn, chat["id"], cards)
    found = (bank.bank_search(
        svc, speaker_id=turn.speaker_id, chat_id=chat["id"], member_ids=chat["member_ids"],
        chat_ids=campaign_chats,
        text=last.text if last is not None else action.text, vector=query,
        live_ids={m.id for m in window}, held_ids={i.id for i in [*summary, *saved.pinned]},
        speaker_names=lambda of_chat, ids: messages.speaker_names(conn, of_chat, ids))
        if query is not None and characters.learning_enabled(conn, turn.speaker_id) else [])
    candidates = Candidates(
        last_action=turn.last_action, messages=window,
        instructions=turn.instructions, plot_essentials=turn.plot_essentials,
        authors_note=turn.authors_note, front_memory=turn.front_memory,
        story_summary=within_reach(summary, turn.context_tokens, svc.tokens),
        pinned_memories=saved.pinned,
        character_sheets=sheets_in,
        campaign_notes=notes_in,
        story_cards=cards,
        card_stats=stats,
        # With the bank off, the per-turn set still goes in, unranked, so the report shows it
        # left out for that reason (`memory_bank_off`).
        memory_bank=bank.memory_bank(svc, query, saved.unpinned, found),
        memory_bank_enabled=bank_on,
    )
    out = assemble(candidates, turn.context_tokens, svc.tokens, rules=rules,
                   history_as_text=turn.history_as_text)
    result = out.to_dict()
    result["report"]["present"] = present
    return ahead.Prepared(generation, chat, last, out, result)


def action_key(turn: Turn, last: Message | None) -> str:
    """What identifies the action a turn answers: its message id, else a hash of its text."""
    if last is not None and last.id:
        return "id:" + last.id
    text = last.text if last is not None else ""
    return "text:" + hashlib.sha1(f"{turn.last_action.kind}\0{text}".encode()).hexdigest()


def record_turn(svc: Services, chat: dict[str, Any], turn: Turn, last: Message | None,
                out: Assembly) -> None:
    """Remember `context_tokens` (RV2) and, on a new turn, count the cards that fired (QS5)."""
    if turn.context_tokens >= MIN_REMEMBERED_CONTEXT:
        chats.remember_context_tokens(svc, chat["id"], turn.context_tokens)  # on change only
    key = action_key(turn, last)
    if turn.generation_type in SAME_TURN_TYPES:
        return
    state = svc.db.reader().execute("SELECT action_key FROM context_turns WHERE chat_id=?",
                                    (chat["id"],)).fetchone()
    if state is not None and state["action_key"] == key:
        return  # the same action asked again: not a new turn
    now = svc.clock.iso()
    # Soft state (statistics): committed without waiting for the disk.
    with svc.db.write(durable=False) as conn:
        row = conn.execute("SELECT turn, action_key FROM context_turns WHERE chat_id=?",
                           (chat["id"],)).fetchone()
        if row is not None and row["action_key"] == key:
            return  # another request counted this action meanwhile
        number = (row["turn"] if row else 0) + 1
        conn.execute("INSERT INTO context_turns(chat_id, turn, action_key, updated_at) VALUES (?,?,?,?)"
                     " ON CONFLICT(chat_id) DO UPDATE SET turn=excluded.turn,"
                     " action_key=excluded.action_key, updated_at=excluded.updated_at",
                     (chat["id"], number, key, now))
        lore.record_fired(conn, chat["id"], list(out.fired_triggers), number, now)


def _forget_chat(svc: Services, conn: Connection, chat_id: str) -> dict[str, int]:
    """A deleted chat takes its card statistics and turn counter with it (a rename moves them:
    conversation.rename_chat rewrites every `chat_id` column)."""
    return {"lore_stats": lore.forget_chat(conn, chat_id),
            "context_turns": conn.execute("DELETE FROM context_turns WHERE chat_id=?",
                                          (chat_id,)).rowcount}


def register(jobs: JobKinds, hooks: Hooks) -> None:
    """A deleted chat's per-turn records go with it."""
    hooks.chat_deleted.connect(_forget_chat)
