"""Memory in the players' languages: the one analyzer of core/text per script, search on chats in
scripts without spaces (SW6), and the re-analysis of rows an older analyzer made (migration m008)."""

from __future__ import annotations

import json
import re
import time
import unicodedata
from collections import Counter

import regex

import pytest

from server_plugin.app import build_services
from server_plugin.core import text as T
from server_plugin.retrieval import docs as index
from server_plugin.retrieval import live_index, ranking
from tests.helpers.api import expect_ok
from tests.helpers.world import character, chat

# --- the analyzer, per script ---------------------------------------------------------------------


def words(text: str) -> list[str]:
    return T.analyzer_terms(text, stems=False)


def test_chinese_runs_become_overlapping_bigrams_and_traditional_folds_to_simplified():
    assert words("我们明天去黑塔看看吧") == ["我们", "们明", "明天", "天去", "去黑", "黑塔", "塔看", "看看", "看吧"]
    assert words("我們明天去黑塔看看吧") == words("我们明天去黑塔看看吧")  # Traditional 們 is 们
    assert words("塔") == ["塔"]  # a one-character run is its own unigram
    assert words("黑塔，塔。") == ["黑塔", "塔"]  # punctuation ends a run


def test_japanese_kana_and_kanji_share_a_run_and_half_width_katakana_folds():
    assert words("黒い塔に行こう")[:2] == [T.match_form("黒い"), T.match_form("い塔")]
    assert words("ｶﾀｶﾅ") == words("カタカナ") == ["カタ", "タカ", "カナ"]
    assert words("コーヒー") == ["コー", "ーヒ", "ヒー"]  # the long-vowel mark ー stays in the run


def test_korean_particles_leave_the_noun_bigram():
    assert "흑탑" in words("흑탑이 보인다") and "흑탑" in words("흑탑에서 만나자")
    assert words("흑탑") == ["흑탑"]


def test_thai_lao_khmer_burmese_bigrams_are_of_grapheme_clusters():
    thai = words("ภาษาไทยง่าย")
    assert "ยง่" in thai and "ง่า" in thai  # the tone mark ่ stays with its consonant
    for text in ("ພາສາລາວ", "ភាសាខ្មែរ", "မြန်မာစာ"):
        terms = words(text)
        assert terms and all(1 <= len(regex.findall(r"\P{M}\p{M}*", t)) <= 2 for t in terms), terms
        assert all(not unicodedata.category(t[0]).startswith("M") for t in terms), terms


def test_spaced_scripts_stay_words_with_case_and_width_folded():
    assert words("Don't take Ayla's ＳＷＯＲＤ") == ["dont", "take", "ayla", "sword"]
    assert words("Кот и СКОТИНА") == ["кот", "и", "скотина"]
    assert words("Die Schwarzturmstraße") == ["die", "schwarzturmstrasse"]
    assert words("हिन्दी भाषा") == ["हिन्दी", "भाषा"]  # vowel signs are marks inside the word
    assert words("Glad 🧘\u200d♀️ here") == ["glad", "here"]  # a lone variation selector is no word


def test_bm25_stems_by_script_and_exact_matchers_do_not():
    terms = T.analyzer_terms("the towers кошками", stop=T.BM25_STOP_WORDS)
    assert terms == ["tower", "кошк"]
    assert T.analyzer_terms("the towers", stems=False) == ["the", "towers"]
    assert ranking.analyze("黑塔的黑塔") == Counter({"黑塔": 2, "塔的": 1, "的黑": 1})


OLD_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")


def english_only_terms(text: str) -> dict[str, int]:
    """The analyzer before every script was read (version 1), as it stood: a Chinese sentence is one word."""
    out: Counter[str] = Counter()
    for m in OLD_WORD.finditer(text.lower()):
        word = re.sub(r"['’]s$", "", m.group()).replace("'", "").replace("’", "")
        if word and word not in T.BM25_STOP_WORDS:
            out[T.stem(word)] += 1
    return dict(out)


def test_english_terms_are_what_the_english_only_analyzer_made():
    for text in ("Caroline's support group met at 8 p.m. — don't forget!", "I went camping in May 2023.",
                 "Melanie painted a sunrise; it's her favourite ＴＨＩＮＧ."):
        assert dict(ranking.analyze(text)) == english_only_terms(text.replace("ＴＨＩＮＧ", "thing"))


# --- search on chats in scripts without spaces (SW6) -----------------------------------------------

# Two small chats, one line a message, of similar lengths (as a scene is); each question's answer is one
# message in the middle (the first and last rows have fewer neighbours, which BM25 counts as context).
ZH = [("z1", "天快黑了，我们先在村口的客栈住一晚吧。"), ("z2", "老板说最近山路上常有狼出没，要小心。"),
      ("z3", "我们明天去黑塔看看吧，听说塔顶藏着宝藏。"), ("z4", "铁匠说他的锤子昨天坏了，需要新的木柄。"),
      ("z5", "公主在城堡的花园里种了一棵樱桃树。"), ("z6", "商队从沙漠回来，带来了很多香料和丝绸。"),
      ("z7", "守卫换班的时候，城门会关上一刻钟。"), ("z8", "好吧，那我们天一亮就出发，别忘了带火把。")]
KO = [("k1", "날이 저물었으니 마을 입구 여관에서 하룻밤 묵자."), ("k2", "주인이 요즘 산길에 늑대가 자주 나온다고 조심하래."),
      ("k3", "내일 흑탑에 가 보자, 탑 꼭대기에 보물이 숨겨져 있대."), ("k4", "대장장이는 망치가 어제 부러져서 새 자루가 필요하대."),
      ("k5", "공주는 성의 정원에 벚나무 한 그루를 심었다."), ("k6", "상단이 사막에서 돌아와 향신료와 비단을 잔뜩 가져왔다."),
      ("k7", "경비병이 교대할 때 성문이 잠시 닫힌다."), ("k8", "좋아, 그럼 날이 밝자마자 떠나자, 횃불 챙기는 거 잊지 마.")]


def post_chat(api, chat_id: str, lines: list[tuple[str, str]]) -> None:
    chat(api, chat_id, ["kai"])
    body = [{"id": mid, "role": "user", "name": "Kai", "speaker_id": "kai", "text": text} for mid, text in lines]
    expect_ok(api.post(f"/v1/chats/{chat_id}/messages", json={"messages": body}), 200)


def first(api, query: str, chat_id: str) -> str:
    body = {"query": query, "chat_id": chat_id, "kinds": ["message"]}
    results = expect_ok(api.post("/v1/search", json=body), 200, "search.response")["results"]
    return results[0]["id"] if results else ""


@pytest.mark.parametrize("question, answer", [("黑塔的宝藏藏在哪里？", "z3"), ("铁匠的锤子怎么了？", "z4"),
                                              ("公主种了什么树？", "z5"), ("商隊帶來了什麼？", "z6")])
def test_search_on_a_chinese_chat_finds_the_right_message_first(api, question, answer):
    """rules LG1, SW6: BM25 over bigrams finds the message (the last question is in Traditional script)."""
    character(api, "kai", "Kai")
    post_chat(api, "zh", ZH)
    assert first(api, question, "zh").endswith(answer)


@pytest.mark.parametrize("question, answer", [("흑탑의 보물은 어디에?", "k3"), ("대장장이의 망치는 어떻게 됐어?", "k4"),
                                              ("공주가 심은 나무는?", "k5"), ("상단이 가져온 것은?", "k6")])
def test_search_on_a_korean_chat_finds_the_right_message_first(api, question, answer):
    """rules LG1, SW6: particles attached to nouns do not hide them (흑탑의 / 흑탑에)."""
    character(api, "kai", "Kai")
    post_chat(api, "ko", KO)
    assert first(api, question, "ko").endswith(answer)


# --- rows an older analyzer made are re-analysed in the background (m008) -------------------------

def test_m008_marks_rows_stale_and_the_index_reanalyses_them_in_the_background(api, services, settings,
                                                                                 embedder, clock):
    character(api, "kai", "Kai")
    post_chat(api, "zh", ZH)
    services.db.close()
    # The store as it was before m008: no analyzer column, every row's terms by the English-only analyzer.
    from server_plugin.store.db import sqlite3  # the store's own library (see test_architecture)
    raw = sqlite3.connect(settings.data_path / settings.db_file)
    for doc_id, text in raw.execute("SELECT id, text FROM docs").fetchall():
        raw.execute("UPDATE docs SET terms=? WHERE id=?", (json.dumps(english_only_terms(text)), doc_id))
    raw.execute("ALTER TABLE docs DROP COLUMN analyzer")
    raw.execute("DELETE FROM schema_migrations WHERE name='m008_analyzer_version'")
    raw.commit()
    raw.close()
    svc = build_services(settings, embedder=embedder, clock=clock)
    try:
        assert index.count_stale_terms(svc.db.reader()) == len(ZH)  # marked, not analysed, by the migration
        sentence = json.loads(svc.db.reader().execute("SELECT terms FROM docs WHERE text LIKE '我们%'").fetchone()[0])
        assert "我们明天去黑塔看看吧" in sentence and "黑塔" not in sentence
        state = live_index.start(svc)
        assert state.ready.wait(60)
        deadline = time.monotonic() + 60
        while index.count_stale_terms(svc.db.reader()) and time.monotonic() < deadline:
            state.wake.set()
            time.sleep(0.1)
        assert index.count_stale_terms(svc.db.reader()) == 0
        row = svc.db.reader().execute("SELECT terms, analyzer FROM docs WHERE text LIKE '我们%'").fetchone()
        assert "黑塔" in json.loads(row[0]) and row[1] == T.ANALYZER_VERSION
        live = state.current()
        assert any("黑塔" in terms for terms in live.row_terms)
        assert not index.orphans(svc.db.reader())["docs_without_terms"]
        generation = svc.db.generation
        assert index.reanalyse(svc.db, 100) == 0
        assert svc.db.generation == generation  # none left: nothing written
    finally:
        live_index.stop(svc)
        svc.db.close()
