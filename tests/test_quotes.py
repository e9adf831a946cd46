"""Quote verification (rule SW8): a quote is kept only if it is verbatim in the cited message."""

from server_plugin.core.quotes import (
    DroppedQuote,
    Quote,
    find_speech,
    find_verbatim,
    normalise,
    verify_quotes,
)

SOURCE = "Yuki laughs. \u201cAnd you said: \u2018I\u2019m not peeking.\u2019 \u2014 and I believed you\u2026\u201d"


def test_sw8_exact_quote_is_kept_with_source_text():
    """rule SW8: a quote copied exactly is kept, and what is stored is the source's own slice."""
    check = verify_quotes([Quote("Yuki", "and I believed you", "m1")], {"m1": SOURCE})
    assert check.kept == (Quote("Yuki", "and I believed you", "m1"),)
    assert check.dropped == ()


def test_sw8_straight_quotes_match_curly_and_stored_text_is_verbatim():
    """rule SW8: straight ' and " in the model's quote match curly marks; the stored text keeps the
    source's curly apostrophe (verbatim by construction)."""
    check = verify_quotes([Quote("Yuki", "I'm not peeking.", "m1")], {"m1": SOURCE})
    assert [q.text for q in check.kept] == ["I\u2019m not peeking."]


def test_sw8_dashes_ellipsis_and_whitespace_are_normalised():
    """rule SW8: -- matches an em dash, ... matches …, runs of whitespace and newlines are one space."""
    quote = "I'm not peeking.'  --\n and I believed you..."
    exact = find_verbatim(quote, SOURCE)
    assert exact is not None
    assert exact in SOURCE
    assert exact.startswith("I\u2019m not peeking.")
    assert "\u2014" in exact


def test_sw8_other_quotation_marks_are_one_mark():
    """rule SW8: « », „ “ and 「」 differ from " only as marks; the words must still match."""
    src = "Er sagte: \u201eIch schaue nicht.\u201c Elle dit \u00ab\u00a0Je reste\u00a0\u00bb."
    assert find_verbatim('"Ich schaue nicht."', src) == "Ich schaue nicht."
    assert find_verbatim('dit "Je reste"', src) == "dit \u00ab\u00a0Je reste\u00a0\u00bb"


def test_sw8_zero_width_characters_are_ignored():
    """rule SW8: a zero-width space inside the source does not break a match."""
    assert find_verbatim("not peeking", "I am not\u200b peeking") == "not\u200b peeking"


def test_sw8_fabricated_quote_is_dropped():
    """rule SW8: words that were never said are dropped, with the reason, so the job can count them."""
    fake = Quote("Yuki", "I will always protect you", "m1")
    check = verify_quotes([fake], {"m1": SOURCE})
    assert check.kept == ()
    assert check.dropped == (DroppedQuote(fake, "not_verbatim"),)


def test_sw8_quote_citing_the_wrong_or_unknown_message_is_dropped():
    """rule SW8: the quote must be in the message it cites, not in another one."""
    sources = {"m1": SOURCE, "m2": "Sam shrugs."}
    wrong = Quote("Yuki", "I believed you", "m2")
    unknown = Quote("Yuki", "I believed you", "m9")
    check = verify_quotes([wrong, unknown], sources)
    assert [d.reason for d in check.dropped] == ["not_verbatim", "unknown_message"]


def test_sw8_paraphrase_case_change_and_elision_are_dropped():
    """rule SW8: verbatim means the same words and case, in one unbroken stretch."""
    sources = {"m1": SOURCE}
    for text in ["and i believed you", "And you said I'm not peeking",
                 "And you said: ... and I believed you"]:
        assert verify_quotes([Quote("Yuki", text, "m1")], sources).kept == (), text


def test_sw8_a_quote_cannot_cut_a_word():
    """rule SW8: "eek" is not a quote of "peeking"; a quote begins and ends on word boundaries."""
    assert find_verbatim("eeking", "not peeking") is None
    assert find_verbatim("not peek", "not peeking") is None
    assert find_verbatim("not peeking", "not peeking.") == "not peeking"


def test_sw8_wrapping_marks_and_final_punctuation_are_forgiven():
    """rule SW8: a quote wrapped in marks or with a period where the source has a comma still matches;
    the stored text is the source's (without the mark the source does not have)."""
    src = "\u201cI don\u2019t peek,\u201d she said."
    assert find_verbatim("\u201cI don't peek.\u201d", src) == "I don\u2019t peek"
    assert find_verbatim("...I don't peek...", src) == "I don\u2019t peek"


def test_sw8_empty_and_overlong_quotes_are_dropped():
    """rule SW8: an empty quote or one longer than DEFAULT_MAX_QUOTE_CHARS is not a line someone said."""
    long_src = "word " * 300
    check = verify_quotes([Quote("A", "  \u201c\u201d ", "m1"), Quote("A", long_src.strip(), "m1")],
                          {"m1": long_src}, max_chars=500)
    assert [d.reason for d in check.dropped] == ["empty", "too_long"]


def test_sw8_duplicate_quotes_are_kept_once():
    """rule SW8: the same line cited twice is stored once."""
    q = Quote("Yuki", "I believed you", "m1")
    assert len(verify_quotes([q, q], {"m1": SOURCE}).kept) == 1


def test_normalise_is_documented_exactly():
    """The normalisation unifies marks, dashes, ellipses and whitespace, and nothing else."""
    assert normalise("\u00ab A \u00bb \u2018b\u2019 c\u2014\u2013d \u2026  e\u00a0\n f") == "\"A\" 'b' c-d ... e f"
    assert normalise("Caf\u00e9 CAF\u00c9") == "Caf\u00e9 CAF\u00c9"  # letters and case untouched


def test_find_speech_finds_quoted_stretches_in_order():
    """Speech in “…”, "…", «…», „…“ and 「…」 is found with its position; apostrophes are not speech."""
    text = 'He said \u201cgo\u201d, then "stay", \u00abreste\u00bb, \u201ebleib\u201c and \u300c\u5f85\u3066\u300d; don\u2019t.'
    spans = find_speech(text)
    assert [s.text for s in spans] == ["go", "stay", "reste", "bleib", "\u5f85\u3066"]
    for s in spans:
        assert text[s.start:s.end] == s.text
        assert s.outer_start < s.start and s.outer_end > s.end
