"""A realistic SillyTavern chat file (.jsonl) for the backfill tests and bench/import_chat.py.

What SillyTavern writes: a metadata line (`user_name`, `character_name`, `create_date`,
`chat_metadata` with an `integrity` id), then one message per line with `name`, `is_user`,
`is_system`, `send_date`, `mes`, `extra`, and on replies `swipes`, `swipe_id`, `swipe_info`; group
chats add `original_avatar` and `force_avatar`. The generated chat mixes the three `send_date`
forms SillyTavern has used (its human form "November 29, 2026 4:52pm", ISO 8601, epoch
milliseconds), hides some messages (`is_system`), has swipes, a narrator line, days-long pauses
(new sessions), and ids of ours on its first messages (as if the extension had seen them).
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

USER = "Kai"
CAST = [("Ayla", "Ayla.png"), ("Brom", "brom_the_smith.png"), ("Sera", "Sera.png")]
PLACES = ["the harbour", "the old mill", "the lighthouse", "the market", "the chapel",
          "the forest road", "the smithy", "the north gate"]
THINGS = ["a brass key", "the silver lantern", "a torn map", "the sealed letter", "a bag of salt",
          "the captain's ring", "a wooden flute", "the red cloak"]
FEELINGS = ["worried", "amused", "suspicious", "tired", "hopeful", "angry", "quiet"]


def human_date(moment: datetime) -> str:
    """SillyTavern's old send_date: 'November 29, 2026 4:52pm' (local time, no zone)."""
    local = moment.astimezone()
    hour = local.hour % 12 or 12
    return f"{local.strftime('%B')} {local.day}, {local.year} {hour}:{local.minute:02d}{'am' if local.hour < 12 else 'pm'}"


def send_date(moment: datetime, n: int) -> Any:
    """The three forms in turn: human (minute precision), ISO 8601, epoch milliseconds."""
    form = n % 3
    if form == 0:
        return human_date(moment)
    if form == 1:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    return int(moment.timestamp() * 1000)


def user_line(rng: random.Random, n: int) -> str:
    place, thing = rng.choice(PLACES), rng.choice(THINGS)
    return rng.choice([
        f"*Kai walks to {place}.* \"Did anyone see {thing} last night?\"",
        f"\"I'll meet you at {place} before the bells,\" Kai says, turning {thing} over in his hands.",
        f"*Kai leans closer.* \"Tell me the truth about {thing}. Why was it at {place}?\"",
        f"Kai nods slowly. \"My birthday is in spring, you know. I want {thing} back by then.\" ({n})",
    ])


def reply_line(rng: random.Random, speaker: str, n: int) -> str:
    place, thing, feeling = rng.choice(PLACES), rng.choice(THINGS), rng.choice(FEELINGS)
    return rng.choice([
        f"*{speaker} looks {feeling}.* \"I saw {thing} near {place}, Kai. Someone moved it after dark.\"",
        f"\"You ask too many questions,\" {speaker} says, {feeling}. \"Meet me at {place} and bring {thing}.\"",
        f"*{speaker} glances toward {place}.* \"I promised my mother I would never sell {thing}. I keep promises.\"",
        f"{speaker} laughs, but it sounds {feeling}. \"{place.capitalize()} was quiet tonight. Too quiet for turn {n}.\"",
    ])


def messages(count: int, seed: int = 7, group: bool = True, start: datetime | None = None,
             ids_for_first: int = 10, session_every: int = 150) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The metadata line and `count` message lines."""
    rng = random.Random(seed)
    moment = start or datetime(2026, 11, 29, 16, 52, 3, tzinfo=timezone.utc)
    cast = CAST if group else CAST[:1]
    meta = {"user_name": USER, "character_name": "unused" if group else cast[0][0],
            "create_date": human_date(moment),
            "chat_metadata": {"integrity": "7f1c2a9e-1111-4a4a-9d9d-000000000001", "note_prompt": ""}}
    out: list[dict[str, Any]] = []
    for n in range(count):
        if n and n % session_every == 0:
            moment += timedelta(days=2, hours=rng.randint(1, 5))  # a new session
        else:
            moment += timedelta(seconds=rng.randint(20, 240))
        is_user = n % 2 == 0
        name, avatar = (USER, None) if is_user else rng.choice(cast)
        text = user_line(rng, n) if is_user else reply_line(rng, name, n)
        message: dict[str, Any] = {"name": name, "is_user": is_user, "is_system": False,
                                   "send_date": send_date(moment, n), "mes": text, "extra": {}}
        if n < ids_for_first:
            message["extra"]["chronicler_id"] = f"m-{n:04d}-ext"
        if not is_user:
            swipes = [text] + [reply_line(rng, name, n) for _ in range(rng.randint(0, 2))]
            message.update(swipes=swipes, swipe_id=0, gen_started=None, gen_finished=None,
                           swipe_info=[{"send_date": message["send_date"], "extra": {}} for _ in swipes])
            message["extra"]["api"] = "openai"
            if group:
                message["original_avatar"] = avatar
                message["force_avatar"] = f"/thumbnail?type=avatar&file={avatar}"
        if n % 37 == 5:
            message["is_system"] = True  # hidden by the user: SillyTavern leaves it out of the prompt
        if n % 97 == 50:
            message.update(name="System", is_user=False, extra={"type": "narrator"},
                           mes=f"The storm reaches {rng.choice(PLACES)}.")
            message.pop("original_avatar", None)
            message.pop("swipes", None)
        out.append(message)
    return meta, out


def write(path: Path, count: int, **kw: Any) -> Path:
    meta, lines = messages(count, **kw)
    with path.open("w", encoding="utf-8") as fh:
        for value in [meta, *lines]:
            fh.write(json.dumps(value, ensure_ascii=False) + "\n")
    return path
