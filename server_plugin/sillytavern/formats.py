"""SillyTavern's file formats read into our shapes: World Info files, character books and
character cards (V1/V2/V3 JSON, or a PNG carrying the card in a `chara` / `ccv3` text chunk).

Pure: no database, no clock. `lore.py` and `characters.py` write what this returns. Every field we
do not use is kept (in `metadata`) and named, with why, in a per-entry `not_mapped` list, so a
person can see what an import lost. The formats were read from SillyTavern 1.19.0
(`public/scripts/world-info.js`: the entry definition and `convertCharacterBook`;
`src/character-card-parser.js`: the PNG chunks).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

from ..core.triggers import compile_regex

WORLD_INFO_FORMAT = "sillytavern_world_info"
BOOK_FORMAT = "character_book"

# World Info entry fields and SillyTavern's defaults for them (newWorldInfoEntryDefinition).
# A field still at its default (or unset: null, "", [], 0, false) was not chosen by the author,
# so it is kept in metadata but not reported as lost.
_WI_DEFAULTS: dict[str, Any] = {
    "keysecondary": [], "selective": True, "selectiveLogic": 0, "addMemo": False, "order": 100,
    "position": 0, "ignoreBudget": False, "excludeRecursion": False, "preventRecursion": False,
    "matchPersonaDescription": False, "matchCharacterDescription": False,
    "matchCharacterPersonality": False, "matchCharacterDepthPrompt": False, "matchScenario": False,
    "matchCreatorNotes": False, "delayUntilRecursion": 0, "probability": 100, "useProbability": True,
    "depth": 4, "outletName": "", "group": "", "groupOverride": False, "groupWeight": 100,
    "scanDepth": None, "caseSensitive": None, "matchWholeWords": None, "useGroupScoring": None,
    "automationId": "", "role": 0, "sticky": None, "cooldown": None, "delay": None, "vectorized": False,
    "characterFilterNames": [], "characterFilterTags": [], "characterFilterExclude": False,
    "triggers": [],
}
# Bookkeeping of the editor, never meaningful for the story.
_WI_BOOKKEEPING = {"uid", "displayIndex", "addMemo", "characterFilter", "extensions"}
_WI_LOGIC = {0: "AND ANY", 1: "NOT ALL", 2: "NOT ANY", 3: "AND ALL"}
_WI_POSITIONS = {0: "before the character", 1: "after the character", 2: "top of author's note",
                 3: "bottom of author's note", 4: "in the chat at a depth", 5: "top of examples",
                 6: "bottom of examples", 7: "an outlet"}

# Why a field is not applied: one sentence per field, shown to a person.
_WHY = {
    "keysecondary": "secondary keys are not applied: the card fires on its primary keys alone",
    "selectiveLogic": "secondary-key logic is not applied",
    "selective": "secondary-key filtering is not applied",
    "probability": "cards always fire when triggered (no probability)",
    "useProbability": "cards always fire when triggered (no probability)",
    "position": "placement is decided by the context assembler (story cards block)",
    "depth": "placement is decided by the context assembler (story cards block)",
    "role": "cards are injected with the story cards block's role",
    "order": "cards are ranked by recency and frequency of use (QS5), not by order",
    "group": "inclusion groups are not applied",
    "groupOverride": "inclusion groups are not applied",
    "groupWeight": "inclusion groups are not applied",
    "useGroupScoring": "inclusion groups are not applied",
    "sticky": "timed effects (sticky) are not applied",
    "cooldown": "timed effects (cooldown) are not applied",
    "delay": "timed effects (delay) are not applied",
    "scanDepth": "the scan window follows rule QS6, not a per-entry depth",
    "vectorized": "vector activation is not applied (the memory bank searches by meaning instead)",
    "excludeRecursion": "there is no recursive scanning",
    "preventRecursion": "there is no recursive scanning",
    "delayUntilRecursion": "there is no recursive scanning",
    "ignoreBudget": "every card counts against the story cards budget",
    "characterFilterNames": "character filters are not applied (use known_by for visibility)",
    "characterFilterTags": "character filters are not applied (use known_by for visibility)",
    "characterFilterExclude": "character filters are not applied (use known_by for visibility)",
    "triggers": "generation-type filters are not applied",
    "automationId": "automations are not run",
    "outletName": "outlets are not supported",
    "matchPersonaDescription": "only the chat is scanned for triggers",
    "matchCharacterDescription": "only the chat is scanned for triggers",
    "matchCharacterPersonality": "only the chat is scanned for triggers",
    "matchCharacterDepthPrompt": "only the chat is scanned for triggers",
    "matchScenario": "only the chat is scanned for triggers",
    "matchCreatorNotes": "only the chat is scanned for triggers",
}

IMPORT_NOTES = [
    "Triggers match as each entry's matchWholeWords and caseSensitive say; an entry that leaves "
    "matchWholeWords to the global setting (null) gets the automatic rule: whole words in scripts "
    "with spaces, substrings in Chinese, Japanese, Korean, Thai and other scripts without them.",
    "Regular-expression keys (/pattern/flags) are triggers; each search is bounded in time.",
    "Kept in each entry's metadata: every field that was not mapped, unchanged.",
]

_REGEX_KEY = re.compile(r"^/(.+)/([a-z]*)$", re.S)
REGEX_KEY_MAX_CHARS = 200  # a lore trigger's length limit (story/lore.py TRIGGER_MAX_CHARS)
_WHOLE_WORDS = {True: "on", False: "off", None: "auto"}


def matching(whole_words: Any, case_sensitive: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A card's `matching` metadata from World Info's matchWholeWords and caseSensitive, and the
    report lines saying what an unset (null) matchWholeWords became."""
    mode = _WHOLE_WORDS.get(whole_words if isinstance(whole_words, bool) else None, "auto")
    notes = [] if mode != "auto" else [{
        "field": "matchWholeWords", "value": whole_words,
        "note": "unset (SillyTavern's global setting, substrings by default): matched automatically, "
                "whole words in scripts with spaces, substrings in scripts without them"}]
    return {"whole_words": mode, "case_sensitive": case_sensitive is True}, notes
_CHAR_MACRO = re.compile(r"\{\{char\}\}|<BOT>", re.I)


class FormatError(ValueError):
    """The file is not in a format we read; the message says what is wrong, for a person."""


@dataclass
class LoreDraft:
    """One lore entry read from a file, before it has an id; `ref` names it in the file."""

    ref: str
    title: str
    text: str
    triggers: list[str]
    always: bool
    enabled: bool
    metadata: dict[str, Any]
    not_mapped: list[dict[str, Any]] = field(default_factory=list)
    skipped: str | None = None  # why the entry is not imported at all (e.g. "empty_text")
    mapped: list[dict[str, Any]] = field(default_factory=list)  # fields whose meaning we chose


@dataclass
class CardDraft:
    """A character read from a card: name, aliases, sheet fields, its lore and what was not mapped."""

    name: str
    aliases: list[str]
    sheet: dict[str, str]
    metadata: dict[str, Any]
    lore: list[LoreDraft]
    not_mapped: list[dict[str, Any]]
    spec: str


# --- helpers ---------------------------------------------------------------------------------

def _is_unset(value: Any) -> bool:
    return value is None or value is False or value == "" or value == [] or value == {} or value == 0


def _differs(name: str, value: Any, defaults: dict[str, Any]) -> bool:
    """True when the author chose this value (not the default, not left unset)."""
    if name in defaults and value == defaults[name]:
        return False
    return not _is_unset(value)


def _lost(name: str, value: Any, note: str) -> dict[str, Any]:
    return {"field": name, "value": _preview(value), "note": note}


def _preview(value: Any, limit: int = 200) -> Any:
    """A value as shown in a report: short scalars as they are, the rest as short JSON text."""
    if isinstance(value, (bool, int, float)) or value is None:
        return value
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "…"


def _strings(value: Any) -> list[str]:
    """A list of non-empty strings from a key list (SillyTavern also accepts one comma-joined string)."""
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list):
        return []
    return [str(v).strip() for v in value if isinstance(v, (str, int, float)) and str(v).strip()]


def _triggers(keys: list[str]) -> tuple[list[str], list[str]]:
    """Keys usable as triggers (deduplicated, order kept; regex keys that compile and fit) and
    the regex keys we cannot use."""
    usable: list[str] = []
    regex: list[str] = []
    seen: set[str] = set()
    for key in keys:
        if _REGEX_KEY.match(key) and (compile_regex(key) is None or len(key) > REGEX_KEY_MAX_CHARS):
            regex.append(key)
        elif key.casefold() not in seen:
            seen.add(key.casefold())
            usable.append(key)
    return usable, regex


def _text(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


# --- World Info --------------------------------------------------------------------------------

def parse_world_info(doc: Any, name: str | None = None) -> tuple[list[LoreDraft], list[dict[str, Any]]]:
    """Read a World Info file (`entries` as a map or an array; SillyTavern entries or character
    book entries) -> (drafts in file order, top-level fields not mapped)."""
    if not isinstance(doc, dict) or "entries" not in doc:
        raise FormatError("A World Info file is a JSON object with an 'entries' map or array.")
    entries = doc["entries"]
    if isinstance(entries, dict):
        items = list(entries.items())
    elif isinstance(entries, list):
        items = [(str(i), e) for i, e in enumerate(entries)]
    else:
        raise FormatError("'entries' must be a map (SillyTavern) or an array (character book).")
    world = name or _text(doc.get("name")) or None
    drafts = []
    for ref, entry in items:
        if not isinstance(entry, dict):
            raise FormatError(f"Entry {ref!r} is not a JSON object.")
        book_style = "keys" in entry and "key" not in entry
        drafts.append(_book_entry(ref, entry, world) if book_style else _wi_entry(ref, entry, world))
    top = [_lost(k, v, "world-level settings are not applied") for k, v in doc.items()
           if k not in ("entries", "name", "originalData") and not _is_unset(v)]
    return drafts, top


def _wi_entry(ref: str, entry: dict[str, Any], world: str | None) -> LoreDraft:
    """One SillyTavern World Info entry: key -> triggers, comment -> title, content -> text,
    constant -> always, disable -> not enabled; everything else kept in metadata."""
    mapped = {"key", "comment", "content", "constant", "disable"}
    triggers, regex = _triggers(_strings(entry.get("key")))
    rest = {k: v for k, v in entry.items() if k not in mapped}
    lost = []
    if regex:
        lost.append(_lost("key", regex, "regular-expression keys that do not compile or are longer than "
                          f"{REGEX_KEY_MAX_CHARS} characters are not used; kept in metadata"))
        rest["regex_keys"] = regex
    match, notes = matching(entry.get("matchWholeWords"), entry.get("caseSensitive"))
    mapped |= {"matchWholeWords", "caseSensitive"}
    lost += _wi_losses({k: (k, v) for k, v in entry.items() if k not in mapped},
                       has_secondary=bool(_strings(entry.get("keysecondary"))))
    draft = LoreDraft(
        ref=ref,
        title=_text(entry.get("comment")).strip()[:300],
        text=_text(entry.get("content")).strip(),
        triggers=triggers,
        always=bool(entry.get("constant")),
        enabled=not bool(entry.get("disable")),
        metadata={"import": {"format": WORLD_INFO_FORMAT, "world": world, "ref": ref},
                  "sillytavern": rest, "matching": match},
        not_mapped=lost, mapped=notes,
    )
    return _check_draft(draft)


def _wi_losses(fields: dict[str, tuple[str, Any]], has_secondary: bool) -> list[dict[str, Any]]:
    """The World Info settings an author chose that we do not apply.

    `fields`: SillyTavern field name -> (name as written in the file, value); a character book's
    `extensions` use snake_case names for the same settings.
    """
    lost = []
    position = fields.get("position", ("", 0))[1]
    use_probability = fields.get("useProbability", ("", True))[1]
    for key, (written, value) in fields.items():
        if key in _WI_BOOKKEEPING or not _differs(key, value, _WI_DEFAULTS):
            continue
        if key in ("selectiveLogic", "selective") and not has_secondary:
            continue  # the logic only matters when there are secondary keys
        if key == "depth" and position != 4:
            continue  # a depth is only used at position "at depth"
        if key == "probability" and use_probability is False:
            continue
        note = _WHY.get(key, "not used by Chronicler")
        if key == "selectiveLogic":
            note += f" ({_WI_LOGIC.get(value, value)})"
        if key == "position":
            note += f"; was: {_WI_POSITIONS.get(value, value)}"
        lost.append(_lost(written, value, note))
    return lost


_BOOK_DEFAULTS: dict[str, Any] = {"secondary_keys": [], "selective": False, "insertion_order": 100,
                                  "priority": 10, "position": "before_char", "case_sensitive": False,
                                  "extensions": {}}
# SillyTavern itself ignores `use_regex` (a key is a regex when written /like this/).
_BOOK_BOOKKEEPING = {"id", "extensions", "use_regex"}
_BOOK_WHY = {
    "secondary_keys": _WHY["keysecondary"], "selective": _WHY["selective"],
    "insertion_order": _WHY["order"], "priority": _WHY["order"], "position": _WHY["position"],
}


def _book_entry(ref: str, entry: dict[str, Any], world: str | None,
                char_name: str | None = None) -> LoreDraft:
    """One character book entry (V2 spec): keys -> triggers, content -> text, comment or name ->
    title, constant -> always, enabled; the rest (and `extensions`) kept in metadata."""
    mapped = {"keys", "content", "comment", "name", "constant", "enabled"}
    triggers, regex = _triggers(_strings(entry.get("keys")))
    rest = {k: v for k, v in entry.items() if k not in mapped}
    lost = []
    if regex:
        lost.append(_lost("keys", regex, "regular-expression keys that do not compile or are longer than "
                          f"{REGEX_KEY_MAX_CHARS} characters are not used; kept in metadata"))
        rest["regex_keys"] = regex
    extensions = entry.get("extensions") if isinstance(entry.get("extensions"), dict) else {}
    match, notes = matching(extensions.get("match_whole_words"), entry.get("case_sensitive"))
    mapped |= {"case_sensitive"}
    secondary = bool(_strings(entry.get("secondary_keys")))
    for key, value in entry.items():
        if key in mapped or key in _BOOK_BOOKKEEPING or not _differs(key, value, _BOOK_DEFAULTS):
            continue
        if key == "selective" and not secondary:
            continue
        lost.append(_lost(key, value, _BOOK_WHY.get(key, "not used by Chronicler")))
    extensions = entry.get("extensions")
    if isinstance(extensions, dict):
        lost += _wi_losses({_camel(k): (f"extensions.{k}", v) for k, v in extensions.items()
                            if k not in ("match_whole_words", "case_sensitive")},
                           has_secondary=secondary)
    title = _text(entry.get("comment")).strip() or _text(entry.get("name")).strip()
    text = _text(entry.get("content")).strip()
    if char_name:
        text = _CHAR_MACRO.sub(char_name, text)
    draft = LoreDraft(
        ref=ref, title=title[:300], text=text, triggers=triggers,
        always=bool(entry.get("constant")), enabled=entry.get("enabled", True) is not False,
        metadata={"import": {"format": BOOK_FORMAT, "world": world, "ref": ref}, "book": rest,
                  "matching": match},
        not_mapped=lost, mapped=notes,
    )
    return _check_draft(draft)


def _camel(snake: str) -> str:
    head, *tail = snake.split("_")
    return head + "".join(part.title() for part in tail)


def _check_draft(draft: LoreDraft) -> LoreDraft:
    if not draft.text:
        draft.skipped = "empty_text"
    elif not draft.triggers and not draft.always:
        draft.not_mapped.append(_lost("key", [], "no usable trigger: the card never fires unless "
                                      "it is made 'always'"))
    return draft


# --- character cards ---------------------------------------------------------------------------

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_CARD_SHEET_FIELDS = ("description", "personality", "scenario")
_CARD_WHY = {
    "first_mes": "greetings stay in SillyTavern's card",
    "alternate_greetings": "greetings stay in SillyTavern's card",
    "group_only_greetings": "greetings stay in SillyTavern's card",
    "mes_example": "example dialogue stays in SillyTavern's card",
    "system_prompt": "the card's prompt overrides stay in SillyTavern",
    "post_history_instructions": "the card's prompt overrides stay in SillyTavern",
    "creator_notes": "notes for people are not part of the sheet",
    "creator_notes_multilingual": "notes for people are not part of the sheet",
    "tags": "tags are kept in metadata only",
    "creator": "kept in metadata only",
    "character_version": "kept in metadata only",
    "extensions": ("SillyTavern extension data (talkativeness, depth prompt, linked world…) is "
                   "kept in metadata only"),
    "assets": "assets are not imported",
    "source": "kept in metadata only",
}
_CARD_BOOKKEEPING = {"name", "nickname", "character_book", "creation_date", "modification_date"}


def read_png_card(data: bytes) -> dict[str, Any]:
    """The card JSON carried by a PNG: the `ccv3` text chunk if present, else `chara`
    (both base64 of UTF-8 JSON), as SillyTavern reads them."""
    if not data.startswith(PNG_SIGNATURE):
        raise FormatError("Not a PNG file (wrong signature).")
    texts: dict[str, str] = {}
    pos = len(PNG_SIGNATURE)
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if len(chunk) < length:
            raise FormatError("The PNG is truncated (a chunk runs past the end of the file).")
        if kind in (b"tEXt", b"iTXt"):
            keyword, text = _text_chunk(kind, chunk)
            texts.setdefault(keyword.lower(), text)
        if kind == b"IEND":
            break
        pos += 12 + length
    payload = texts.get("ccv3") or texts.get("chara")
    if payload is None:
        raise FormatError("The PNG carries no character card (no 'chara' or 'ccv3' text chunk).")
    try:
        return json.loads(base64.b64decode(payload, validate=False).decode("utf-8"))
    except (binascii.Error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"The PNG's card chunk is not base64 of JSON: {exc}") from None


def _text_chunk(kind: bytes, chunk: bytes) -> tuple[str, str]:
    keyword, _, rest = chunk.partition(b"\0")
    if kind == b"tEXt":
        return keyword.decode("latin-1"), rest.decode("latin-1")
    # iTXt: compression flag, method, language\0, translated keyword\0, text (UTF-8)
    compressed, body = rest[:1] == b"\x01", rest[2:]
    body = body.split(b"\0", 2)[-1]
    try:
        return keyword.decode("latin-1"), (zlib.decompress(body) if compressed else body).decode("utf-8")
    except (zlib.error, UnicodeDecodeError):
        return keyword.decode("latin-1"), ""


def decode_png_base64(text: str) -> bytes:
    """The bytes of a PNG sent as base64 (a `data:image/png;base64,` prefix is allowed)."""
    if text.startswith("data:"):
        text = text.partition(",")[2]
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise FormatError(f"png_base64 is not valid base64: {exc}") from None


def parse_character_card(card: Any) -> CardDraft:
    """A V1, V2 (`chara_card_v2`) or V3 (`chara_card_v3`) card -> a character draft.

    name -> name; V3 `nickname` -> an alias; description, personality, scenario -> sheet fields
    (with `{{char}}` replaced by the name: in a sheet it means this character, not the speaker);
    `character_book` -> lore entries. Everything else is kept in metadata and named in not_mapped.
    """
    if not isinstance(card, dict):
        raise FormatError("A character card is a JSON object.")
    spec = _text(card.get("spec")) or "chara_card_v1"
    data = card.get("data") if spec in ("chara_card_v2", "chara_card_v3") else card
    if not isinstance(data, dict):
        raise FormatError(f"A {spec} card keeps its fields in a 'data' object.")
    name = _text(data.get("name")).strip()
    if not name:
        raise FormatError("The card has no name.")
    sheet = {}
    for key in _CARD_SHEET_FIELDS:
        text = _CHAR_MACRO.sub(name, _text(data.get(key))).strip()
        if text:
            sheet[key] = text
    aliases = [a for a in [_text(data.get("nickname")).strip()] if a and a != name]
    unmapped = {k: v for k, v in data.items()
                if k not in _CARD_SHEET_FIELDS and k not in _CARD_BOOKKEEPING}
    not_mapped = [_lost(k, v, _CARD_WHY.get(k, "not used by Chronicler"))
                  for k, v in unmapped.items() if not _is_unset(v)]
    lore: list[LoreDraft] = []
    book = data.get("character_book")
    if isinstance(book, dict) and isinstance(book.get("entries"), list):
        book_name = _text(book.get("name")) or f"{name}'s book"
        for i, entry in enumerate(book["entries"]):
            if isinstance(entry, dict):
                lore.append(_book_entry(str(entry.get("id", i)), entry, book_name, char_name=name))
        book_rest = {k: v for k, v in book.items() if k != "entries"}
        if book_rest:
            unmapped["character_book"] = book_rest
        not_mapped += [_lost(f"character_book.{k}", v, "book-level settings are not applied")
                       for k, v in book_rest.items() if k != "name" and not _is_unset(v)]
    metadata = {"card": {"spec": spec, "spec_version": _text(card.get("spec_version")) or None,
                         "unmapped": unmapped}}
    return CardDraft(name=name[:200], aliases=aliases, sheet=sheet, metadata=metadata, lore=lore,
                     not_mapped=not_mapped, spec=spec)
