"""One model job's calls: at most two tries, then the extractive fallback, and what it cost.

A background job in `openai` mode streams its answer (`llm.OpenAICompatible.stream_full`: a slow
model is timed out only for silence). The answer is read keeping what is right (`tasks/answers`).
When it cannot be used, one retry tells the model in plain words what was wrong; a timeout
counts as a try too, so a one-slot local server never gets the same long prompt a third time.
After two tries the task's extractive fallback makes the result from the text itself, and the
job's result says why (`Outcome.error`). A call that never reached the model (no connection,
429, a server still loading) raises instead: the queue backs off and tries later.

Costs are counted for every call: the API's `usage` when given, else our own token count.

An answer never needs to be much longer than what it reads: `fit_answer` caps a prompt's answer at
a base per task in the call plus a share of the messages shown (settings `llm_answer_base_tokens`,
`llm_answer_tokens_per_message_token`), so a small local model that loops stops early instead of
writing the sum of every task's longest answer (11,505 tokens for a 5-message session end); and
it bounds every list of the answer's schema (`llm_answer_max_items`), so a model held to the
schema that repeats one item ends that list instead of its whole answer at the cap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..core.tokens import get_counter
from .llm import Backend, Completion, LLMBadResponse, LLMUnavailable, OpenAICompatible
from .tasks.answers import Report
from .tasks.base import PromptParseError
from .tasks.registry import task_of

if TYPE_CHECKING:
    from ..settings import Settings
    from .tasks.base import Prompt

TRIES = 2  # every model job: the first try and one retry, timeouts included


@dataclass
class Outcome:
    """What a job's model work produced: the result, how (`answer`: first_try, retry, fallback,
    extractive), the notes of the parse, a plain-words error when it fell back, and its cost."""

    result: Any
    answer: str
    report: Report = field(default_factory=Report)
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    model_ms: int = 0
    shared_with: tuple[str, ...] = ()  # the jobs whose sections one call answered (batch.py)

    def summary(self) -> dict[str, Any]:
        """The `model` part of a job's result."""
        out: dict[str, Any] = {"answer": self.answer, "calls": self.calls, **self.report.to_dict()}
        if self.error:
            out["error"] = self.error
        if self.shared_with:
            out["shared_call"] = list(self.shared_with)
        return out


def fit_answer(prompt: Prompt, settings: Settings) -> Prompt:
    """The prompt as it goes to the model: its answer capped by what it reads (`cap_answer`)
    and the lists of its answer's schema bounded (`bound_lists`)."""
    return bound_lists(cap_answer(prompt, settings), settings)


def cap_answer(prompt: Prompt, settings: Settings) -> Prompt:
    """The prompt with its answer capped by what it reads: `llm_answer_base_tokens` per task in
    the call (the sections of a shared call) plus `llm_answer_tokens_per_message_token` for each
    token of the messages shown; never more than the prompt's own cap, nor than the model's
    context (`llm_context_tokens`) leaves after the prompt. 0 as the base turns the first off."""
    counter = get_counter()
    room = settings.llm_context_tokens - counter.count(prompt.system) - counter.count(prompt.user)
    if 0 < room < prompt.max_tokens:  # a part call's sections may ask more than the context holds
        prompt = replace(prompt, max_tokens=room)  # (a prompt over the context: the model says so)
    base = settings.llm_answer_base_tokens
    messages = prompt.inputs.get("messages")
    if base <= 0 or not isinstance(messages, list):
        return prompt
    tasks = max(1, len(prompt.inputs.get("sections") or {}))
    shown = counter.count("\n".join(str(m.get("text") or "") for m in messages if isinstance(m, dict)))
    cap = tasks * base + int(shown * settings.llm_answer_tokens_per_message_token)
    return prompt if cap >= prompt.max_tokens else replace(prompt, max_tokens=cap)



def bound_lists(prompt: Prompt, settings: Settings) -> Prompt:
    """The prompt with every list of its answer's schema bounded by `llm_answer_max_items`
    (where the schema sets no smaller bound). A model held to the schema (llm_json_mode
    json_schema, or SillyTavern's structured output in client mode) then ends a list there: a
    small model that repeats an item again and again (seen with Qwen2.5-Coder-1.5B at a session
    end: both tries ran to the token cap, so every section was lost) closes it and goes on to
    the next section. Only what is sent changes: answers are checked against the task's own
    schema, so a longer list from a model not held to it is read as before."""
    most = settings.llm_answer_max_items
    return prompt if most <= 0 else replace(prompt, json_schema=_bounded(prompt.json_schema, most))


def _bounded(schema: Any, most: int) -> Any:
    if isinstance(schema, list):
        return [_bounded(s, most) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "properties" and isinstance(value, dict):
            out[key] = {name: _bounded(sub, most) for name, sub in value.items()}
        else:
            out[key] = _bounded(value, most) if key in _SUBSCHEMAS else value
    if out.get("type") == "array":
        out["maxItems"] = max(int(out.get("minItems") or 0), min(int(out.get("maxItems") or most), most))
    return out


_SUBSCHEMAS = ("items", "prefixItems", "anyOf", "oneOf", "allOf", "additionalProperties")


def count_messages(messages: list[dict[str, Any]]) -> int:
    """Our count of a prompt's tokens (its messages' text)."""
    counter = get_counter()
    return sum(counter.count(str(m.get("content") or "")) for m in messages)


def _call(backend: Backend, messages: list[dict[str, Any]], kwargs: dict[str, Any]) -> Completion:
    if isinstance(backend, OpenAICompatible):
        return backend.stream_full(messages, **kwargs)
    plain = {k: v for k, v in kwargs.items() if k in ("max_tokens", "temperature", "response_format")}
    return Completion(backend.complete(messages, **plain), None, None, None)


def _usage(completion: Completion, messages: list[dict[str, Any]]) -> tuple[int, int]:
    usage = completion.usage or {}
    prompt = int(usage.get("prompt_tokens") or 0) or count_messages(messages)
    written = int(usage.get("completion_tokens") or 0) or get_counter().count(completion.text)
    return prompt, written


def _retry_messages(prompt: Prompt, answer: str, why: str) -> list[dict[str, Any]]:
    """The prompt again, with the failed answer and what was wrong with it."""
    return prompt.messages + [
        {"role": "assistant", "content": answer[:2000]},
        {"role": "user", "content": f"That answer could not be used: {why}. Answer again with only "
                                    "the JSON object, in exactly the format asked for."}]


def model_options(settings: Settings) -> dict[str, Any]:
    """`run_job_prompt`'s options from the settings."""
    return {"json_mode": settings.llm_json_mode, "temperature": settings.llm_temperature,
            "stop_repeats": settings.llm_stop_repeats, "retry_penalty": settings.llm_retry_frequency_penalty}


def run_job_prompt(prompt: Prompt, backend: Backend | None, *, json_mode: str = "off",
                   temperature: float = 0.0, stop_repeats: int = 0, retry_penalty: float = 0.0) -> Outcome:
    """Run a job's prompt: the model (two tries at most) then the fallback; see the module docstring.
    A streamed answer that repeats the same words `stop_repeats` times in a row is stopped there
    (a stuck model would write to its cap: minutes on a local one) and not used; the retry after
    an answer stopped so, or cut off at its cap, asks for `retry_penalty` as frequency_penalty
    (at temperature 0 the same prompt loops the same way again)."""
    task = task_of(prompt)
    if backend is None:
        return Outcome(task.fallback(prompt, None), "extractive")
    kwargs: dict[str, Any] = {"max_tokens": prompt.max_tokens, "temperature": temperature,
                              "response_format": prompt.response_format(json_mode)}
    if stop_repeats > 0:  # (only a streamed answer can be stopped: _call passes it there alone)
        kwargs["stop_repeats"] = stop_repeats
    out = Outcome(None, "fallback")
    messages, errors = prompt.messages, []
    for n in range(1, TRIES + 1):
        started = time.monotonic()
        try:
            completion = _call(backend, messages, kwargs)
        except LLMUnavailable as e:
            if not e.reached:
                raise  # the model never got the prompt: the queue tries again later
            out.calls += 1
            out.prompt_tokens += count_messages(messages)
            out.model_ms += int((time.monotonic() - started) * 1000)
            errors.append(f"try {n}: {e}")
            continue
        except LLMBadResponse as e:
            if not e.retryable:
                raise
            out.calls += 1
            out.prompt_tokens += count_messages(messages)
            errors.append(f"try {n}: {e}")
            continue
        out.calls += 1
        out.model_ms += int((time.monotonic() - started) * 1000)
        used, written = _usage(completion, messages)
        out.prompt_tokens += used
        out.completion_tokens += written
        if completion.finish_reason in ("length", "repeat") and retry_penalty > 0:
            kwargs["frequency_penalty"] = retry_penalty
        if completion.finish_reason == "repeat":
            why = (f"the answer repeated the same words {stop_repeats} times in a row "
                   f"(\"{completion.text[-80:].strip()}\"), so it was stopped; write each thing once")
            errors.append(f"try {n}: {why}")
            messages = _retry_messages(prompt, completion.text, why)
            continue
        report = Report()
        try:
            out.result = task.parse_answer(prompt, completion.text, report)
        except PromptParseError as e:
            why = e.reason
            if completion.finish_reason == "length":
                why = f"the answer was cut off at {prompt.max_tokens} tokens, so {why}"
            errors.append(f"try {n}: {why}")
            messages = _retry_messages(prompt, completion.text, why)
            continue
        out.answer, out.report = ("first_try" if n == 1 else "retry"), report
        if errors:
            out.report.changed.insert(0, "the first answer could not be used (" + errors[0] + ")")
        return out
    out.result = task.fallback(prompt, None)
    out.error = ("The model's answer could not be used after two tries, so this result was made "
                 "from the text itself. " + " ".join(errors))[:2000]
    return out
