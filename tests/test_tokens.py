"""The token counter's cut (QS3: a section is cut at its end): encoding only a head of a long text
gives the same cut as encoding all of it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from server_plugin.core.tokens import get_counter

PIECES = ["the", "river", "Ayla", "—", "…", "日本語", "😀", "  ", "\n\n", "x" * 40, "1234567",
          "don't", "«quote»", ",", ".", "É", "\u0301", "'s", "\t", " ", " ", " "]


def cut_by_whole_encoding(text: str, max_tokens: int) -> str:
    """The reference: encode everything, keep the first tokens, shorten until it really fits."""
    counter = get_counter()
    ids = counter._enc.encode(text, disallowed_special=())
    if len(ids) <= max_tokens:
        return text
    for n in range(max_tokens, 0, -1):
        cut = counter._enc.decode(ids[:n]).rstrip("\ufffd")
        if counter.count(cut) <= max_tokens and text.startswith(cut):
            return cut
    return ""


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=600), st.integers(min_value=1, max_value=200))
def test_qs3_cut_of_a_long_text_equals_the_cut_of_its_whole_encoding(pieces, max_tokens):
    """rule QS3: `truncate` keeps the same beginning whether it encodes the whole text or a head
    of it (texts of every script, spacing and punctuation; budgets far below their length)."""
    text = "".join(pieces)
    got = get_counter().truncate(text, max_tokens)
    assert got == cut_by_whole_encoding(text, max_tokens)
    assert get_counter().count(got) == len(get_counter()._enc.encode(got, disallowed_special=()))
    assert get_counter().count(got) <= max_tokens


def test_qs3_cut_of_a_story_sized_text_keeps_exactly_the_budget():
    """rule QS3: a 40,000-token summary cut to 3,000 tokens keeps 3,000 tokens of its beginning."""
    line = "Ayla crossed the river at dawn and said, \"We go now.\" Bren followed her. "
    text = line * 2500
    cut = get_counter().truncate(text, 3000)
    assert text.startswith(cut) and get_counter().count(cut) == 3000
    assert cut == cut_by_whole_encoding(text, 3000)
    for budget in (2999, 1000, 17):  # the head kept from the first cut serves smaller budgets
        smaller = get_counter().truncate(text, budget)
        assert smaller == cut_by_whole_encoding(text, budget)
        assert get_counter().count(smaller) == len(get_counter()._enc.encode(smaller)) == budget


LINE = st.lists(st.sampled_from(PIECES), max_size=40).map("".join)


@settings(max_examples=200, deadline=None)
@given(st.lists(LINE, min_size=1, max_size=400))
def test_qs3_long_texts_counted_line_by_line_count_as_encoded_whole(lines):
    """rule QS3 (exact token arithmetic): a long text (a story summary) counted piece by piece
    after each line's first word gives exactly the count of its whole encoding."""
    text = "\n".join(lines)
    whole = len(get_counter()._enc.encode(text, disallowed_special=()))
    assert get_counter()._count_long(text) == whole
    assert get_counter().count(text) == whole


PART = st.lists(st.sampled_from(PIECES + ["\n", "/", "½", "①", "7", "Ω", "\r\n"]), max_size=30).map("".join)


@settings(max_examples=300, deadline=None)
@given(st.lists(PART, max_size=60), st.sampled_from(["\n\n", "\n", " ", ".\n", "\n- "]))
def test_qs3_a_section_counted_item_by_item_counts_as_encoded_whole(parts, separator):
    """rule QS3 (exact token arithmetic): a section's items counted apart where one ends a line
    and the next starts with a letter or digit (count_joined) give its whole encoding's count."""
    joined = [p + separator for p in parts[:-1]] + parts[-1:]
    whole = len(get_counter()._enc.encode("".join(joined), disallowed_special=()))
    assert get_counter().count_joined(joined) == whole


def test_qs3_a_changed_line_of_a_long_text_keeps_the_count_exact():
    """rule QS3: after one line of a long summary changes, the count is still exact."""
    lines = [f"Session {i}: Ayla met Bren at the {i}th bridge and said \"hold the rope\"." for i in range(300)]
    before = "\n".join(lines)
    lines[150] = "Session 150: nothing happened, except 3.5 hours of rain — and a 😀."
    lines[151:151] = ["   an indented quote: \"no\".", "\t\ttabs first", "  ", ".  .   dots and spaces", ""]
    after = "\n".join(lines)
    for text in (before, after):
        assert get_counter().count(text) == len(get_counter()._enc.encode(text, disallowed_special=()))


@settings(max_examples=100, deadline=None)
@given(st.lists(LINE, min_size=100, max_size=400), st.integers(min_value=1, max_value=1500))
def test_qs3_cut_of_a_long_text_of_lines_equals_the_cut_of_its_whole_encoding(lines, max_tokens):
    """rule QS3: a long text of lines (a story summary), whose head is made of its pieces' tokens,
    is cut exactly as encoding all of it would cut it."""
    text = "\n".join(lines) + "\n" + "Ayla crossed the river at dawn.\n" * 150  # always long
    got = get_counter().truncate(text, max_tokens)
    assert got == cut_by_whole_encoding(text, max_tokens)
    assert get_counter().count(got) <= max_tokens


class _Spy:
    """An encoder that records how many characters it was asked to encode."""

    def __init__(self, enc) -> None:
        self.enc, self.chars = enc, 0

    def encode(self, text: str, **kwargs):
        self.chars += len(text)
        return self.enc.encode(text, **kwargs)

    def decode(self, ids):
        return self.enc.decode(ids)


def test_qs3_a_story_summary_changed_at_its_start_is_cut_again_encoding_only_its_changed_line():
    """rule QS3 (OP4: a backlog of summary jobs changes the story summary before every turn): a
    long text cut once is cut again after one of its first lines changed by encoding only that
    line's pieces, not its whole head — and the cut is still the one of the whole encoding."""
    from server_plugin.core.tokens import TokenCounter

    counter = TokenCounter()
    spy = counter._enc = _Spy(counter._enc)
    lines = [f"Session {i}: Ayla met Bren at the {i}th bridge and said \"hold the rope\"." for i in range(2000)]
    before = "\n".join(lines)
    first = counter.truncate(before, 3000)
    assert first == cut_by_whole_encoding(before, 3000)
    lines[3] = "Session 3: the rope broke, and Bren fell into the river with the map."
    after = "\n".join(lines)
    spy.chars = 0
    second = counter.truncate(after, 3000)
    assert second == cut_by_whole_encoding(after, 3000)
    assert second != first and counter.count(second) <= 3000
    assert 0 < spy.chars < 400  # the changed line and the cut's last line, not 12,000 characters
