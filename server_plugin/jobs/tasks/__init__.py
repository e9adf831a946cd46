"""Every model task: the prompt it sends, the JSON Schema of the answer, the strict parser of the
answer, and the no-model (extractive) answer, one `Task` per task (`registry.TASKS`).

A job goes: render (a `Prompt`) -> complete (a model through `llm.py`, or the SillyTavern
extension through `generateRaw`) -> `Task.parse_answer(prompt, answer)` -> store. A `Prompt` is
plain data and round-trips through JSON (`to_payload` / `from_payload`), so a job row can carry it
and the extension can run it. It holds the task's inputs too, limits included, so the parser and
the extractive fallback (`Task.fallback`) need nothing else.

Messages, characters, summaries, notes and secrets are shown to the model under short labels we
assign (m1, c1, s1, q1, n1, k1): models copy "m3" faithfully where they would garble a UUID or an
avatar file name. The parser maps labels back to real ids and rejects labels we did not give.

Parsing is strict. The answer must be one JSON object (a single ```json fence, or prose before and
after one object, is tolerated because it is unambiguous); it must match the task's JSON Schema
(unknown keys are errors); labels must be ones we gave; texts must respect their limits. Anything
else raises `PromptParseError` with a sentence saying what was wrong: the job fails and is retried,
nothing is stored. Quotes are then verified against the cited messages (rule SW8, `quotes.py`);
a quote that is not verbatim is dropped and reported in the result, it does not fail the job.

The modules: `base` (the Prompt, shared types, labels, JSON reading, `Task`), `extractive` (the
sentence selection the fallbacks share), one module per family of tasks (`summaries`, `memories`,
`episodes`, `told`, `sheets`, `lore`), and `registry` (TASKS, built from an explicit list).
"""
