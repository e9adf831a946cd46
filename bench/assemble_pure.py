"""Time the pure assembler alone (no database, no HTTP): prints ms per call at several budgets.

A campaign-sized turn: 50 live messages, 500 story cards (3 triggers each), 200 memory-bank
candidates, 20 pinned memories, 5 sheets, 8 summary parts, 10 notes. Words are single tokens of
the tokenizer, so sizes in words are sizes in tokens. Run: `python bench/assemble_pure.py`.
"""

from __future__ import annotations

import random
import re
import statistics
import time

from server_plugin.core.assemble import Candidates, Card, Item, LastAction, Message, assemble
from server_plugin.core.tokens import get_counter
from server_plugin.settings import defaults
from server_plugin.story.context import rules_from


def campaign(seed: int = 1) -> Candidates:
    counter = get_counter()
    rnd = random.Random(seed)
    words = [w.strip() for w in (counter._enc.decode([i]) for i in range(1000, 40000))
             if re.fullmatch(r" [a-z]{3,}", w)]

    def text(n: int) -> str:
        return " ".join(rnd.choice(words) for _ in range(n))

    msgs = [Message(f"m{i}", text(60), role="user" if i % 2 else "assistant") for i in range(50)]
    return Candidates(
        last_action=LastAction(msgs[-1].text), messages=msgs,
        instructions=text(300), plot_essentials=text(200), authors_note=text(50),
        story_summary=[Item(f"s{i}", text(150)) for i in range(8)],
        pinned_memories=[Item(f"p{i}", text(40)) for i in range(20)],
        character_sheets=[Item(f"c{i}", text(400)) for i in range(5)],
        campaign_notes=[Item(f"n{i}", text(30)) for i in range(10)],
        story_cards=[Card(f"k{i}", text(80), tuple(rnd.choice(words) for _ in range(3)))
                     for i in range(500)],
        memory_bank=[Item(f"b{i}", text(60)) for i in range(200)],
    )


def main() -> None:
    counter = get_counter()
    rules = rules_from(defaults())  # the shipped QS numbers
    c = campaign()
    for ctx in (4000, 8000, 16000, 32000, 128000):
        assemble(c, ctx, counter, rules=rules)  # warm the counter's cache, as every later turn is
        times = []
        for _ in range(50):
            t0 = time.perf_counter()
            out = assemble(c, ctx, counter, rules=rules)
            times.append((time.perf_counter() - t0) * 1000)
        times.sort()
        print(f"context {ctx:>6}: p50 {statistics.median(times):.2f} ms, p95 {times[47]:.2f} ms, "
              f"used {out.used}, scan {out.scan_actions} actions, "
              f"{len(out.sections['story_cards'].included)} cards")


if __name__ == "__main__":
    main()
