"""Lore entries and story cards over HTTP (SW7), and the SillyTavern World Info import."""

from __future__ import annotations

import copy

from server_plugin.retrieval import docs as index
from tests.helpers.api import expect_error, expect_ok


def make(api, **fields):
    body = {"title": "Eldoria", "text": "Eldoria is a forest kingdom.", "triggers": ["eldoria"], **fields}
    return expect_ok(api.post("/v1/lore", json=body), 201, "lore.response")["entry"]


def doc_row(services, lore_id):
    return services.db.reader().execute(
        "SELECT * FROM docs WHERE kind='lore' AND ref_id=?", (lore_id,)).fetchone()


# --- CRUD --------------------------------------------------------------------------------------

def test_sw7_create_get_list_and_index_in_one_write(api, services):
    """rule SW7: an entry is stored with its fields and indexed for search (kind lore) at once."""
    entry = make(api, triggers=["Eldoria", " eldoria ", "magical  forest"], known_by=["b.png", "a.png"])
    assert entry["triggers"] == ["Eldoria", "magical forest"]  # repeats and spaces cleaned
    assert entry["known_by"] == ["a.png", "b.png"] and entry["source"] == "user"
    assert entry["always"] is False and entry["enabled"] is True and entry["version"] == 1
    got = expect_ok(api.get(f"/v1/lore/{entry['id']}"), 200, "lore.response")["entry"]
    assert got == entry
    listed = expect_ok(api.get("/v1/lore"), 200, "lore_list.response")["lore"]
    assert [e["id"] for e in listed] == [entry["id"]]
    row = doc_row(services, entry["id"])
    assert row["text"] == "Eldoria: Eldoria is a forest kingdom."
    assert row["known_by"] == '["a.png","b.png"]'
    assert index.orphans(services.db.reader()) == {k: 0 for k in index.orphans(services.db.reader())}


def test_sw7_list_filters(api):
    """rule SW7: the panel can find entries by text and by source."""
    make(api, title="Moon", text="The moon rules magic.", triggers=["moon"])
    make(api, title="Sea", text="Salt and storms.", triggers=["sea"])
    found = expect_ok(api.get("/v1/lore?q=MAGIC"), 200, "lore_list.response")["lore"]
    assert [e["title"] for e in found] == ["Moon"]
    assert expect_ok(api.get("/v1/lore?q=storm"), 200)["lore"][0]["title"] == "Sea"
    assert expect_ok(api.get("/v1/lore?source=import"), 200)["lore"] == []
    expect_error(api.get("/v1/lore?source=model"), 400, "invalid_request")


def test_sw7_patch_reindexes_and_checks_the_version(api, services):
    """rule SW7: lore is updated as sessions run; a stale version is refused (409)."""
    entry = make(api)
    patched = expect_ok(api.patch(f"/v1/lore/{entry['id']}", json={
        "text": "Eldoria fell to the Shadowfangs.", "version": 1}), 200, "lore.response")["entry"]
    assert patched["version"] == 2 and patched["text"] == "Eldoria fell to the Shadowfangs."
    assert doc_row(services, entry["id"])["text"] == "Eldoria: Eldoria fell to the Shadowfangs."
    expect_error(api.patch(f"/v1/lore/{entry['id']}", json={"always": True, "version": 1}),
                 409, "version_conflict")
    only_known = expect_ok(api.patch(f"/v1/lore/{entry['id']}", json={"known_by": ["x.png"]}), 200)
    assert only_known["entry"]["known_by"] == ["x.png"]
    assert doc_row(services, entry["id"])["known_by"] == '["x.png"]'


def test_sw7_delete_removes_row_index_and_stats(api, services):
    """rule SW7/QS5: deleting an entry removes its index entry and its per-chat statistics."""
    entry = make(api)
    api.put("/v1/chats/c1", json={"member_ids": []})
    with services.db.write() as conn:
        conn.execute("INSERT INTO lore_stats(chat_id, lore_id, uses, last_turn, last_used_at)"
                     " VALUES ('c1', ?, 3, 7, 'x')", (entry["id"],))
    assert expect_ok(api.delete(f"/v1/lore/{entry['id']}"), 200, "deleted.response") == {
        "deleted": entry["id"]}
    assert doc_row(services, entry["id"]) is None
    assert services.db.reader().execute("SELECT count(*) FROM lore_stats").fetchone()[0] == 0
    expect_error(api.get(f"/v1/lore/{entry['id']}"), 404, "lore_not_found")
    expect_error(api.delete(f"/v1/lore/{entry['id']}"), 404, "lore_not_found")


def test_sw7_limits_default(api):
    """rule SW7: text size and trigger count are bounded (422 with the limit)."""
    expect_error(api.post("/v1/lore", json={"text": "x" * 32001}), 422, "text_too_long")
    expect_error(api.post("/v1/lore", json={"text": "   "}), 422, "text_empty")
    expect_error(api.post("/v1/lore", json={"text": "x", "triggers": [f"t{i}" for i in range(101)]}),
                 422, "too_many_triggers")
    expect_error(api.post("/v1/lore", json={"text": "x", "trigger": ["a"]}), 400, "invalid_request")


def test_sw7_limits_are_settings(overrides, request):
    """rule SW7: the limits come from the settings table (lore_max_chars, lore_max_triggers)."""
    overrides.update(lore_max_chars=10, lore_max_triggers=1)
    api = request.getfixturevalue("api")
    make(api, text="0123456789", triggers=["one"])
    body = expect_error(api.post("/v1/lore", json={"text": "01234567890"}), 422, "text_too_long")
    assert body["error"]["details"] == [{"max": 10, "length": 11}]
    expect_error(api.post("/v1/lore", json={"text": "x", "triggers": ["a", "b"]}), 422,
                 "too_many_triggers")


# --- World Info import -------------------------------------------------------------------------

ST_ENTRY = {  # a SillyTavern 1.19 entry as its editor writes it (defaults everywhere)
    "uid": 0, "key": [], "keysecondary": [], "comment": "", "content": "", "constant": False,
    "vectorized": False, "selective": True, "selectiveLogic": 0, "addMemo": True, "order": 100,
    "position": 0, "disable": False, "ignoreBudget": False, "excludeRecursion": False,
    "preventRecursion": False, "matchPersonaDescription": False, "matchCharacterDescription": False,
    "matchCharacterPersonality": False, "matchCharacterDepthPrompt": False, "matchScenario": False,
    "matchCreatorNotes": False, "delayUntilRecursion": 0, "probability": 100, "useProbability": True,
    "depth": 4, "outletName": "", "group": "", "groupOverride": False, "groupWeight": 100,
    "scanDepth": None, "caseSensitive": None, "matchWholeWords": None, "useGroupScoring": None,
    "automationId": "", "role": None, "sticky": 0, "cooldown": 0, "delay": 0, "triggers": [],
    "displayIndex": 0,
}


def st_entry(uid, **fields):
    entry = copy.deepcopy(ST_ENTRY)
    entry.update(uid=uid, displayIndex=uid, **fields)
    return entry


def world():
    return {"entries": {
        "0": st_entry(0, key=["eldoria", "magical forest"], comment="Eldoria",
                      content="Eldoria is the forest kingdom."),
        "1": st_entry(1, key=["shadowfang", "/shadow ?fangs?/i"], keysecondary=["wolf"],
                      selectiveLogic=2, comment="Shadowfangs", content="Wolves of shadow.",
                      probability=40, position=4, depth=2, group="beasts", caseSensitive=True),
        "2": st_entry(2, key=[], comment="Rule of the world", content="Magic costs memories.",
                      constant=True),
        "3": st_entry(3, key=["glade"], comment="Old glade", content="Abandoned.", disable=True),
        "4": st_entry(4, key=["empty"], comment="Nothing here", content="  "),
    }, "name": "Eldoria"}


def test_wi_import_maps_keys_content_comment_constant_disable(api, services):
    """rule SW7: a World Info file becomes lore: key -> triggers, content -> text, comment ->
    title, constant -> always, disable -> not enabled; what is unused stays in metadata."""
    out = expect_ok(api.post("/v1/lore/import", json={"world_info": world()}), 201,
                    "lore_import.response")
    by_title = {e["title"]: e for e in out["lore"]}
    assert sorted(by_title) == ["Eldoria", "Old glade", "Rule of the world", "Shadowfangs"]
    eldoria = by_title["Eldoria"]
    assert (eldoria["text"], eldoria["triggers"], eldoria["always"], eldoria["enabled"]) == (
        "Eldoria is the forest kingdom.", ["eldoria", "magical forest"], False, True)
    assert eldoria["source"] == "import"
    assert eldoria["metadata"]["import"] == {"format": "sillytavern_world_info", "world": "Eldoria",
                                             "ref": "0"}
    assert eldoria["metadata"]["sillytavern"]["uid"] == 0
    assert by_title["Rule of the world"]["always"] is True
    assert by_title["Old glade"]["enabled"] is False
    fangs = by_title["Shadowfangs"]
    assert fangs["triggers"] == ["shadowfang", "/shadow ?fangs?/i"]  # a regex key is a trigger
    assert "regex_keys" not in fangs["metadata"]["sillytavern"]
    assert fangs["metadata"]["matching"] == {"whole_words": "auto", "case_sensitive": True}
    assert fangs["metadata"]["sillytavern"]["keysecondary"] == ["wolf"]
    assert fangs["metadata"]["sillytavern"]["probability"] == 40
    assert services.db.reader().execute(
        "SELECT count(*) FROM docs WHERE kind='lore'").fetchone()[0] == 4


def test_wi_import_reports_what_was_not_mapped_per_entry(api):
    """rule SW7: the response says per entry what was not mapped (secondary keys and their logic,
    probability, position, depth, groups, case sensitivity, regex keys) and what was skipped."""
    out = expect_ok(api.post("/v1/lore/import", json={"world_info": world()}), 201,
                    "lore_import.response")
    report = {e["ref"]: e for e in out["report"]["entries"]}
    assert report["0"]["status"] == "imported" and report["0"]["not_mapped"] == []
    lost = {n["field"]: n for n in report["1"]["not_mapped"]}
    assert set(lost) == {"keysecondary", "selectiveLogic", "probability", "position", "depth", "group"}
    assert lost["selectiveLogic"]["value"] == 2 and "NOT ANY" in lost["selectiveLogic"]["note"]
    assert "in the chat at a depth" in lost["position"]["note"]
    assert report["2"]["not_mapped"] == []  # constant with no keys: fine, it is 'always'
    assert report["4"] == {"ref": "4", "title": "Nothing here", "status": "skipped",
                           "reason": "empty_text", "id": None, "not_mapped": [],
                           "mapped": report["4"]["mapped"]}
    assert [m["field"] for m in report["4"]["mapped"]] == ["matchWholeWords"]
    ids = {e["id"] for e in out["lore"]}
    assert {report[r]["id"] for r in "0123"} == ids
    assert any("whole words" in n for n in out["report"]["notes"])


def test_wi_import_is_all_or_nothing(api, services):
    """An import with one entry over a limit writes nothing and names the entry."""
    doc = world()
    doc["entries"]["3"]["content"] = "x" * 40000
    body = expect_error(api.post("/v1/lore/import", json={"world_info": doc}), 422, "text_too_long")
    assert "entry '3'" in body["error"]["message"]
    assert services.db.reader().execute("SELECT count(*) FROM lore").fetchone()[0] == 0
    assert services.db.reader().execute("SELECT count(*) FROM docs").fetchone()[0] == 0


def test_wi_import_dry_run_writes_nothing(api, services):
    """A dry run reports the mapping and writes nothing."""
    out = expect_ok(api.post("/v1/lore/import", json={"world_info": world(), "dry_run": True}), 200,
                    "lore_import.response")
    assert out["lore"] == [] and out["report"]["dry_run"] is True
    assert [e["status"] for e in out["report"]["entries"]] == ["would_import"] * 4 + ["skipped"]
    assert services.db.reader().execute("SELECT count(*) FROM lore").fetchone()[0] == 0


def test_wi_import_character_book_array_and_known_by(api):
    """An array of character book entries (keys, secondary_keys, enabled, extensions) imports too;
    `known_by` restricts every imported entry (SW9b)."""
    doc = {"name": "Ayla's book", "scan_depth": 8, "entries": [
        {"id": 7, "keys": ["amulet"], "secondary_keys": ["gold"], "selective": True,
         "content": "Ayla's amulet hides a map.", "comment": "Amulet", "enabled": True,
         "insertion_order": 50, "extensions": {"probability": 10, "display_index": 0, "depth": 4}},
        {"keys": ["ring"], "content": "A plain ring.", "name": "Ring", "enabled": False},
    ]}
    out = expect_ok(api.post("/v1/lore/import", json={"world_info": doc, "known_by": ["ayla.png"]}),
                    201, "lore_import.response")
    amulet, ring = out["lore"] if out["lore"][0]["title"] == "Amulet" else out["lore"][::-1]
    assert amulet["triggers"] == ["amulet"] and amulet["known_by"] == ["ayla.png"]
    assert ring["enabled"] is False and ring["title"] == "Ring"
    lost = {n["field"] for n in out["report"]["entries"][0]["not_mapped"]}
    assert lost == {"secondary_keys", "selective", "insertion_order", "extensions.probability"}
    assert out["report"]["not_mapped"] == [
        {"field": "scan_depth", "value": 8, "note": "world-level settings are not applied"}]


def test_wi_import_rejects_what_is_not_world_info(api):
    """A body that is not a World Info file is a 400 (schema) or 422 (entries not objects)."""
    expect_error(api.post("/v1/lore/import", json={"world_info": {"name": "x"}}), 400, "invalid_request")
    expect_error(api.post("/v1/lore/import", json={"world_info": {"entries": {"0": "text"}}}),
                 422, "invalid_world_info")


def test_wi_import_maps_match_whole_words_true_false_and_null_and_says_what_null_became(api):
    """rules SW7, LG1: matchWholeWords true -> "on", false -> "off", null (SillyTavern's
    global setting) -> the automatic rule, which the report names; the cards then fire so in a
    context call ("turm" off fires inside a German compound; on/auto do not)."""
    doc = {"entries": {
        "0": st_entry(0, key=["turm"], comment="on", content="Card on.", matchWholeWords=True),
        "1": st_entry(1, key=["turm"], comment="off", content="Card off.", matchWholeWords=False),
        "2": st_entry(2, key=["turm"], comment="auto", content="Card auto.", matchWholeWords=None),
        "3": st_entry(3, key=["黑塔"], comment="tower", content="Card tower.", matchWholeWords=None),
    }}
    out = expect_ok(api.post("/v1/lore/import", json={"world_info": doc}), 201, "lore_import.response")
    modes = {e["title"]: e["metadata"]["matching"]["whole_words"] for e in out["lore"]}
    assert modes == {"on": "on", "off": "off", "auto": "auto", "tower": "auto"}
    report = {e["title"]: e for e in out["report"]["entries"]}
    assert report["on"]["mapped"] == [] and report["off"]["mapped"] == []
    assert [m["field"] for m in report["auto"]["mapped"]] == ["matchWholeWords"]
    assert "automatic" in report["auto"]["mapped"][0]["note"]
    assert all(n["field"] != "matchWholeWords" for n in report["auto"]["not_mapped"])
    expect_ok(api.put("/v1/characters/kai", json={"name": "Kai"}), 201)
    expect_ok(api.put("/v1/chats/c", json={"member_ids": ["kai"]}), 201)
    body = {"chat_id": "c", "speaker_id": "kai", "context_tokens": 4000,
            "last_action": {"text": "Wir gehen zur Schwarzturmstraße und dann zum 黑塔看看。"}}
    ctx = expect_ok(api.post("/v1/context", json=body), 200, "context.response")
    cards = "".join(b["text"] for b in ctx["blocks"] if b["section"] == "story_cards")
    assert "Card off." in cards and "Card tower." in cards
    assert "Card on." not in cards and "Card auto." not in cards
