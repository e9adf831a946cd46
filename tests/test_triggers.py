"""Trigger matching, the scan window and presence (rules QS5, QS6, SW1) — server_plugin/core/triggers.py."""

import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from server_plugin.core.assemble import LastAction, Message, scan_texts
from server_plugin.core.text import script_without_spaces
from server_plugin.core.triggers import CastMember, Match, ScanWindow, normalize, present_characters
from server_plugin.core.triggers import scan_window_size as scan_window_with
from server_plugin.settings import defaults

SHIPPED = defaults()


def scan_window_size(card_tokens: int, **given: int) -> int:
    """The scan window with the shipped card_scan_* settings; `given` replaces some."""
    limits = {"min_actions": SHIPPED.card_scan_min_actions,
              "tokens_per_action": SHIPPED.card_scan_tokens_per_action,
              "threshold_tokens": SHIPPED.card_scan_threshold_tokens}
    return scan_window_with(card_tokens, **{**limits, **given})


def fires(trigger: str, text: str) -> bool:
    return ScanWindow([text]).first_hit(trigger) == 0


# --- QS6: scan window size ---------------------------------------------------------------------

def test_qs6_scan_window_400_500_501_900():
    """rule QS6: at least 4 actions; above 500 card tokens, floor(available / 100)."""
    assert scan_window_size(400) == 4
    assert scan_window_size(500) == 4
    assert scan_window_size(501) == 5
    assert scan_window_size(599) == 5
    assert scan_window_size(900) == 9
    assert scan_window_size(0) == 4
    assert scan_window_size(1234) == 12


def test_qs6_scan_window_size_follows_its_settings():
    """rule QS6: the numbers are settings (card_scan_*), not constants."""
    assert scan_window_size(900, min_actions=2, tokens_per_action=300, threshold_tokens=100) == 3
    assert scan_window_size(90, min_actions=2, tokens_per_action=300, threshold_tokens=100) == 2


def test_qs6_scan_texts_newest_first_from_the_last_action():
    """rule QS6: the window is the latest actions, the last action first."""
    msgs = [Message(f"m{i}", f"text {i}") for i in range(1, 8)]
    assert scan_texts(msgs, LastAction("text 7"), 4) == ["text 7", "text 6", "text 5", "text 4"]
    assert scan_texts(msgs, LastAction("text 7"), 50) == [f"text {i}" for i in range(7, 0, -1)]
    # A Continue scans from the model's last output (QS2).
    msgs.append(Message("a8", "the model said", role="assistant"))
    msgs.append(Message("s9", "a system line", role="system"))
    assert scan_texts(msgs, LastAction("", kind="continue"), 2) == ["the model said", "a system line"]


# --- QS5/SW7: whole-word, case-insensitive trigger matching -----------------------------------

def test_qs5_trigger_whole_word_only():
    """rule QS5 (triggers: whole words): "cat" does not fire inside other words."""
    assert fires("cat", "The cat sleeps.")
    assert not fires("cat", "We concatenate strings.")
    assert not fires("cat", "Two cats and a catalogue.")
    assert not fires("cat", "cat5 cable")
    assert not fires("cat", "bob_cat")


def test_qs5_trigger_case_insensitive():
    """rule QS5: triggers match whatever the case, on both sides."""
    assert fires("Dragon", "a DRAGON flies")
    assert fires("DRAGON", "a dragon flies")
    assert fires("élan", "ÉLAN vital")
    assert fires("strasse", "die Straße")  # casefold, not lower


def test_qs5_trigger_phrases_any_spacing():
    """rule QS5: a phrase fires as a whole, across spaces and line breaks, never in part."""
    assert fires("dark lord", "The Dark\n  Lord rises")
    assert fires("  dark   lord ", "the dark lord")
    assert not fires("dark lord", "the dark lords")
    assert not fires("dark lord", "the dark, lord")
    assert not fires("dark lord", "a dark room, a lord")


def test_qs5_trigger_punctuation_around_and_inside():
    """rule QS5: punctuation ends a word; triggers may themselves hold punctuation."""
    assert fires("cat", "(cat)")
    assert fires("cat", "cat!")
    assert fires("cat", "the cat's tail")
    assert fires("cat", "cat-like grace")
    assert fires("C++", "I code in C++.")
    assert not fires("C++", "ABC++ is a company")
    assert fires("Mr. Smith", "hello, mr. smith!")
    assert not fires("", "anything")
    assert not fires("   ", "anything")


def test_qs5_trigger_reports_the_newest_text():
    """rule QS5: recency: the index of the newest window text holding the trigger."""
    window = ScanWindow(["nothing here", "a cat", "the cat again"])
    assert window.first_hit("cat") == 1
    assert window.hits(["cat", "dog", "nothing"]) == {"cat": 1, "nothing": 0}


# --- SW1: presence ------------------------------------------------------------------------------

CAST = [
    CastMember("yuki", "Yuki Tanaka", ("Yuki", "the Ice Queen")),
    CastMember("bob", "Bob"),
    CastMember("ann", "Ann"),
    CastMember("kai", "Kai"),
]


def test_sw1_present_speaker_members_client_and_mentions():
    """rule SW1: the speaker, members, client present_ids and name/alias mentions are present."""
    texts = ["The ice queen glares at everyone.", "Nothing about the others"]
    present = present_characters(CAST, texts, speaker_id="bob", member_ids=["player"],
                                 present_ids=["kai"])
    assert present == {"bob": "speaker", "player": "member", "kai": "present_ids",
                       "yuki": "mentioned"}


def test_sw1_absent_characters_stay_out():
    """rule SW1: a cast member neither named nor listed is not present (whole words only)."""
    texts = ["Anne and Bobby walk in", "kaiser rolls"]
    assert present_characters(CAST, texts) == {}
    assert present_characters(CAST, ["ANN waves"]) == {"ann": "mentioned"}


def test_sw1_presence_only_looks_at_the_given_window():
    """rule SW1: a name outside the scan window texts does not make a character present."""
    msgs = [Message("m1", "Bob was here long ago")] + [
        Message(f"m{i}", f"quiet line {i}") for i in range(2, 7)]
    texts = scan_texts(msgs, LastAction("quiet line 6"), 4)
    assert present_characters(CAST, texts) == {}
    texts = scan_texts(msgs, LastAction("quiet line 6"), 6)
    assert present_characters(CAST, texts) == {"bob": "mentioned"}


# --- the fast word index agrees with the plain whole-word rule -------------------------------------

PIECES = st.sampled_from(["cat", "Cat", "cats", "dark", "lord", "C++", "_", "ß", "ss", "é", "e\u0301",
                          "雪", "'s", " ", "  ", "\n", ".", "-", "5", "the"])
TEXTS = st.lists(PIECES, max_size=12).map("".join)


@settings(max_examples=400, deadline=None)
@given(trigger=TEXTS, texts=st.lists(TEXTS, max_size=5))
def test_qs5_word_index_matches_the_whole_word_rule(trigger, texts):
    """rule QS5: the one-word shortcut gives the same answer as the plain rule, for any text: a
    trigger's edge in a script with spaces must not touch a word character (letter, mark, digit,
    underscore of any script); an edge in a script without spaces ("雪") is not checked, unless
    whole words are "on"."""
    needle = normalize(trigger)
    for mode in ("auto", "on"):
        expected = None
        if needle:
            left = mode == "on" or not script_without_spaces(needle[0])
            right = mode == "on" or not script_without_spaces(needle[-1])
            pattern = regex.compile((r"(?<![\p{L}\p{M}\p{N}_])" if left else "") + regex.escape(needle)
                                    + (r"(?![\p{L}\p{M}\p{N}_])" if right else ""))
            expected = next((i for i, t in enumerate(texts) if pattern.search(normalize(t))), None)
        assert ScanWindow(texts).first_hit(trigger, Match(mode)) == expected, mode


# --- every script: whole words where words have spaces, substrings where they do not -------------

def fires_with(trigger: str, text: str, whole_words: str = "auto", case_sensitive: bool = False) -> bool:
    return ScanWindow([text]).first_hit(trigger, Match(whole_words, case_sensitive)) == 0


def test_qs5_chinese_and_japanese_triggers_match_inside_sentences_unless_whole_words_are_on():
    """rules LG1, QS5: Chinese and Japanese have no spaces; automatic matching finds the trigger inside
    the sentence, "on" asks it to stand alone, "off" is a substring everywhere."""
    assert fires_with("黑塔", "我们明天去黑塔看看吧")
    assert fires_with("黑塔", "我們明天去黑塔看看吧")  # Traditional 們 in the text, folded
    assert fires_with("黑塔", "我们明天去黑塔看看吧", "off")
    assert not fires_with("黑塔", "我们明天去黑塔看看吧", "on")
    assert fires_with("黑塔", "黑塔。", "on")
    assert fires_with("魔女", "あの魔女が森に住んでいる")
    assert fires_with("カタカナ", "ｶﾀｶﾅで書いた")  # half-width Katakana folds to full width
    assert not fires_with("白塔", "我们明天去黑塔看看吧")


def test_qs5_korean_triggers_match_with_particles_attached():
    """rules LG1, QS5: Korean spaces words but attaches particles: 흑탑 fires on 흑탑이 and 흑탑에서."""
    assert fires_with("흑탑", "저기 흑탑이 보인다")
    assert fires_with("흑탑", "흑탑에서 만나자")
    assert not fires_with("흑탑", "흑탑이 보인다", "on")
    assert not fires_with("백탑", "흑탑이 보인다")


def test_qs5_russian_and_german_triggers_are_whole_words_with_unicode_boundaries():
    """rules LG1, QS5: "кот" does not fire inside "скотина" (SillyTavern's ASCII \\W would let it); a
    German compound holds its parts only as substrings ("off")."""
    assert fires_with("кот", "Кот спит на печи")
    assert not fires_with("кот", "Эта скотина опять сбежала")
    assert fires_with("кот", "Эта скотина опять сбежала", "off")
    assert not fires_with("Turm", "Wir gehen zur Schwarzturmstraße")
    assert fires_with("Turm", "Wir gehen zur Schwarzturmstraße", "off")
    assert fires_with("schwarze Turm", "Der SCHWARZE  Turm steht dort")  # case and spaces folded
    assert fires_with("straße", "die STRASSE")
    assert not fires_with("हिन्द", "हिन्दी भाषा")  # a vowel sign is part of the word


def test_qs5_case_sensitive_cards_keep_case_and_still_fold_width():
    """rules LG1, QS5: `caseSensitive` from World Info: "Rose" the name, not "rose" the flower."""
    assert fires_with("Rose", "Rose smiled", case_sensitive=True)
    assert not fires_with("Rose", "a red rose", case_sensitive=True)
    assert fires_with("Rose", "a red rose")
    assert fires_with("Rose", "Ｒｏｓｅ smiled", case_sensitive=True)


def test_qs5_regex_triggers_fire_and_a_runaway_pattern_is_stopped_in_time():
    """rules LG1, QS5: `/pattern/flags` triggers (World Info's regex keys); a catastrophic pattern on a
    long text runs out of its time bound and does not fire instead of hanging the turn."""
    assert fires_with("/shadow ?fangs?/i", "The SHADOW FANGS attack")
    assert not fires_with("/shadow ?fangs?/", "The SHADOW FANGS attack")
    assert not fires_with("/[unclosed/", "[unclosed")  # does not compile: never fires
    window = ScanWindow(["a" * 40 + "!"], regex_seconds=0.05)
    import time
    started = time.monotonic()
    assert window.first_hit("/(a+)+$b/") is None
    assert time.monotonic() - started < 2.0


def test_sw1_characters_named_in_chinese_and_korean_are_present():
    """rules LG1, SW1: a name in a script without spaces is found inside the sentence, with particles."""
    cast = [CastMember("lin", "林月"), CastMember("seo", "서연", ("서연이",)), CastMember("olga", "Ольга")]
    assert present_characters(cast, ["林月说我们明天去黑塔。"]) == {"lin": "mentioned"}
    assert present_characters(cast, ["서연이가 웃었다."]) == {"seo": "mentioned"}
    assert present_characters(cast, ["서연은 웃었다."]) == {"seo": "mentioned"}
    assert present_characters(cast, ["Ольга пришла."]) == {"olga": "mentioned"}
    assert present_characters(cast, ["月亮很亮。"]) == {}
