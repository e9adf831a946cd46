"""The per-turn context assembler: candidates + budget + token counter -> blocks + report.

PURE (docs/architecture.md): it imports only the token counter's module and the stdlib (plus the
pure `triggers` helpers) and is handed everything it needs: no database, no HTTP, no clock.
`story/context` gathers the candidates and calls `assemble()`. Every budget rule lives here, in
this module, once (`types` holds the inputs and outputs, `text` the measuring and cutting):

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

from typing import Mapping, Sequence

from ..tokens import TokenCounter
from ..triggers import ScanWindow, scan_window_size
from .text import (
    RankedCard,
    clean,
    count_rendered,
    cut_section,
    fill,
    rank_cards,
    render,
    resolve_last_action,
    scan_texts,
    window_texts,
)
from .types import (
    DEFAULT_PLACEMENTS,
    DEFAULT_STYLES,
    DYNAMIC,
    REQUIRED,
    REQUIRED_PRIORITY,
    SECTIONS,
    Assembly,
    Block,
    Candidates,
    Card,
    CardStats,
    Entry,
    Item,
    LastAction,
    Message,
    Placement,
    Rules,
    SectionReport,
    Style,
)

# What callers use (story/context, tests, benches): the inputs and outputs, and the functions.
__all__ = ["DYNAMIC", "REQUIRED", "REQUIRED_PRIORITY", "SECTIONS", "Assembly", "Block", "Candidates", "Card",
           "CardStats", "Entry", "Item", "LastAction", "Message", "Placement", "RankedCard", "Rules", "SectionReport",
           "Style", "assemble", "rank_cards", "resolve_last_action", "scan_texts"]

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
        text = render([item], self.styles[section])[0] if section != "last_action" else item.text
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
        full = render(items, style)[0]
        report.allocated, report.available = self.counter.count(full), room
        if report.allocated <= room:
            kept, left, text, tokens = list(items), [], full, report.allocated
            reason = "in_full"
        else:
            self.out.flags.append("pinned_over_cap")
            kept, left, text, tokens = fill(items, room, style, self.counter)
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
        report.allocated, report.available = count_rendered(items, style, self.counter), max(0, room)
        if after_cut:
            self.entries(section, "dropped", items, "after_cut", counted=False)
            return 0, True
        if report.allocated <= room:
            self.entries(section, "included", items, "in_full")
            report.used, self.texts[section] = report.allocated, render(items, style)[0]
            return report.used, False
        cut = cut_section(items, style, max(0, room), self.counter)
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
        front = clean([Item("front_memory", c.front_memory)])[0]
        used = self.fixed("last_action", last_item, ctx)
        used += self.fixed("front_memory", front[0] if front else None, ctx - used)
        pinned, empty = clean(c.pinned_memories)
        self.entries("pinned_memories", "dropped", empty, "empty", counted=False)
        if pinned:
            used += self.pinned(pinned, max(0, cap - used))
        cut = False
        for section in REQUIRED_PRIORITY:
            items, empty = clean(_section_items(c, section))
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
        window = ScanWindow(window_texts(last, history, self.out.scan_actions),
                            regex_seconds=rules.card_regex_timeout_ms / 1000)
        ranked, idle = rank_cards(c.story_cards, window, c.card_stats)
        self.out.fired_triggers = {r.card.id: list(r.triggers) for r in ranked if r.triggers}
        items, empty = clean([Item(r.card.id, r.card.text) for r in ranked])
        kept, left, text, tokens = fill(items, room, self.styles["story_cards"], self.counter)
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
            kept, left, text, tokens = fill(items, room, self.styles["history"], self.counter,
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
        items, empty = clean(c.memory_bank)
        pinned_ids = {m.id for m in c.pinned_memories}
        seen: set[str] = set()
        fresh, duplicate = [], []
        for item in items:
            (duplicate if item.id in pinned_ids or item.id in seen else fresh).append(item)
            seen.add(item.id)
        if not c.memory_bank_enabled:
            self.entries("memory_bank", "dropped", fresh, "memory_bank_off", counted=False)
            return 0
        kept, left, text, tokens = fill(fresh, room, self.styles["memory_bank"], self.counter)
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
