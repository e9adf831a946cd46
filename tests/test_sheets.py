"""Character sheets (SW1): provenance and locks, rendering for a viewer (secrets, SW9b), and the
SillyTavern character card import (JSON and PNG)."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from pathlib import Path

import pytest

from server_plugin.errors import NotFound
from server_plugin.story import characters, sheets
from tests.helpers.api import expect_error, expect_ok

SHEET = {"personality": "Brave.", "appearance": "Red hair.",
         "secrets": [{"text": "Stole the crown."}, {"text": "Loves Bren.", "known_by": ["cid.png"]}]}


def put(api, cid, status=None, **body):
    body.setdefault("name", cid.split(".")[0].title())
    response = api.put(f"/v1/characters/{cid}", json=body)
    return response if status is None else expect_ok(response, status, "character.response")["character"]


# --- provenance and locks ----------------------------------------------------------------------

def test_sw1_person_fields_are_recorded_and_protected_from_the_model(api):
    """rule SW1: fields a person wrote are never overwritten by the model (403, nothing changed)."""
    ayla = put(api, "ayla.png", 201, sheet=SHEET)
    assert ayla["field_sources"] == {"personality": "user", "appearance": "user", "secrets": "user"}
    refused = put(api, "ayla.png", sheet={**SHEET, "personality": "Cruel."}, actor="model")
    body = expect_error(refused, 403, "field_protected")
    assert body["error"]["details"] == [{"fields": ["personality"]}]
    dropped = put(api, "ayla.png", sheet={"personality": "Brave."}, actor="background")
    assert expect_error(dropped, 403, "field_protected")["error"]["details"] == [
        {"fields": ["appearance", "secrets"]}]
    assert expect_ok(api.get("/v1/characters/ayla.png"))["character"]["sheet"] == SHEET


def test_sw1_model_fields_can_be_updated_by_the_model_until_a_person_writes_them(api):
    """rule SW1: what the model wrote it may update; once a person edits a field it is the person's."""
    put(api, "ayla.png", 201, sheet={"personality": "Brave."})
    grown = put(api, "ayla.png", 200, sheet={"personality": "Brave.", "habits": "Hums."}, actor="model")
    assert grown["field_sources"] == {"personality": "user", "habits": "model"}
    again = put(api, "ayla.png", 200, sheet={"personality": "Brave.", "habits": "Whistles."},
                actor="background")
    assert again["field_sources"]["habits"] == "background"
    mine = put(api, "ayla.png", 200, sheet={"personality": "Brave.", "habits": "Sings."})
    assert mine["field_sources"] == {"personality": "user", "habits": "user"}
    expect_error(put(api, "ayla.png", sheet={"personality": "Brave.", "habits": "x"}, actor="model"),
                 403, "field_protected")


def test_sw1_locked_fields_are_never_changed_by_a_model_and_only_a_person_locks(api):
    """rule SW1: a locked field stays, even one the model wrote; only a person sets locks."""
    put(api, "bren.png", 201, sheet={"mood": "Calm."}, actor="model")
    locked = put(api, "bren.png", 200, sheet={"mood": "Calm."}, locked_fields=["mood"])
    assert locked["locked_fields"] == ["mood"] and locked["field_sources"] == {"mood": "model"}
    expect_error(put(api, "bren.png", sheet={"mood": "Angry."}, actor="model"), 403, "field_protected")
    expect_error(put(api, "bren.png", sheet={"mood": "Calm."}, locked_fields=[], actor="model"),
                 403, "field_protected")
    assert put(api, "bren.png", 200, sheet={"mood": "Calm."}, actor="model")["locked_fields"] == ["mood"]


def test_sw1_update_sheet_applies_what_it_may_and_reports_the_rest(services):
    """rule SW1: a job's proposal sets unprotected fields and reports protected ones as refused;
    a recurring new character gets a drafted sheet."""
    characters.put(services, "ayla.png", {"name": "Ayla", "sheet": {"personality": "Brave."},
                                          "locked_fields": ["scars"]})
    out = characters.update_sheet(services, "ayla.png", {
        "personality": "Reckless.", "scars": "One.", "habits": "Hums."}, actor="background")
    assert out["applied"] == ["habits"] and sorted(out["refused"]) == ["personality", "scars"]
    assert out["character"]["sheet"] == {"personality": "Brave.", "habits": "Hums."}
    assert out["character"]["field_sources"] == {"personality": "user", "habits": "background"}
    drafted = characters.update_sheet(services, "guard.png", {"first_appearance": "Session 2"},
                                      actor="background", name="Gate guard")
    assert drafted["character"]["name"] == "Gate guard" and drafted["applied"] == ["first_appearance"]
    with pytest.raises(NotFound):
        characters.update_sheet(services, "nobody.png", {"x": "y"}, actor="model")


# --- rendering for a viewer -----------------------------------------------------------------

def test_sw1_sw9b_sheet_secrets_only_for_those_who_know():
    """rule SW1/SW9b: the owner always knows its secrets; known_by extends that; nobody else."""
    ayla = {"id": "ayla.png", "name": "Ayla", "aliases": ["Red"], "is_player": False, "sheet": {
        "personality": "Brave.", "first_appearance": "The inn.",
        "secrets": [{"text": "Stole the crown."}, {"text": "Loves Bren.", "known_by": ["cid.png"]}]}}
    own = sheets.render(ayla, "ayla.png")
    assert own == ("Ayla (also called Red)\nPersonality: Brave.\nFirst appearance: The inn.\n"
                   "Secrets:\n- Stole the crown.\n- Loves Bren.")
    assert sheets.render(ayla, "cid.png").endswith("Secrets:\n- Loves Bren.")
    other = sheets.render(ayla, "bren.png")
    assert "crown" not in other and "Loves" not in other and "Secrets" not in other
    assert "crown" in sheets.render(ayla, None)  # a person sees everything


# --- card import ---------------------------------------------------------------------------

def v2_card(**data):
    base = {"name": "Seraphina", "description": "{{char}} guards the glade for {{user}}.",
            "personality": "caring, protective", "scenario": "", "first_mes": "*You wake up.*",
            "mes_example": "", "creator_notes": "Contest winner", "system_prompt": "",
            "post_history_instructions": "", "alternate_greetings": ["Hi."], "tags": ["fantasy"],
            "creator": "Otis", "character_version": "1.0",
            "extensions": {"talkativeness": "0.5", "world": "Eldoria"},
            "character_book": {"name": "Eldoria", "entries": [
                {"id": 0, "keys": ["eldoria", "forest"], "secondary_keys": [], "comment": "eldoria",
                 "content": "{{char}} protects Eldoria, a forest.", "constant": False,
                 "selective": True, "insertion_order": 100, "enabled": True,
                 "position": "before_char", "use_regex": True,
                 "extensions": {"position": 0, "probability": 100, "depth": 4, "display_index": 0}},
                {"id": 1, "keys": ["shadowfang"], "content": "Beasts.", "enabled": True,
                 "insertion_order": 100, "extensions": {"group": "beasts"}}]}}
    base.update(data)
    return {"spec": "chara_card_v2", "spec_version": "2.0", "data": base}


def png_with_chunks(chunks: list[tuple[str, dict]]) -> bytes:
    """A real PNG (1x1 grey) with card text chunks, written here byte by byte."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
    out += chunk(b"IDAT", zlib.compress(b"\x00\x80"))
    for keyword, card in chunks:
        payload = base64.b64encode(json.dumps(card).encode("utf-8"))
        out += chunk(b"tEXt", keyword.encode() + b"\x00" + payload)
    return out + chunk(b"IEND", b"")


def test_card_import_v2_json_makes_a_sheet_and_lore(api):
    """rule SW1/SW7: a V2 card becomes a character with a sheet (its {{char}} replaced by its
    name), its character_book becomes lore, and the response names what was not mapped."""
    out = expect_ok(api.post("/v1/characters/import", json={"card": v2_card()}), 201,
                    "character_import.response")
    c = out["character"]
    assert c["id"] == "Seraphina.png" and c["name"] == "Seraphina"
    assert c["sheet"] == {"description": "Seraphina guards the glade for {{user}}.",
                          "personality": "caring, protective"}
    assert c["field_sources"] == {"description": "import", "personality": "import"}
    assert c["metadata"]["card"]["unmapped"]["first_mes"] == "*You wake up.*"
    lost = {n["field"] for n in out["report"]["not_mapped"]}
    assert lost == {"first_mes", "alternate_greetings", "creator_notes", "tags", "creator",
                    "character_version", "extensions"}
    eldoria = next(e for e in out["lore"] if e["title"] == "eldoria")
    assert eldoria["text"] == "Seraphina protects Eldoria, a forest."
    assert eldoria["triggers"] == ["eldoria", "forest"] and eldoria["source"] == "import"
    assert eldoria["metadata"]["import"]["character_id"] == "Seraphina.png"
    book = {r["title"]: r for r in out["report"]["lore"]}
    assert book["eldoria"]["not_mapped"] == []  # defaults only (use_regex is ignored by ST too)
    assert [n["field"] for n in out["report"]["lore"][1]["not_mapped"]] == ["extensions.group"]
    # An imported sheet is a person's writing: the model may not overwrite it (SW1).
    expect_error(api.put("/v1/characters/Seraphina.png", json={
        "name": "Seraphina", "sheet": {"description": "x", "personality": "caring, protective"},
        "actor": "model"}), 403, "field_protected")


def test_card_import_conflict_and_replace(api, services):
    """A second import of the same id is a 409; with replace, the unedited lore of the previous
    import is replaced rather than doubled."""
    first = expect_ok(api.post("/v1/characters/import", json={"card": v2_card(), "id": "s.png"}), 201)
    expect_error(api.post("/v1/characters/import", json={"card": v2_card(), "id": "s.png"}),
                 409, "character_exists")
    edited = first["lore"][1]["id"]
    api.patch(f"/v1/lore/{edited}", json={"text": "Beasts of the dark wood."})
    again = expect_ok(api.post("/v1/characters/import", json={
        "card": v2_card(personality="stern"), "id": "s.png", "replace": True}), 200,
        "character_import.response")
    assert again["report"]["replaced"] is True
    assert again["report"]["removed_lore_ids"] == [first["lore"][0]["id"]]
    assert again["character"]["sheet"]["personality"] == "stern"
    count = services.db.reader().execute("SELECT count(*) FROM lore").fetchone()[0]
    assert count == 3  # the edited entry stays, two new ones


def test_card_import_from_a_png_prefers_ccv3(api):
    """A PNG card: the 'ccv3' chunk wins over 'chara' (as in SillyTavern); a data: URL prefix is fine."""
    v3 = v2_card(name="Nova", nickname="Nov", character_book=None)
    v3["spec"], v3["spec_version"] = "chara_card_v3", "3.0"
    png = png_with_chunks([("chara", v2_card(name="Old", character_book=None)), ("ccv3", v3)])
    sent = "data:image/png;base64," + base64.b64encode(png).decode()
    out = expect_ok(api.post("/v1/characters/import", json={"png_base64": sent}), 201,
                    "character_import.response")
    assert out["character"]["name"] == "Nova" and out["character"]["aliases"] == ["Nov"]
    assert out["report"]["spec"] == "chara_card_v3" and out["lore"] == []
    only_v2 = png_with_chunks([("chara", v2_card(name="Vee", character_book=None))])
    out = expect_ok(api.post("/v1/characters/import", json={
        "png_base64": base64.b64encode(only_v2).decode()}), 201)
    assert out["character"]["id"] == "Vee.png"


def test_card_import_v1_and_bad_input(api):
    """A V1 card (flat fields) imports; a PNG without a card, or no PNG at all, is a 422."""
    out = expect_ok(api.post("/v1/characters/import", json={"card": {
        "name": "Old Tom", "description": "A fisherman.", "first_mes": "Ahoy."}}), 201)
    assert out["character"]["sheet"] == {"description": "A fisherman."}
    assert out["report"]["spec"] == "chara_card_v1"
    bare = png_with_chunks([])
    expect_error(api.post("/v1/characters/import", json={
        "png_base64": base64.b64encode(bare).decode()}), 422, "invalid_card")
    expect_error(api.post("/v1/characters/import", json={
        "png_base64": base64.b64encode(b"GIF89a....").decode()}), 422, "invalid_card")
    expect_error(api.post("/v1/characters/import", json={"card": {"description": "no name"}}),
                 422, "invalid_card")


SERAPHINA = Path.home() / (".cache/chronicler-e2e/st-1.19.0/node_modules/sillytavern/"
                           "default/content/default_Seraphina.png")


@pytest.mark.skipif(not SERAPHINA.exists(), reason="SillyTavern's npm package is not installed here")
def test_card_import_sillytaverns_own_default_card(api):
    """SillyTavern's shipped card (default_Seraphina.png) imports with its Eldoria book."""
    sent = base64.b64encode(SERAPHINA.read_bytes()).decode()
    out = expect_ok(api.post("/v1/characters/import", json={"png_base64": sent,
                                                            "id": "default_Seraphina.png"}), 201,
                    "character_import.response")
    assert out["character"]["name"] == "Seraphina"
    assert "Seraphina" in out["character"]["sheet"]["description"]
    assert {e["title"] for e in out["lore"]} >= {"eldoria", "shadowfang"}


# --- sheets grow with play (SW1) -------------------------------------------------------------

def test_sw1_a_new_named_speaker_gets_a_minimal_sheet_at_session_end(api, services):
    """rule SW1 (extractive): at session end a named speaker the cast does not know, with at least
    two lines, gets a sheet: name, first appearance and its lines verbatim; known speakers and
    one-line speakers get none; a person's edit then stands against the next draft."""
    from tests.helpers.conversation import drain, post, setup_chat

    setup_chat(api, title="The Harbour")
    lines = [("user", "Kai", "Who runs this ferry?"),
             ("assistant", "Old Tom", "I do, lad. Been rowing these waters forty years. Pay first."),
             ("assistant", "Ayla", "He is honest, Kai."),
             ("assistant", "Gull", "Caw!"),
             ("user", "Kai", "Here is a silver coin."),
             ("assistant", "Old Tom", "Aye, that will do.")]
    post(api, [{"id": f"m{i}", "role": role, "name": name, "text": text,
                "sent_at": f"2026-03-01T12:0{i}:00Z"} for i, (role, name, text) in enumerate(lines)])
    expect_ok(api.post("/v1/chats/c1/sessions/end", json={}))
    drain(services)
    tom = expect_ok(api.get("/v1/characters/old-tom"), 200, "character.response")["character"]
    assert tom["name"] == "Old Tom"
    assert tom["sheet"] == {
        "first_appearance": "Session 1 of The Harbour, 2026-03-01",
        "quotes": '"I do, lad. Been rowing these waters forty years. Pay first."\n"Aye, that will do."'}
    assert tom["field_sources"] == {"first_appearance": "background", "quotes": "background"}
    ids = {c["id"] for c in expect_ok(api.get("/v1/characters"))["characters"]}
    assert ids == {"ayla.png", "kai.png", "old-tom"}  # no sheet for Ayla (known) or Gull (one line)
    # A person edits the drafted sheet: a later model proposal cannot overwrite that field.
    put(api, "old-tom", 200, name="Old Tom", sheet={**tom["sheet"], "quotes": "(edited)"})
    out = characters.update_sheet(services, "old-tom", {"quotes": "new", "mood": "Gruff."},
                                  actor="model")
    assert out["refused"] == ["quotes"] and out["applied"] == ["mood"]
