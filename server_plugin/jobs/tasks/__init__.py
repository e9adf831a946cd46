"""Every model task: the prompt it sends, the JSON Schema of the answer, the parser of the
answer, and the no-model (extractive) answer, one `Task` per task (`registry.TASKS`).

A job goes: render (a `Prompt`) -> complete (a model through `llm.py`, or the SillyTavern
extension through `generateRaw`) -> `Task.parse_answer(prompt, answer)` -> store. A `Prompt` is
plain data and round-trips through JSON (`to_payload` / `from_payload`), so a job row can carry it
and the extension can run it. It holds the task's inputs too, limits included, so the parser and
the extractive fallback (`Task.fallback`) need nothing else.

Messages, characters, summaries, notes and secrets are shown to the model under short labels we
assign (m1, c1, s1, q1, n1, k1): models copy "m3" faithfully where they would garble a UUID or an
avatar file name. The parser maps labels back to real ids and leaves out labels we did not give.

Parsing keeps what is right (`answers`): reasoning blocks, prefaces and fences are stripped and
broken JSON repaired; against the task's JSON Schema, unknown keys are ignored, a missing list is
empty and an item that breaks the schema is dropped; a label we did not give is left out (an item
that needs it is dropped), a character's name given for its label is read as it when unambiguous,
sheet field names are normalised. Each change is noted in a `Report` that the job's result
carries. Only an answer with nothing to keep raises `PromptParseError` with a sentence saying what
was wrong (the job then retries once, telling the model, then falls back: `jobs/calls.py`).
Quotes are verified against the cited messages, words (rule SW8, `quotes.py`) and speaker (MJ2);
a quote that fails is dropped and reported in the result, it does not fail the job.

The modules: `base` (the Prompt, shared types, labels, `Task`), `answers` (reading an answer),
`parts` (one call per part, tasks as sections), `extractive` (the
sentence selection the fallbacks share), one module per family of tasks (`summaries`, `memories`,
`episodes`, `told`, `sheets`, `lore`), and `registry` (TASKS, built from an explicit list).
"""
