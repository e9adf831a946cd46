"""What the assembler measures and cuts: the last action and the scan window, story-card ranking
(QS5, QS6), and building a section's text item by item within its room."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ..tokens import TokenCounter
from ..triggers import ScanWindow
from .types import Card, CardStats, Item, LastAction, Message, Style

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
    return window_texts(last, history, actions)


def window_texts(last: Message | None, history: list[Message], actions: int) -> list[str]:
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
        hits = window.hits(card.triggers, card.match)
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

def render(items: Sequence[Item], style: Style) -> tuple[str, list[tuple[int, int]]]:
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


def count_rendered(items: Sequence[Item], style: Style, counter: TokenCounter) -> int:
    """The tokens of `render(items, style)[0]`, counted item by item where the encoder allows it
    (TokenCounter.count_joined): a long section that changed by one item is not encoded again."""
    if not items:
        return 0
    parts = [style.header + "\n"] if style.header else []
    pieces = [style.prefix + item.text for item in items]
    parts += [piece + style.separator for piece in pieces[:-1]] + [pieces[-1]]
    return counter.count_joined(parts)


def clean(items: Sequence[Item]) -> tuple[list[Item], list[Item]]:
    """Items with their text stripped, and the empty ones (never emitted)."""
    kept, empty = [], []
    for item in items:
        text = item.text.strip()
        (kept if text else empty).append(Item(item.id, text))
    return kept, empty


def fill(
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
        text = render(kept[::-1] if reverse_text else kept, style)[0]
        return text, counter.count(text)

    text, tokens = joined()
    while tokens > room:  # the joined text counted more than its pieces (rare): drop the last
        left.insert(0, kept.pop())
        text, tokens = joined()
    return kept, left, text, tokens


@dataclass
class SectionCut:
    whole: list[Item]  # items kept in full
    truncated: Item | None  # the item the cut fell in, if some of its own text survived
    survived: str  # that surviving text
    rest: list[Item]  # the items after the cut (the first is the cut one when nothing survived)
    text: str
    tokens: int


def cut_section(items: Sequence[Item], style: Style, room: int, counter: TokenCounter) -> SectionCut:
    """Cut a section at its end to fit `room` (QS3): the section is cut as one text, its
    beginning kept. A cut that keeps only a header, separator or prefix keeps nothing of that item."""
    full, spans = render(items, style)
    prefix = counter.truncate(full, room)
    whole = [item for item, (_, end) in zip(items, spans) if end <= len(prefix)]
    n = len(whole)
    if n == len(items):
        return SectionCut(whole, None, "", [], full, counter.count(full))
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
    return SectionCut(whole, truncated, survived, rest, text, tokens)
