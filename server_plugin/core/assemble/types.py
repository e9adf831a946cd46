"""The assembler's inputs and outputs: sections, candidates, rules, placements, styles, the report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..triggers import AUTO, Match

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
    match: Match = AUTO  # whole words (auto, on, off) and case sensitivity of its triggers


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
    card_regex_timeout_ms: int  # each search of a `/regex/` trigger in one text


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
