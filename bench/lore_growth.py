"""Lore that grows with play (SW7): a three-session campaign through the real pipeline, with its
lore figures.

The transcript introduces places (the port city of Veyra, a hidden sea cave only Ayla and the
player see), a faction (the Council of Nine), an item and a custom, and in its third session
changes the council. Before it, a person writes one entry (the Harbour) and imports one from
World Info (the Lighthouse), which a model must not overwrite. Every session end runs the
lore-growth job: with `--url` on an OpenAI-compatible model (a real one: llama.cpp's server,
a hosted API), else extractively (the pattern-only fallback). With `--review` the proposals wait,
and the bench accepts those that rest on their sources and rejects the rest, as a careful person
would.

Prints, for the run: proposals, applied at once, waiting (review, protected), accepted, rejected,
dropped by the grounding check (from the jobs' results), how many proposals rest on their sources
(every name and number of the text, the title and each trigger found in the cited messages), and
which grown entries fire in a later turn.

    .venv/bin/python bench/lore_growth.py [--url http://127.0.0.1:8080/v1 --model NAME [--json-mode json_schema]] [--review]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from server_plugin.app import build_services, create_app  # noqa: E402
from server_plugin.core.grounding import ungrounded  # noqa: E402
from server_plugin.jobs import queue, worker  # noqa: E402
from server_plugin.settings import load_settings  # noqa: E402

TOKEN = "bench-token-0123456789"
T0 = datetime(2026, 3, 1, 18, 0, tzinfo=timezone.utc)
CAST = {"ayla.png": "Ayla", "kai.png": "Kai"}
SESSIONS = [
    [("kai.png", "Where does this ferry take us, Ayla?"),
     ("ayla.png", '*The ferry docks at Veyra, a walled port city of white stone.* "Veyra is ruled by the '
                  'Council of Nine, nine magistrates who meet in the Glass Hall each new moon."'),
     ("kai.png", "Do the magistrates let strangers in?"),
     ("ayla.png", '"Only with a salt token. Every traveller must carry one; without it the Harbour '
                  'Watch turns you back at the gate."'),
     ("kai.png", "Then we buy two salt tokens at the pier.")],
    [("ayla.png", '*Ayla lifts the lantern.* "Gullmouth Cave. The smugglers hide their boats here; '
                  'nobody else knows of it, Kai. Keep it that way."'),
     ("kai.png", "I swear I will tell no one about Gullmouth."),
     ("ayla.png", '"In Veyra it is a custom to leave a white pebble at the Glass Hall when you ask the '
                  'council for anything."')],
    [("ayla.png", '"News from the pier: the Council of Nine was dissolved last night, and the Harbour '
                  'Watch now answers to the Lighthouse Keeper."'),
     ("kai.png", "So the Glass Hall stands empty now?")],
]
LATER = "Kai asks whether the Council of Nine could ever meet again in the Glass Hall."


def call(client: Any, method: str, path: str, body: Any = None) -> Any:
    response = client.open(path, method=method, json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    if response.status_code >= 400:
        raise SystemExit(f"{method} {path}: {response.status_code} {response.get_data(as_text=True)[:300]}")
    return response.get_json()


def play(client: Any, svc: Any) -> dict[str, str]:
    """Post the sessions (hours apart), ending each; run the jobs. Returns message id -> text."""
    texts: dict[str, str] = {}
    for n, lines in enumerate(SESSIONS):
        at = T0 + timedelta(days=n)
        batch = []
        for i, (speaker, text) in enumerate(lines):
            mid = f"s{n + 1}m{i + 1}"
            texts[mid] = text
            batch.append({"id": mid, "role": "user" if speaker == "kai.png" else "assistant",
                          "name": CAST[speaker], "speaker_id": speaker, "text": text,
                          "sent_at": (at + timedelta(minutes=i)).isoformat(), "turn_id": f"t{n}-{i}"})
        call(client, "POST", "/v1/chats/bench/messages", {"messages": batch})
        call(client, "POST", "/v1/chats/bench/sessions/end", {})
        worker.run_pending(svc)
    return texts


def rests_on(p: dict[str, Any], texts: dict[str, str]) -> bool:
    """Every name and number of the text, the title and each trigger is in the cited messages."""
    sources = [texts[m] for m in p["sources"] if m in texts]
    folded = " ".join(sources).casefold()
    return (bool(sources) and not ungrounded(p["text"], sources) and not ungrounded(p["title"], sources, whole=True)
            and all(t.casefold() in folded for t in p["triggers"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="an OpenAI-compatible endpoint (default: extractive, no model)")
    ap.add_argument("--model", default="local")
    ap.add_argument("--json-mode", default="off", choices=("off", "json_object", "json_schema"),
                    help="llm_json_mode (json_schema: llama.cpp holds the answer to each task's shape)")
    ap.add_argument("--review", action="store_true", help="proposals wait; the bench accepts or rejects them")
    args = ap.parse_args()
    data = Path(tempfile.mkdtemp(prefix="chronicler-lore-bench-"))
    values = {"data_dir": str(data), "token": TOKEN, "worker_enabled": False,
              "lore_growth_review": "review" if args.review else "apply",
              "live_window_max_messages": 50, "deep_memory_min_new_messages": 10_000}
    if args.url:
        values.update(llm_mode="openai", llm_url=args.url, llm_model=args.model, llm_read_timeout=600,
                      llm_json_mode=args.json_mode)
    else:
        values.update(llm_mode="extractive")
    settings = load_settings(values, environ={})
    svc = build_services(settings)
    svc.embedder.wait(300)
    client = create_app(settings, services=svc).test_client()
    for cid, name in CAST.items():
        call(client, "PUT", f"/v1/characters/{cid}", {"name": name, "is_player": cid == "kai.png"})
    call(client, "PUT", "/v1/chats/bench", {"member_ids": list(CAST)})
    call(client, "POST", "/v1/lore", {"title": "Harbour Watch", "text": "The guards of the harbour gates.",
                                      "triggers": ["Harbour Watch"]})
    call(client, "POST", "/v1/lore/import", {"world_info": {"entries": {"0": {
        "uid": 0, "key": ["Lighthouse"], "comment": "Lighthouse", "content": "The old lighthouse on the cape."}}}})
    texts = play(client, svc)
    proposals = call(client, "GET", "/v1/lore/proposals?state=all")["proposals"]
    accepted = rejected = 0
    for p in [p for p in proposals if p["state"] == "pending" and p["reason"] == "review"]:
        if rests_on(p, texts):
            call(client, "POST", f"/v1/lore/proposals/{p['id']}/accept", {})
            accepted += 1
        else:
            call(client, "POST", f"/v1/lore/proposals/{p['id']}/reject", {})
            rejected += 1
    results = [queue.get(svc, j["id"]) for j in queue.list_jobs(svc, chat_id="bench")
               if j["kind"] == "lore_growth"]
    notes = [d for j in results for d in (j.get("result") or {}).get("skipped", [])]
    dropped = [d for d in notes if not d.startswith("no model")]  # the fallback's "nothing found"
    out = call(client, "POST", "/v1/context", {"chat_id": "bench", "speaker_id": "ayla.png",
                                               "context_tokens": 8000, "last_action": {"text": LATER}})
    cards = next((b["text"] for b in out["blocks"] if b["section"] == "story_cards"), "")
    lore = call(client, "GET", "/v1/lore?chat_id=bench")["lore"]
    grown = [e for e in lore if e["sources"]]
    print(f"mode: {'openai ' + args.model + ', json ' + args.json_mode if args.url else 'extractive'}"
          f"{' + review' if args.review else ''}")
    answers = [((j.get("result") or {}).get("model") or {}).get("answer", "extractive") for j in results]
    print(f"jobs: {len(results)} lore_growth, states {sorted({j['state'] for j in results})}; "
          f"the model's answer used in {sum(a in ('first_try', 'retry') for a in answers)} "
          f"({', '.join(f'{k} {v}' for k, v in sorted(Counter(answers).items()))})")
    print(f"proposals: {len(proposals)}; applied at once: {sum(p['state'] == 'applied' and p['reason'] == '' for p in proposals)}; "
          f"waiting for review: {sum(p['reason'] == 'review' for p in proposals)}; "
          f"waiting, protected: {sum(p['reason'] == 'protected' for p in proposals)}")
    print(f"accepted: {accepted}; rejected: {rejected}; dropped by the grounding check: {len(dropped)}")
    print(f"rest on their sources: {sum(rests_on(p, texts) for p in proposals)} of {len(proposals)}")
    print(f"grown entries: {len(grown)} ({', '.join(sorted(e['title'] for e in grown))})")
    print(f"fire in the later turn: {sorted(e['title'] for e in grown if e['text'][:40] in cards)}")
    for d in dropped:
        print(f"  dropped: {d}")
    print(json.dumps({"protected_unchanged": [e["text"] for e in lore if e["source"] in ("user", "import")]}))
    svc.db.close()


if __name__ == "__main__":
    main()
