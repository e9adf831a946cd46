"""The per-turn context assembler: candidates + budget + token counter -> blocks + report.

PURE (see ARCHITECTURE.md): it imports only the token counter's module and the stdlib (plus the
pure `triggers` helpers) and is handed everything it needs: no database, no HTTP, no clock.
`context.py` gathers the candidates and calls `assemble()`. Every budget rule lives here, once:

- Required (QS1, QS2): front memory, the last action (the latest model output when the action
  is a Continue), pinned memories (RV11), author's note, plot essentials, instructions, sheets of
  present characters (SW1), open campaign notes (SW3) and the story summary (SW2: the latest full
  session summary, the 5 previous short ones, then the rolling tiers). All in full when they fit.
- The 70% cap (QS3): front memory and last action always in full; pinned memories in full, or,
  if they alone break the cap, newest first as many as fit (flagged `pinned_over_cap`); then, in
  priority order, author's note, plot essentials, instructions, character sheets, campaign notes,
  story summary. The first that does not fit is cut at its end to fit the cap; every section after
  it is dropped (`after_cut`). A multi-item section is cut as one text: its earlier items stay
  whole, the item where the cut falls is truncated, the items after it are dropped.
- Dynamic (QS4): context_tokens minus what Required used; story cards 25%, history 50% (all the
  rest when the memory bank is off), memory bank the rest. What a section leaves unused flows
  down: cards -> history -> memory bank.
- Story cards (QS5, QS6): triggered in the scan window, ranked (see `rank_cards`), added in rank
  order; a card that does not fit is skipped and the next one is tried ("as many as fit").
- History (QS7): the last action is always in (and counted once, under Required); older messages
  are added newest first and the first that does not fit ends the history (it must stay a
  contiguous tail of the chat). Returned as `live_message_ids`; as text only on request.
- Memory bank (QS8): candidates arrive ranked; added in rank order, skipping what does not fit.
- Placement (SW2): each block carries SillyTavern's injection position, depth and role.

Counting: every block is counted as emitted — header, prefixes and separators included — with the
one counter, and `tokens` everywhere is that count. While a section is filled item by item, an
item's cost is the count of its own piece (separator + prefix + text). BPE may merge tokens across
a join (".\n" is one token), so a joined text counts the same or, almost always, less; the block is
recounted as a whole at the end and, in the rare case it counts more than its room, its last items
are removed. Hard invariant: blocks + history + last action never exceed `context_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from .tokens import TokenCounter
from .triggers import ScanWindow, scan_window_size

# QS3's priority order for the Required items that may be cut.
REQUIRED_PRIORITY = (
    "authors_note",
    "plot_essentials",
    "instructions",
    "character_sheets",
    "campaign_notes",
    "story_summary",
)
REQUIRED = ("front_memory", "last_action", "pinned_memories") + REQUIRED_PRIORITY
DYNAMIC = ("story_cards", "history", "memory_bank")
SECTIONS = REQUIRED + DYNAMIC


# --- inputs ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Item:
    """One text the assembler may place: a memory, a sheet, a summary part, a note."""

    id: str
    text: str


@dataclass(frozen=True)
class Message:
    """A chat message of the live window (RV2)."""

    id: str
    text: str
    role: str = "user"  # "user" | "assistant" | "system"
    name: str = ""


@dataclass(frozen=True)
class LastAction:
    """The request's last action. `kind` "continue" means: the model continues its last output."""

    text: str = ""
    kind: str = "action"  # "action" | "continue"
    id: str | None = None


@dataclass(frozen=True)
class Card:
    """A story card (lore entry) as it would be emitted; `always` cards need no trigger."""

    id: str
    text: str
    triggers: tuple[str, ...] = ()
    always: bool = False


@dataclass(frozen=True)
class CardStats:
    """Per-chat use of a card's triggers. `last_used`: any number that grows with time (turn, epoch)."""

    last_used: float = 0.0
    uses: int = 0


@dataclass(frozen=True)
class Candidates:
    """Everything one turn may put in the context, already filtered for the speaker (secrets, RV5)."""

    last_action: LastAction = LastAction()
    messages: Sequence[Message] = ()  # the live window, oldest -> newest
    instructions: str = ""
    plot_essentials: str = ""
    authors_note: str = ""
    front_memory: str = ""
    story_summary: Sequence[Item] = ()  # latest full session summary, 5 short ones, rolling tiers
    pinned_memories: Sequence[Item] = ()  # newest first
    character_sheets: Sequence[Item] = ()  # present characters only, most important first
    campaign_notes: Sequence[Item] = ()  # open threads, most pressing first
    story_cards: Sequence[Card] = ()  # all cards the speaker may see; triggering happens here
    card_stats: Mapping[str, CardStats] = field(default_factory=dict)
    memory_bank: Sequence[Item] = ()  # ranked by relevance to the last action, best first
    memory_bank_enabled: bool = True


@dataclass(frozen=True)
class Rules:
    """The QS numbers. Field names are the settings' names; their values come from there (the
    caller builds them, e.g. story/context.rules_from), so this module holds no second copy."""

    context_required_percent: int
    context_cards_percent: int
    context_history_percent: int  # with the memory bank off, history takes all the rest
    card_scan_min_actions: int
    card_scan_tokens_per_action: int
    card_scan_threshold_tokens: int


@dataclass(frozen=True)
class Placement:
    """Where SillyTavern injects a block (setExtensionPrompt): position, depth, role."""

    position: str  # "before_prompt" | "in_prompt" | "in_chat"
    depth: int = 0
    role: str = "system"  # "system" | "user" | "assistant"


@dataclass(frozen=True)
class Style:
    """How a section's items become one text: `header` line, then items joined by `separator`."""

    header: str = ""
    prefix: str = ""
    separator: str = "\n"


# SW2: models attend best to the start and the end. Standing material goes early (before or in
# the prompt); what matters for the next reply goes in the chat at a low depth (0 = after the
# last message). The history and last-action entries only matter when history is asked as text.
DEFAULT_PLACEMENTS: Mapping[str, Placement] = {
    "instructions": Placement("before_prompt"),
    "plot_essentials": Placement("in_prompt"),
    "character_sheets": Placement("in_prompt"),
    "story_summary": Placement("in_prompt"),
    "story_cards": Placement("in_prompt"),
    "memory_bank": Placement("in_chat", 3),
    "campaign_notes": Placement("in_chat", 2),
    "pinned_memories": Placement("in_chat", 2),
    "authors_note": Placement("in_chat", 1),
    "front_memory": Placement("in_chat", 0),
    "history": Placement("in_chat", 0),
    "last_action": Placement("in_chat", 0, "user"),
}

DEFAULT_STYLES: Mapping[str, Style] = {
    "instructions": Style(),
    "plot_essentials": Style("[Plot essentials]"),
    "story_summary": Style("[Story so far]", separator="\n\n"),
    "authors_note": Style("[Author's note]"),
    "front_memory": Style(),
    "last_action": Style(),
    "pinned_memories": Style("[Pinned memories]", prefix="- "),
    "character_sheets": Style("[Characters present]", separator="\n\n"),
    "campaign_notes": Style("[Open threads]", prefix="- "),
    "story_cards": Style("[World]", separator="\n\n"),
    "history": Style(),
    "memory_bank": Style("[Memories]", prefix="- "),
}


# --- outputs ---------------------------------------------------------------------------------

@dataclass
class Entry:
    """One item in a section report: its id and why it went where it went.

    `tokens`: the item's own text (without header, prefix or separator); for a truncated item,
    what survived of it; for an item left out for lack of room (`no_room`, `pinned_over_cap`),
    its size; 0 for anything else left out. `detail`: e.g. why a card ranked where it did.
    Reasons: included `always_in_full`, `in_full`, `newest_first`, `triggered`, `always`, `fits`;
    truncated `over_required_cap`, `over_context`; dropped `over_required_cap`, `after_cut`,
    `pinned_over_cap`, `no_room`, `not_triggered`, `memory_bank_off`, `duplicate`, `empty`.
    """

    id: str
    reason: str
    tokens: int = 0
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "reason": self.reason, "tokens": self.tokens}
        if self.detail:
            out["detail"] = self.detail
        return out


@dataclass
class SectionReport:
    """Per section: `allocated` (QS4 share; for Required, its size in full), `available`
    (for Dynamic, plus what flowed down; for Required, the room it had), `used` <= available."""

    allocated: int = 0
    available: int = 0
    used: int = 0
    included: list[Entry] = field(default_factory=list)
    truncated: list[Entry] = field(default_factory=list)
    dropped: list[Entry] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "allocated": self.allocated,
            "available": self.available,
            "used": self.used,
            "included": [e.to_dict() for e in self.included],
            "truncated": [e.to_dict() for e in self.truncated],
            "dropped": [e.to_dict() for e in self.dropped],
        }


@dataclass
class Block:
    """One text to inject, with its exact token count and SillyTavern placement."""

    section: str
    text: str
    tokens: int
    position: str
    depth: int
    role: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Assembly:
    """The result: blocks in prompt order, the live message ids, and the report."""

    context_tokens: int
    required_cap: int
    blocks: list[Block] = field(default_factory=list)
    live_message_ids: list[str] = field(default_factory=list)
    sections: dict[str, SectionReport] = field(
        default_factory=lambda: {name: SectionReport() for name in SECTIONS}
    )
    required_used: int = 0
    dynamic_tokens: int = 0
    scan_actions: int = 0
    flags: list[str] = field(default_factory=list)
    fired_triggers: dict[str, list[str]] = field(default_factory=dict)  # card id -> triggers

    @property
    def used(self) -> int:
        """Tokens accounted for: every block, the history and the last action."""
        return sum(report.used for report in self.sections.values())

    def to_dict(self) -> dict[str, Any]:
        """The `POST /v1/context` response shape (plus extra report fields)."""
        return {
            "blocks": [b.to_dict() for b in self.blocks],
            "live_message_ids": list(self.live_message_ids),
            "report": {
                "context_tokens": self.context_tokens,
                "required_cap": self.required_cap,
                "required_used": self.required_used,
                "dynamic_tokens": self.dynamic_tokens,
                "used": self.used,
                "scan_actions": self.scan_actions,
                "flags": list(self.flags),
                "fired_triggers": {k: list(v) for k, v in self.fired_triggers.items()},
                "sections": {name: r.to_dict() for name, r in self.sections.items()},
            },
        }


# --- the last action and the scan window ------------------------------------------------------

def resolve_last_action(
    messages: Sequence[Message], last_action: LastAction
) -> tuple[Message | None, list[Message]]:
    """The last action (QS2) and the other messages (history candidates, oldest -> newest).

    Continue: the newest assistant message. Otherwise: the message with `last_action.id`, or the
    newest message when its text is the action's (or the action has no text). An action found
    nowhere in `messages` is a message of its own (no id in the live window).
    """
    msgs = list(messages)
    index = _last_action_index(msgs, last_action)
    if index is not None:
        return msgs[index], msgs[:index] + msgs[index + 1:]
    if not last_action.text.strip():
        return None, msgs
    role = "assistant" if last_action.kind == "continue" else "user"
    return Message(id=last_action.id or "", text=last_action.text, role=role), msgs


def _last_action_index(msgs: list[Message], last_action: LastAction) -> int | None:
    if last_action.kind == "continue":
        return next((i for i in reversed(range(len(msgs))) if msgs[i].role == "assistant"), None)
    if last_action.id:
        return next((i for i, m in enumerate(msgs) if m.id == last_action.id), None)
    wanted = last_action.text.strip()
    if msgs and (not wanted or msgs[-1].text.strip() == wanted):
        return len(msgs) - 1
    return None


def scan_texts(messages: Sequence[Message], last_action: LastAction, actions: int) -> list[str]:
    """The texts of the `actions` latest actions, newest first (the last action is index 0).

    `context.py` calls it with `card_scan_min_actions` for presence (SW1) before assembling:
    presence cannot wait for the card budget, which depends on the sheets it selects.
    """
    last, history = resolve_last_action(messages, last_action)
    return _window_texts(last, history, actions)


def _window_texts(last: Message | None, history: list[Message], actions: int) -> list[str]:
    texts = ([last.text] if last else []) + [m.text for m in reversed(history)]
    return texts[: max(0, actions)]


# --- story card ranking (QS5) -----------------------------------------------------------------

@dataclass(frozen=True)
class RankedCard:
    """A candidate card: `age` is the index of the newest scan-window text holding one of its
    triggers (0 = the last action), None for an `always` card no trigger named."""

    card: Card
    age: int | None
    triggers: tuple[str, ...]


def rank_cards(
    cards: Sequence[Card], window: ScanWindow, stats: Mapping[str, CardStats]
) -> tuple[list[RankedCard], list[Card]]:
    """Triggered and `always` cards in rank order (QS5), and the cards not triggered.

    Rank: `always` cards first; then how recently a trigger was used — the newest action naming
    it comes first (per-chat `last_used` cannot tell this turn's mentions apart: every card of the
    window fired last turn too); then how often — per-chat `uses`, more first; then `last_used`,
    newer first; then id, so equal cards keep a stable order.
    """
    ranked: list[RankedCard] = []
    idle: list[Card] = []
    for card in cards:
        hits = window.hits(card.triggers)
        if hits or card.always:
            ranked.append(RankedCard(card, min(hits.values()) if hits else None, tuple(hits)))
        else:
            idle.append(card)

    def key(r: RankedCard) -> tuple:
        s = stats.get(r.card.id, CardStats())
        age = r.age if r.age is not None else len(window.texts)
        return (not r.card.always, age, -s.uses, -s.last_used, r.card.id)

    ranked.sort(key=key)
    return ranked, idle


# --- text building ----------------------------------------------------------------------------

def _render(items: Sequence[Item], style: Style) -> tuple[str, list[tuple[int, int]]]:
    """The section text and, per item, the span (start of its prefix, end of its text)."""
    if not items:
        return "", []
    parts = [style.header + "\n"] if style.header else []
    pos = len(parts[0]) if parts else 0
    spans = []
    for i, item in enumerate(items):
        if i:
            parts.append(style.separator)
            pos += len(style.separator)
        piece = style.prefix + item.text
        spans.append((pos, pos + len(piece)))
        parts.append(piece)
        pos += len(piece)
    return "".join(parts), spans


def _clean(items: Sequence[Item]) -> tuple[list[Item], list[Item]]:
    """Items with their text stripped, and the empty ones (never emitted)."""
    kept, empty = [], []
    for item in items:
        text = item.text.strip()
        (kept if text else empty).append(Item(item.id, text))
    return kept, empty


def _fill(
    items: Sequence[Item],
    room: int,
    style: Style,
    counter: TokenCounter,
    *,
    stop_at_first: bool = False,
    reverse_text: bool = False,
) -> tuple[list[Item], list[Item], str, int]:
    """Add items in order while their pieces fit in `room` -> (kept, left out, text, tokens).

    A piece that does not fit is skipped and the next one tried, unless `stop_at_first`.
    `reverse_text` renders the kept items in reverse (history: chosen newest first, read oldest first).
    """
    kept: list[Item] = []
    left: list[Item] = []
    used = 0
    head = counter.count(style.header + "\n") if style.header else 0
    for item in items:
        if left and stop_at_first:
            left.append(item)
            continue
        piece = (style.separator if kept else "") + style.prefix + item.text
        cost = counter.count(piece) + (0 if kept else head)
        if used + cost <= room:
            kept.append(item)
            used += cost
        else:
            left.append(item)

    def joined() -> tuple[str, int]:
        text = _render(kept[::-1] if reverse_text else kept, style)[0]
        return text, counter.count(text)

    text, tokens = joined()
    while tokens > room:  # the joined text counted more than its pieces (rare): drop the last
        left.insert(0, kept.pop())
        text, tokens = joined()
    return kept, left, text, tokens


@dataclass
class _Cut:
    whole: list[Item]  # items kept in full
    truncated: Item | None  # the item the cut fell in, if some of its own text survived
    survived: str  # that surviving text
    rest: list[Item]  # the items after the cut (the first is the cut one when nothing survived)
    text: str
    tokens: int


def _cut(items: Sequence[Item], style: Style, room: int, counter: TokenCounter) -> _Cut:
    """Cut a section at its end to fit `room` (QS3): the section is cut as one text, its
    beginning kept. A cut that keeps only a header, separator or prefix keeps nothing of that item."""
    full, spans = _render(items, style)
    prefix = counter.truncate(full, room)
    whole = [item for item, (_, end) in zip(items, spans) if end <= len(prefix)]
    n = len(whole)
    if n == len(items):
        return _Cut(whole, None, "", [], full, counter.count(full))
    start = spans[n][0] + len(style.prefix)
    if len(prefix) > start:
        text, truncated, survived = prefix, items[n], prefix[start:]
    else:  # the cut fell in a header, separator or prefix: end at the last whole item
        text, truncated, survived = (full[: spans[n - 1][1]] if n else ""), None, ""
    tokens = counter.count(text)
    if tokens > room:  # a shorter string counted more (never seen; stay safe)
        text = counter.truncate(text, room)
        tokens = counter.count(text)
    rest = list(items[n + (1 if truncated else 0):])
    return _Cut(whole, truncated, survived, rest, text, tokens)


# --- the assembler ----------------------------------------------------------------------------

class _Run:
    """One assembly: the counter, styles and the result being built."""

    def __init__(self, counter: TokenCounter, styles: Mapping[str, Style], out: Assembly) -> None:
        self.counter = counter
        self.styles = {**DEFAULT_STYLES, **styles}
        self.out = out
        self.texts: dict[str, str] = {}

    def report(self, section: str) -> SectionReport:
        return self.out.sections[section]

    def entries(self, section: str, kind: str, items: Sequence[Item], reason: str,
                counted: bool = True) -> None:
        """Record items in a report list, each with its own tokens (as a piece of the block)."""
        target = getattr(self.report(section), kind)
        for item in items:
            tokens = self.counter.count(item.text) if counted else 0
            target.append(Entry(item.id, reason, tokens))

    # Required ---------------------------------------------------------------------------------

    def fixed(self, section: str, item: Item | None, room: int) -> int:
        """Front memory and last action: in full whatever the cap; only the context bounds them."""
        if item is None:
            return 0
        report = self.report(section)
        text = _render([item], self.styles[section])[0] if section != "last_action" else item.text
        tokens = self.counter.count(text)
        report.allocated, report.available = tokens, room
        if tokens <= room:
            report.included.append(Entry(item.id, "always_in_full", tokens))
        else:
            text = self.counter.truncate(text, room)
            tokens = self.counter.count(text)
            report.truncated.append(Entry(item.id, "over_context", tokens))
            self.out.flags.append(f"{section}_over_context")
        report.used = tokens
        self.texts[section] = text
        return tokens

    def pinned(self, items: Sequence[Item], room: int) -> int:
        """RV11: pinned memories in full; if they alone break the cap, newest first as many as fit."""
        report = self.report("pinned_memories")
        style = self.styles["pinned_memories"]
        full = _render(items, style)[0]
        report.allocated, report.available = self.counter.count(full), room
        if report.allocated <= room:
            kept, left, text, tokens = list(items), [], full, report.allocated
            reason = "in_full"
        else:
            self.out.flags.append("pinned_over_cap")
            kept, left, text, tokens = _fill(items, room, style, self.counter)
            reason = "newest_first"
        self.entries("pinned_memories", "included", kept, reason)
        self.entries("pinned_memories", "dropped", left, "pinned_over_cap")
        report.used = tokens
        self.texts["pinned_memories"] = text
        return tokens

    def prioritised(
        self, section: str, items: Sequence[Item], room: int, after_cut: bool
    ) -> tuple[int, bool]:
        """One QS3 priority section: in full, cut at its end (the first that does not fit), or
        dropped after the cut. Returns (tokens used, whether the cut has happened)."""
        report = self.report(section)
        if not items:
            return 0, after_cut
        style = self.styles[section]
        full = _render(items, style)[0]
        report.allocated, report.available = self.counter.count(full), max(0, room)
        if after_cut:
            self.entries(section, "dropped", items, "after_cut", counted=False)
            return 0, True
        if report.allocated <= room:
            self.entries(section, "included", items, "in_full")
            report.used, self.texts[section] = report.allocated, full
            return report.used, False
        cut = _cut(items, style, max(0, room), self.counter)
        self.entries(section, "included", cut.whole, "in_full")
        rest = cut.rest
        if cut.truncated is not None:
            survived = self.counter.count(cut.survived)
            report.truncated.append(Entry(cut.truncated.id, "over_required_cap", survived))
        elif rest:  # nothing of the item at the cut survived
            report.dropped.append(Entry(rest.pop(0).id, "over_required_cap"))
        self.entries(section, "dropped", rest, "after_cut", counted=False)
        report.used, self.texts[section] = cut.tokens, cut.text
        return cut.tokens, True

    def required(self, c: Candidates, last: Message | None) -> int:
        """QS2/QS3: place the Required items; returns the tokens they use."""
        ctx, cap = self.out.context_tokens, self.out.required_cap
        last_item = Item(last.id or "last_action", last.text) if last else None
        front = _clean([Item("front_memory", c.front_memory)])[0]
        used = self.fixed("last_action", last_item, ctx)
        used += self.fixed("front_memory", front[0] if front else None, ctx - used)
        pinned, empty = _clean(c.pinned_memories)
        self.entries("pinned_memories", "dropped", empty, "empty", counted=False)
        if pinned:
            used += self.pinned(pinned, max(0, cap - used))
        cut = False
        for section in REQUIRED_PRIORITY:
            items, empty = _clean(_section_items(c, section))
            self.entries(section, "dropped", empty, "empty", counted=False)
            tokens, cut = self.prioritised(section, items, cap - used, cut)
            used += tokens
        if sum(self.report(name).allocated for name in REQUIRED) > cap:
            self.out.flags.append("required_over_cap")
        return used

    # Dynamic ----------------------------------------------------------------------------------

    def cards(self, c: Candidates, last: Message | None, history: list[Message],
              rules: Rules, room: int) -> int:
        """QS5/QS6: triggered cards in rank order, as many as fit in `room`."""
        report = self.report("story_cards")
        self.out.scan_actions = scan_window_size(
            room, rules.card_scan_min_actions, rules.card_scan_tokens_per_action,
            rules.card_scan_threshold_tokens)
        window = ScanWindow(_window_texts(last, history, self.out.scan_actions))
        ranked, idle = rank_cards(c.story_cards, window, c.card_stats)
        self.out.fired_triggers = {r.card.id: list(r.triggers) for r in ranked if r.triggers}
        items, empty = _clean([Item(r.card.id, r.card.text) for r in ranked])
        kept, left, text, tokens = _fill(items, room, self.styles["story_cards"], self.counter)
        by_id = {r.card.id: r for r in ranked}
        for item in kept:
            r = by_id[item.id]
            detail = _card_detail(r, c.card_stats.get(item.id, CardStats()))
            reason = "triggered" if r.triggers else "always"
            report.included.append(Entry(item.id, reason, self.counter.count(item.text), detail))
        self.entries("story_cards", "dropped", left, "no_room")
        self.entries("story_cards", "dropped", empty, "empty", counted=False)
        idle_items = [Item(k.id, k.text) for k in idle]
        self.entries("story_cards", "dropped", idle_items, "not_triggered", counted=False)
        report.used, self.texts["story_cards"] = tokens, text
        return tokens

    def history(self, messages: Sequence[Message], last: Message | None,
                history: list[Message], room: int, as_text: bool) -> list[str]:
        """QS7: older messages newest first until the share is full; returns the live ids."""
        report = self.report("history")
        newest_first = history[::-1]
        if as_text:
            items = [Item(m.id, _message_line(m)) for m in newest_first]
            kept, left, text, tokens = _fill(items, room, self.styles["history"], self.counter,
                                             stop_at_first=True, reverse_text=True)
            self.texts["history"] = text
            kept_ids = {i.id for i in kept}
        else:  # SillyTavern sends the messages itself: each costs its own text
            tokens, kept_ids = 0, set()
            for m in newest_first:
                cost = self.counter.count(m.text)
                if tokens + cost > room:
                    break
                tokens += cost
                kept_ids.add(m.id)
        for m in newest_first:
            if m.id in kept_ids:
                report.included.append(Entry(m.id, "fits", self.counter.count(m.text)))
            else:
                report.dropped.append(Entry(m.id, "no_room", self.counter.count(m.text)))
        report.used = tokens
        live = kept_ids | ({last.id} if last and last.id else set())
        return [m.id for m in messages if m.id in live]

    def memory_bank(self, c: Candidates, room: int) -> int:
        """QS8: ranked memories, as many as fit; pinned ones are already in."""
        report = self.report("memory_bank")
        items, empty = _clean(c.memory_bank)
        pinned_ids = {m.id for m in c.pinned_memories}
        seen: set[str] = set()
        fresh, duplicate = [], []
        for item in items:
            (duplicate if item.id in pinned_ids or item.id in seen else fresh).append(item)
            seen.add(item.id)
        if not c.memory_bank_enabled:
            self.entries("memory_bank", "dropped", fresh, "memory_bank_off", counted=False)
            return 0
        kept, left, text, tokens = _fill(fresh, room, self.styles["memory_bank"], self.counter)
        self.entries("memory_bank", "included", kept, "fits")
        self.entries("memory_bank", "dropped", left, "no_room")
        self.entries("memory_bank", "dropped", duplicate, "duplicate", counted=False)
        self.entries("memory_bank", "dropped", empty, "empty", counted=False)
        report.used, self.texts["memory_bank"] = tokens, text
        return tokens


def _section_items(c: Candidates, section: str) -> list[Item]:
    """A section's items; a client-owned text (instructions...) is one item named after the section."""
    value = getattr(c, section)
    if isinstance(value, str):
        return [Item(section, value)] if value.strip() else []
    return list(value)


def _message_line(m: Message) -> str:
    text = m.text.strip()
    return f"{m.name}: {text}" if m.name else text


def _card_detail(r: RankedCard, s: CardStats) -> str:
    where = f"action {r.age}" if r.age is not None else "always"
    triggers = ", ".join(r.triggers) or "-"
    return f"{where}; uses {s.uses}; triggers: {triggers}"


def assemble(
    candidates: Candidates,
    context_tokens: int,
    counter: TokenCounter,
    *,
    rules: Rules,
    placements: Mapping[str, Placement] | None = None,
    styles: Mapping[str, Style] | None = None,
    history_as_text: bool = False,
) -> Assembly:
    """Fit one turn's candidates to `context_tokens` (rules QS1-QS8, RV11, SW1-SW3).

    `placements` and `styles` override the defaults per section. With `history_as_text`, the
    history and the last action are also returned as blocks (for clients without their own chat);
    otherwise history is reported and returned as `live_message_ids` only.
    """
    ctx = max(0, int(context_tokens))
    out = Assembly(context_tokens=ctx, required_cap=ctx * rules.context_required_percent // 100)
    run = _Run(counter, styles or {}, out)
    last, history = resolve_last_action(candidates.messages, candidates.last_action)

    out.required_used = run.required(candidates, last)
    out.dynamic_tokens = dynamic = max(0, ctx - out.required_used)
    cards, hist, bank = _shares(dynamic, rules, candidates.memory_bank_enabled)

    _budget(out, "story_cards", cards, cards)
    cards_used = run.cards(candidates, last, history, rules, cards)
    hist_room = hist + cards - cards_used
    _budget(out, "history", hist, hist_room)
    out.live_message_ids = run.history(candidates.messages, last, history, hist_room, history_as_text)
    bank_room = bank + hist_room - out.sections["history"].used if candidates.memory_bank_enabled else 0
    _budget(out, "memory_bank", bank, bank_room)
    run.memory_bank(candidates, bank_room)

    out.blocks = _blocks(run.texts, out, {**DEFAULT_PLACEMENTS, **(placements or {})},
                         history_as_text, last)
    return out


def _shares(dynamic: int, rules: Rules, bank_enabled: bool) -> tuple[int, int, int]:
    """QS4: (cards, history, memory bank) nominal shares of the dynamic tokens.

    Each share is floored; the last one takes the rest, so no token is lost to rounding.
    """
    cards = dynamic * rules.context_cards_percent // 100
    if not bank_enabled:
        return cards, dynamic - cards, 0
    history = dynamic * rules.context_history_percent // 100
    return cards, history, dynamic - cards - history


def _budget(out: Assembly, section: str, allocated: int, available: int) -> None:
    report = out.sections[section]
    report.allocated, report.available = allocated, available


# Blocks are listed in prompt order, so a client without its own chat can join them as they come:
# before the prompt, in the prompt, then in the chat from the deepest to depth 0. The history text
# sits above every in-chat injection and the last action between depth 1 and depth 0.
_POSITION_RANK = {"before_prompt": 0, "in_prompt": 1, "in_chat": 2}


def _blocks(
    texts: Mapping[str, str],
    out: Assembly,
    placements: Mapping[str, Placement],
    history_as_text: bool,
    last: Message | None,
) -> list[Block]:
    blocks = []
    for section in SECTIONS:
        text = texts.get(section, "")
        if not text or (section in ("history", "last_action") and not history_as_text):
            continue
        place = placements[section]
        depth, role = place.depth, place.role
        if section == "history":
            depth = len(out.sections["history"].included) + 1
        if section == "last_action" and last is not None and last.role in ("user", "assistant"):
            role = last.role
        blocks.append(Block(section, text, out.sections[section].used, place.position, depth, role))

    order = {name: i for i, name in enumerate(placements)}

    def key(b: Block) -> tuple:
        depth = {"history": float("inf"), "last_action": 0.5}.get(b.section, b.depth)
        return (_POSITION_RANK.get(b.position, 1), -depth, order.get(b.section, len(order)))

    return sorted(blocks, key=key)
