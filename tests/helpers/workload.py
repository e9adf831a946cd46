"""Writes and reads by route family, driven by workers that record every acknowledged write.

A family knows its operations (weighted callables taking a `Worker`) and how to read its items
back from the API (`snapshot`). To cover a new route family (messages, lore, summaries…), write one
class like `Memories` below and add it to FAMILIES: the crash, concurrency and load harnesses pick
it up. Each worker owns the items whose ids (or texts) start with its name, so quotas shared between
owners (the global scope's 100 unpinned and 20 pinned, RV8) are kept out of reach by small caps.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from typing import Any, Callable

from tests.helpers.client import Client, Dead, q
from tests.helpers.ledger import Key, Ledger, State

Op = Callable[["Worker"], None]


def needs_model(op: Op) -> Op:
    """Mark a write that waits for the embedding model (it embeds text) on the server."""
    op.needs_model = True  # type: ignore[attr-defined]
    return op

# Texts with the edge cases a person's campaign really has (RTL marks, emoji, combining accents).
PHRASES = ["Yuki cried in the hallway after the duel.", "Call me Captain, not Kit.",
           "The Duke owes the crew 300 crowns.", "Allergic to moonpetal tea.",
           "‏שלום‎ said the stranger at the gate.", "Mira's birthday is the 3rd of Frostmoon 🎂.",
           "Cafe\u0301 Noir is where they first met.", "She promised to return the silver key."]

GLOBAL_CAP = 12        # own unpinned global memories per worker (8 workers x 12 < 100, RV8)
GLOBAL_PIN_CAP = 2     # own pinned global memories per worker (8 x 2 < 20)
CHARACTER_CAP = 8      # memories per own character (< 20 pins, < 100 unpinned)
CHARACTER_PIN_CAP = 3
MEMORY_CAP = 30        # own memories per worker in all
CHARACTERS_CAP = 5
CHATS_CAP = 3
TURNS = 4              # turn ids per chat, so rollbacks find something


class Worker:
    """One client (a tab, the panel, a job) with its ledger; at most one request in flight."""

    def __init__(self, owner: str, client: Client, families: list["Family"] | None = None,
                 seed: int = 0, read_weight: float = 1.0,
                 model_ready: threading.Event | None = None) -> None:
        self.owner = owner
        # While the server's model loads, writes that embed would only wait: with this event
        # (set by whoever watches /v1/health) the worker does the other writes meanwhile.
        self.model_ready = model_ready
        self.client = client
        self.ledger = Ledger(owner)
        self.rng = random.Random(seed)
        self.families = families if families is not None else FAMILIES
        self.read_weight = read_weight
        self.serial = 0
        self.statuses: Counter[tuple[str, int]] = Counter()
        self.failures: list[str] = []      # 5xx, "database is locked", answers that contradict the request
        self.died = False                  # the sidecar stopped answering (killed)

    # --- running ----------------------------------------------------------------------------
    def next_serial(self) -> int:
        self.serial += 1
        return self.serial

    def weighted_ops(self) -> list[tuple[float, Op]]:
        ops: list[tuple[float, Op]] = []
        for family in self.families:
            if not family.available(self.client):
                continue
            ops.extend(family.writes())
            ops.extend((w * self.read_weight, op) for w, op in family.reads())
        if self.model_ready is not None and not self.model_ready.is_set():
            ops = [(w, op) for w, op in ops if not getattr(op, "needs_model", False)]
        return ops

    def step(self) -> None:
        ops = self.weighted_ops()
        weights = [w for w, _ in ops]
        self.rng.choices([op for _, op in ops], weights)[0](self)

    def run(self, stop: threading.Event) -> None:
        """Step until `stop` is set or the sidecar dies (the write in flight stays pending)."""
        while not stop.is_set():
            try:
                self.step()
            except Dead:
                self.died = True
                return
            except Exception as exc:  # a harness bug must fail the test, not end a thread quietly
                self.failures.append(f"worker {self.owner} crashed: {type(exc).__name__}: {exc}")
                return

    # --- one request ------------------------------------------------------------------------
    def _note(self, op: str, method: str, path: str, status: int, body: Any) -> None:
        self.statuses[(op, status)] += 1
        text = str(body)
        if status >= 500 or "database is locked" in text.lower():
            self.failures.append(f"{method} {path} -> {status}: {text[:300]}")

    def read(self, op: str, method: str, path: str, params: dict | None = None,
             ok: tuple[int, ...] = (200,), body: Any = None) -> Any:
        status, body = self.client.call(method, path, body, params=params)
        self._note(op, method, path, status, body)
        if status not in ok:
            self.failures.append(f"{method} {path} -> {status}: {str(body)[:300]}")
        return body if status == 200 else None

    def write(self, op: str, method: str, path: str, body: Any, effects: dict[Key, State | None],
              creates: list[tuple[str, State]] | None = None,
              from_response: Callable[[Any], dict[Key, State | None]] | None = None,
              params: dict | None = None) -> Any:
        """Send a write; the ledger learns its effects only when it is acknowledged (2xx)."""
        self.ledger.begin(op, effects, creates or [])
        status, answer = self.client.call(method, path, body, params=params)
        self._note(op, method, path, status, answer)
        if 200 <= status < 300:
            confirmed = from_response(answer) if from_response else effects
            wanted = dict(effects)
            if creates and from_response:
                made = [dict(s) for k, s in confirmed.items() if k not in wanted]
                if sorted(map(str, made)) != sorted(str(s) for _, s in creates):
                    self.failures.append(f"{op}: created {made}, asked for {creates}")
            for key, state in wanted.items():
                if key in confirmed and confirmed[key] != state:
                    self.failures.append(f"{op}: {key} answered {confirmed[key]}, expected {state}")
            self.ledger.ack(confirmed)
            return answer
        code = answer.get("error", {}).get("code", "?") if isinstance(answer, dict) else "?"
        if status >= 500:
            self.failures.append(f"{op}: {status} {code}")
        self.ledger.refuse(code)
        return None


class Family:
    """A route family: its writes and reads, and how to read its items back.

    A family whose routes may not be in every sidecar yet names one in `route`; it takes part
    only where that route answers anything but 404/405 (probed once per process)."""

    kind = ""
    route: tuple[str, str] | None = None
    _available: bool | None = None

    def available(self, client: Client) -> bool:
        if self.route is None:
            return True
        if self._available is None:
            status, body = client.call(*self.route, {} if self.route[0] != "GET" else None)
            code = body.get("error", {}).get("code", "") if isinstance(body, dict) else ""
            type(self)._available = not (status in (404, 405) and code in ("not_found", "method_not_allowed"))
        return bool(self._available)

    def writes(self) -> list[tuple[float, Op]]:
        return []

    def reads(self) -> list[tuple[float, Op]]:
        return []

    def snapshot(self, client: Client) -> dict[str, dict[Key, State]]:
        """Every item of this family in the store, grouped by owner (the worker that wrote it)."""
        raise NotImplementedError


def owner_of_id(item_id: str) -> str:
    return item_id.split("-", 1)[0]


def _get(client: Client, path: str, params: dict | None = None) -> Any:
    status, body = client.call("GET", path, params=params)
    if status != 200:
        raise AssertionError(f"GET {path} -> {status}: {str(body)[:300]}")
    return body


# --- characters (PUT, DELETE: RV6) -------------------------------------------------------------
def character_state(c: dict) -> State:
    return {"name": c["name"], "aliases": c["aliases"], "sheet": c["sheet"]}


class Characters(Family):
    kind = "character"

    def writes(self) -> list[tuple[float, Op]]:
        return [(1.0, self.put), (0.4, self.delete)]

    def reads(self) -> list[tuple[float, Op]]:
        return [(0.5, self.list)]

    def put(self, w: Worker) -> None:
        own = sorted(w.ledger.items(self.kind))
        if own and (len(own) >= CHARACTERS_CAP or w.rng.random() < 0.5):
            cid = w.rng.choice(own)
        else:
            cid = f"{w.owner}-char {w.next_serial()}.png"
        n = w.next_serial()
        state = {"name": f"{w.owner} Hero {n}", "aliases": [f"H{n}"],
                 "sheet": {"personality": w.rng.choice(PHRASES), "backstory": f"Born in year {n}."}}
        w.write("character.put", "PUT", f"/v1/characters/{q(cid)}", state, {(self.kind, cid): state},
                from_response=lambda a: {(self.kind, cid): character_state(a["character"])})

    def delete(self, w: Worker) -> None:
        """RV6: the character's memories become global; chats lose the member. One transaction."""
        own = sorted(w.ledger.items(self.kind))
        memories = w.ledger.items("memory")
        own_global = sum(1 for m in memories.values() if m["scope"] == "global")
        own_global_pins = sum(1 for m in memories.values() if m["scope"] == "global" and m["pinned"])
        for cid in w.rng.sample(own, len(own)):
            moved = {mid: m for mid, m in memories.items() if m["character_id"] == cid}
            pins = sum(1 for m in moved.values() if m["pinned"])
            if own_global + len(moved) <= GLOBAL_CAP and own_global_pins + pins <= GLOBAL_PIN_CAP:
                break
        else:
            return
        effects: dict[Key, State | None] = {(self.kind, cid): None}
        for mid, m in moved.items():
            effects[("memory", mid)] = {**m, "scope": "global", "character_id": None,
                                        "version": m["version"] + 1}
        for chat_id, chat in w.ledger.items("chat").items():
            if cid in chat["member_ids"]:
                effects[("chat", chat_id)] = {**chat, "member_ids": [m for m in chat["member_ids"] if m != cid]}
        w.write("character.delete", "DELETE", f"/v1/characters/{q(cid)}", None, effects)

    def list(self, w: Worker) -> None:
        w.read("character.list", "GET", "/v1/characters")

    def snapshot(self, client: Client) -> dict[str, dict[Key, State]]:
        out: dict[str, dict[Key, State]] = {}
        for c in _get(client, "/v1/characters")["characters"]:
            out.setdefault(owner_of_id(c["id"]), {})[(self.kind, c["id"])] = character_state(c)
        return out


# --- chats (PUT) -----------------------------------------------------------------------------
def chat_state(c: dict) -> State:
    return {"title": c["title"], "member_ids": c["member_ids"]}


class Chats(Family):
    kind = "chat"

    def writes(self) -> list[tuple[float, Op]]:
        return [(0.6, self.put)]

    def reads(self) -> list[tuple[float, Op]]:
        return [(0.5, self.list)]

    def put(self, w: Worker) -> None:
        own = sorted(w.ledger.items(self.kind))
        if own and (len(own) >= CHATS_CAP or w.rng.random() < 0.5):
            chat_id = w.rng.choice(own)
        else:  # SillyTavern's chat ids have spaces and '@'
            chat_id = f"{w.owner}-Seraphina - 2026-11-29@16h52m{w.next_serial():02d}s"
        cast = sorted(w.ledger.items("character"))
        members = w.rng.sample(cast, min(len(cast), w.rng.randint(1, 3))) + [f"{w.owner}-unregistered"]
        state = {"title": f"Campaign {w.next_serial()}", "member_ids": members}
        w.write("chat.put", "PUT", f"/v1/chats/{q(chat_id)}", state, {(self.kind, chat_id): state},
                from_response=lambda a: {(self.kind, chat_id): chat_state(a["chat"])})

    def list(self, w: Worker) -> None:
        w.read("chat.list", "GET", "/v1/chats")

    def snapshot(self, client: Client) -> dict[str, dict[Key, State]]:
        out: dict[str, dict[Key, State]] = {}
        for c in _get(client, "/v1/chats")["chats"]:
            out.setdefault(owner_of_id(c["id"]), {})[(self.kind, c["id"])] = chat_state(c)
        return out


# --- memories (POST, PATCH, DELETE, rollback: RV4, RV8, RV10, RV11) ----------------------------
MEMORY_FIELDS = ("text", "scope", "character_id", "pinned", "archived", "chat_id", "turn_id", "version")


def memory_state(m: dict) -> State:
    return {k: m[k] for k in MEMORY_FIELDS}


def memory_owner(text: str) -> str:
    return text[1:text.index("]")] if text.startswith("[") and "]" in text else ""


class Memories(Family):
    kind = "memory"

    def writes(self) -> list[tuple[float, Op]]:
        return [(4.0, self.create), (2.0, self.edit), (0.6, self.toggle_pin), (1.0, self.delete),
                (0.5, self.rollback)]

    def reads(self) -> list[tuple[float, Op]]:
        return [(1.0, self.list), (2.0, self.for_turn)]

    @needs_model
    def create(self, w: Worker) -> None:
        own = w.ledger.items(self.kind)
        if len(own) >= MEMORY_CAP:
            return self.delete(w)
        scope, character_id = self._pick_scope(w, own)
        if scope is None:
            return self.delete(w)
        pins = sum(1 for m in own.values() if m["pinned"] and m["character_id"] == character_id)
        pinned = w.rng.random() < 0.15 and pins < (GLOBAL_PIN_CAP if scope == "global" else CHARACTER_PIN_CAP)
        chat_id = turn_id = None
        chats = sorted(w.ledger.items("chat"))
        if chats and w.rng.random() < 0.6:
            chat_id = w.rng.choice(chats)
            turn_id = f"{w.owner}-turn {w.rng.randint(1, TURNS)}"
        text = f"[{w.owner}] #{w.next_serial()} {w.rng.choice(PHRASES)}"
        actor = "user" if pinned else w.rng.choice(["user", "model", "background"])
        body = {"text": text, "scope": scope, "pinned": pinned, "actor": actor}
        if character_id:
            body["character_id"] = character_id
        if chat_id:
            body.update(chat_id=chat_id, turn_id=turn_id)
        state = {"text": text, "scope": scope, "character_id": character_id, "pinned": pinned,
                 "archived": False, "chat_id": chat_id, "turn_id": turn_id, "version": 1}
        answer = w.write("memory.create", "POST", "/v1/memories", body, {}, creates=[(self.kind, state)],
                         from_response=lambda a: {(self.kind, a["memory"]["id"]): memory_state(a["memory"])})
        if answer and answer.get("archived_ids"):
            w.failures.append(f"memory.create archived {answer['archived_ids']}: a cap is too high")

    def _pick_scope(self, w: Worker, own: dict[str, State]) -> tuple[str | None, str | None]:
        count = Counter(m["character_id"] for m in own.values())
        cast = [c for c in sorted(w.ledger.items("character")) if count[c] < CHARACTER_CAP]
        if count[None] < GLOBAL_CAP and (not cast or w.rng.random() < 0.4):
            return "global", None
        if cast:
            return "character", w.rng.choice(cast)
        return None, None

    def _pick(self, w: Worker) -> tuple[str, State] | None:
        own = w.ledger.items(self.kind)
        if not own:
            return None
        memory_id = w.rng.choice(sorted(own))
        return memory_id, own[memory_id]

    @needs_model
    def edit(self, w: Worker) -> None:
        picked = self._pick(w)
        if picked is None:
            return self.create(w)
        memory_id, m = picked
        actor = "user" if m["pinned"] else w.rng.choice(["user", "model", "background"])
        text = f"[{w.owner}] #{w.next_serial()} edited: {w.rng.choice(PHRASES)}"
        state = {**m, "text": text, "version": m["version"] + 1}
        w.write("memory.edit", "PATCH", f"/v1/memories/{q(memory_id)}", {"text": text, "actor": actor},
                {(self.kind, memory_id): state},
                from_response=lambda a: {(self.kind, memory_id): memory_state(a["memory"])})

    def toggle_pin(self, w: Worker) -> None:
        picked = self._pick(w)
        if picked is None:
            return None
        memory_id, m = picked
        own = w.ledger.items(self.kind)
        pins = sum(1 for o in own.values() if o["pinned"] and o["character_id"] == m["character_id"])
        cap = GLOBAL_PIN_CAP if m["scope"] == "global" else CHARACTER_PIN_CAP
        if not m["pinned"] and pins >= cap:
            return None
        state = {**m, "pinned": not m["pinned"], "version": m["version"] + 1}
        w.write("memory.pin", "PATCH", f"/v1/memories/{q(memory_id)}",
                {"pinned": not m["pinned"], "actor": "user"}, {(self.kind, memory_id): state},
                from_response=lambda a: {(self.kind, memory_id): memory_state(a["memory"])})

    def delete(self, w: Worker) -> None:
        picked = self._pick(w)
        if picked is None:
            return None
        memory_id, _ = picked
        w.write("memory.delete", "DELETE", f"/v1/memories/{q(memory_id)}", None,
                {(self.kind, memory_id): None}, params={"actor": "user"})

    def rollback(self, w: Worker) -> None:
        """RV10: a regenerate removes what that turn wrote; pinned items stay (RV11)."""
        chats = sorted(w.ledger.items("chat"))
        if not chats:
            return None
        chat_id = w.rng.choice(chats)
        turn_id = f"{w.owner}-turn {w.rng.randint(1, TURNS)}"
        effects: dict[Key, State | None] = {
            (self.kind, mid): None for mid, m in w.ledger.items(self.kind).items()
            if m["chat_id"] == chat_id and m["turn_id"] == turn_id and not m["pinned"]}
        w.write("turn.rollback", "POST", f"/v1/chats/{q(chat_id)}/turns/{q(turn_id)}/rollback", {},
                effects)

    def list(self, w: Worker) -> None:
        w.read("memory.list", "GET", "/v1/memories", params={"scope": "global"})

    def for_turn(self, w: Worker) -> None:
        chats = sorted(w.ledger.items("chat"))
        cast = sorted(w.ledger.items("character"))
        if not chats or not cast:
            return None
        w.read("memory.for_turn", "GET", "/v1/memories/for-turn",
               params={"chat_id": w.rng.choice(chats), "speaker_id": w.rng.choice(cast)})

    def snapshot(self, client: Client) -> dict[str, dict[Key, State]]:
        out: dict[str, dict[Key, State]] = {}
        for archived in ("false", "true"):
            for m in _get(client, "/v1/memories", {"archived": archived})["memories"]:
                out.setdefault(memory_owner(m["text"]), {})[(self.kind, m["id"])] = memory_state(m)
        return out


# --- messages (POST batch, DELETE one; chats DELETE and rename: RV1, SW9a) -----------------------
MESSAGE_FIELDS = ("role", "name", "text", "turn_id", "speaker_id", "version")
MESSAGES_CAP = 40      # own messages per chat


def message_key(chat_id: str, message_id: str) -> Key:
    return ("message", f"{chat_id}\n{message_id}")   # ids are unique within a chat only


def message_state(m: dict) -> State:
    return {k: m[k] for k in MESSAGE_FIELDS}


class Messages(Family):
    kind = "message"

    def __init__(self, destructive: bool = True) -> None:
        # A non-destructive family only adds and edits: its chats grow long enough for compaction.
        self.destructive = destructive

    def writes(self) -> list[tuple[float, Op]]:
        if not self.destructive:
            return [(3.0, self.upsert)]
        return [(3.0, self.upsert), (0.6, self.delete), (0.05, self.delete_chat), (0.1, self.rename_chat)]

    def reads(self) -> list[tuple[float, Op]]:
        return [(0.5, self.list)]

    def _in_chat(self, w: Worker, chat_id: str) -> dict[str, State]:
        prefix = chat_id + "\n"
        return {k[len(prefix):]: v for k, v in w.ledger.items(self.kind).items() if k.startswith(prefix)}

    @needs_model
    def upsert(self, w: Worker) -> None:
        """A batch: one to three new messages, sometimes an edit of an earlier one (idempotent by id)."""
        chats = sorted(w.ledger.items("chat"))
        if not chats:
            return None
        chat_id = w.rng.choice(chats)
        have = self._in_chat(w, chat_id)
        batch, effects = [], {}
        if have and w.rng.random() < 0.3:
            message_id = w.rng.choice(sorted(have))
            text = f"{have[message_id]['text']} (edited {w.next_serial()})"
            batch.append({"id": message_id, "role": have[message_id]["role"], "name": have[message_id]["name"],
                          "text": text})
            effects[message_key(chat_id, message_id)] = {**have[message_id], "text": text,
                                                         "version": have[message_id]["version"] + 1}
        cast = sorted(w.ledger.items("character"))
        for _ in range(w.rng.randint(1, 3) if len(have) < MESSAGES_CAP else 0):
            n = w.next_serial()
            user = w.rng.random() < 0.5 or not cast
            # Replies get their own turn ids: the rollbacks of the memory family (turns 1..TURNS)
            # would otherwise also cancel the summary jobs these messages start.
            turn_id = None if user else f"{w.owner}-reply {n}"
            speaker = None if user else w.rng.choice(cast)
            message = {"id": f"{w.owner}-msg {n}", "role": "user" if user else "assistant",
                       "name": "You" if user else "Hero", "text": f"Line {n}: {w.rng.choice(PHRASES)}",
                       "turn_id": turn_id, "speaker_id": speaker}
            batch.append(message)
            effects[message_key(chat_id, message["id"])] = {**{k: message[k] for k in MESSAGE_FIELDS[:-1]},
                                                            "version": 1}
        if batch:
            w.write("messages.upsert", "POST", f"/v1/chats/{q(chat_id)}/messages", {"messages": batch}, effects)

    def delete(self, w: Worker) -> None:
        chats = sorted(w.ledger.items("chat"))
        if not chats:
            return None
        chat_id = w.rng.choice(chats)
        have = sorted(self._in_chat(w, chat_id))
        if not have:
            return None
        message_id = w.rng.choice(have)
        w.write("message.delete", "DELETE", f"/v1/chats/{q(chat_id)}/messages/{q(message_id)}", None,
                {message_key(chat_id, message_id): None})

    def delete_chat(self, w: Worker) -> None:
        """The chat and its messages go; saved memories stay (RV4)."""
        chats = sorted(w.ledger.items("chat"))
        if len(chats) < 2:
            return None
        chat_id = w.rng.choice(chats)
        effects: dict[Key, State | None] = {("chat", chat_id): None}
        effects.update({message_key(chat_id, m): None for m in self._in_chat(w, chat_id)})
        w.write("chat.delete", "DELETE", f"/v1/chats/{q(chat_id)}", None, effects)

    def rename_chat(self, w: Worker) -> None:
        """SillyTavern renamed the chat file: messages and memories' provenance follow the new id."""
        chats = sorted(w.ledger.items("chat"))
        if not chats:
            return None
        old = w.rng.choice(chats)
        new = f"{w.owner}-Renamed - 2026-12-01@10h00m{w.next_serial():02d}s"
        effects: dict[Key, State | None] = {("chat", old): None, ("chat", new): w.ledger.confirmed[("chat", old)]}
        for message_id, state in self._in_chat(w, old).items():
            effects[message_key(old, message_id)] = None
            effects[message_key(new, message_id)] = state
        for memory_id, m in w.ledger.items("memory").items():
            if m["chat_id"] == old:
                effects[("memory", memory_id)] = {**m, "chat_id": new}
        w.write("chat.rename", "POST", f"/v1/chats/{q(old)}/rename", {"new_id": new}, effects)

    def list(self, w: Worker) -> None:
        chats = sorted(w.ledger.items("chat"))
        if chats:
            w.read("messages.list", "GET", f"/v1/chats/{q(w.rng.choice(chats))}/messages")

    def snapshot(self, client: Client) -> dict[str, dict[Key, State]]:
        out: dict[str, dict[Key, State]] = {}
        for chat in _get(client, "/v1/chats")["chats"]:
            page = _get(client, f"/v1/chats/{q(chat['id'])}/messages")
            assert page["total"] == len(page["messages"]), "one page holds a test chat"
            for m in page["messages"]:
                out.setdefault(owner_of_id(chat["id"]), {})[message_key(chat["id"], m["id"])] = message_state(m)
        return out


# --- lore (POST, PATCH with version, DELETE: SW7) ------------------------------------------------
LORE_FIELDS = ("title", "text", "triggers", "always", "enabled", "known_by", "version")
LORE_CAP = 10          # own entries per worker


def lore_state(e: dict) -> State:
    return {k: e[k] for k in LORE_FIELDS}


class Lore(Family):
    """Lore entries and story cards; each worker's titles start with "[owner]"."""

    kind = "lore"
    route = ("GET", "/v1/lore")

    def writes(self) -> list[tuple[float, Op]]:
        return [(1.5, self.create), (1.0, self.edit), (0.4, self.delete)]

    def reads(self) -> list[tuple[float, Op]]:
        return [(0.5, self.list)]

    @needs_model
    def create(self, w: Worker) -> None:
        if len(w.ledger.items(self.kind)) >= LORE_CAP:
            return self.delete(w)
        n = w.next_serial()
        place = w.rng.choice(["Harbour", "Mill", "Chapel", "Gate"])
        body = {"title": f"[{w.owner}] {place} {n}", "text": f"The {place.lower()} {n}: {w.rng.choice(PHRASES)}",
                "triggers": [place.lower(), f"{place.lower()} {n}"]}
        cast = sorted(w.ledger.items("character"))
        if cast and w.rng.random() < 0.3:
            body["known_by"] = [w.rng.choice(cast)]
        state = {"title": body["title"], "text": body["text"], "triggers": body["triggers"], "always": False,
                 "enabled": True, "known_by": body.get("known_by"), "version": 1}
        w.write("lore.create", "POST", "/v1/lore", body, {}, creates=[(self.kind, state)],
                from_response=lambda a: {(self.kind, a["entry"]["id"]): lore_state(a["entry"])})

    @needs_model
    def edit(self, w: Worker) -> None:
        own = w.ledger.items(self.kind)
        if not own:
            return self.create(w)
        lore_id = w.rng.choice(sorted(own))
        old = own[lore_id]
        change = {"text": f"{old['text'].split(' (rev')[0]} (rev {w.next_serial()})",
                  "enabled": w.rng.random() < 0.9}
        body = {**change, "version": old["version"]}  # a stale version would be 409
        state = {**old, **change, "version": old["version"] + 1}
        w.write("lore.edit", "PATCH", f"/v1/lore/{q(lore_id)}", body, {(self.kind, lore_id): state},
                from_response=lambda a: {(self.kind, lore_id): lore_state(a["entry"])})

    def delete(self, w: Worker) -> None:
        own = sorted(w.ledger.items(self.kind))
        if own:
            lore_id = w.rng.choice(own)
            w.write("lore.delete", "DELETE", f"/v1/lore/{q(lore_id)}", None, {(self.kind, lore_id): None})

    def list(self, w: Worker) -> None:
        w.read("lore.list", "GET", "/v1/lore")

    def snapshot(self, client: Client) -> dict[str, dict[Key, State]]:
        out: dict[str, dict[Key, State]] = {}
        if not self.available(client):
            return out
        for e in _get(client, "/v1/lore")["lore"]:
            out.setdefault(memory_owner(e["title"]), {})[(self.kind, e["id"])] = lore_state(e)
        return out


# --- context (POST /v1/context: the per-turn assembly, a read for the ledger) ------------------
class Context(Family):
    """The extension's call before every generation; it writes only statistics (no ledger items)."""

    kind = "context"
    route = ("POST", "/v1/context")

    def reads(self) -> list[tuple[float, Op]]:
        return [(2.0, self.assemble)]

    def assemble(self, w: Worker) -> None:
        chats = w.ledger.items("chat")
        if not chats:
            return None
        chat_id = w.rng.choice(sorted(chats))
        members = chats[chat_id]["member_ids"]
        body = {"chat_id": chat_id, "speaker_id": w.rng.choice(members), "present_ids": members,
                "context_tokens": w.rng.choice([2048, 8192]), "generation_type": "normal",
                "last_action": {"text": f"I ask about the {w.rng.choice(['harbour', 'mill', 'gate'])}.",
                                "kind": "action"}}
        # 404: the chat was deleted or renamed by a write of this worker cut by a kill.
        w.read("context", "POST", "/v1/context", ok=(200, 404), body=body)

    def snapshot(self, client: Client) -> dict[str, dict[Key, State]]:
        return {}


FAMILIES: list[Family] = [Characters(), Chats(), Memories(), Messages(), Lore(), Context()]
# A caller that only writes the transcript (a long chat that keeps background jobs busy).
SCRIBE_FAMILIES: list[Family] = [Characters(), Chats(), Messages(destructive=False)]


def snapshot(client: Client, families: list[Family] | None = None) -> dict[str, dict[Key, State]]:
    """The whole store as read through the API, grouped by owner."""
    merged: dict[str, dict[Key, State]] = {}
    for family in families if families is not None else FAMILIES:
        for owner, items in family.snapshot(client).items():
            merged.setdefault(owner, {}).update(items)
    return merged


def reconcile(workers: list[Worker], client: Client, families: list[Family] | None = None) -> list[str]:
    """Check every worker's ledger against the store; items of no known owner are problems too."""
    store = snapshot(client, families)
    problems: list[str] = []
    owners = {w.owner for w in workers}
    for w in workers:
        problems += w.ledger.reconcile(store.get(w.owner, {}))
    for owner, items in store.items():
        if owner not in owners:
            problems.append(f"items of unknown owner {owner!r}: {list(items)[:5]}")
    return problems
