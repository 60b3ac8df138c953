"""Property-generated requests over the shared surface: a seeded random walk over the endpoints and parameters
(the same seed, the same requests, in the same order), mostly valid, some out of range on purpose.

Every generated request is short (at most 16 tokens, a prompt from a small pool) so a few hundred run in minutes,
and greedy or seeded, so each server's answer is a function of the request alone.
"""

from __future__ import annotations

import random

from loadkit.differential.cases import MODEL, PROMPT_IDS, TIME, WEATHER, Case
from loadkit.differential.exchange import Request

PROMPTS = ("The capital of France is", "One, two, three,", "def add(a, b):", "Once upon a time",
           "The quick brown fox")
QUESTIONS = ("What is the capital of France?", "Name a colour.", "Say hello.", "What is 2+2?",
             "Write one word about the sea.")
# ids of common SmolLM2 tokens (" Paris", ".", the end-of-text 2, "The", " capital", ...), for every id parameter
TOKEN_POOL = (*PROMPT_IDS, 7042, 30, 2, 28, 29, 198, 1345, 256)
WORDS = ("Paris", "the", "is", "France", "hello", "blue")
# out-of-range values vLLM refuses (and so must the service, naming the same parameter)
INVALID = (("temperature", -0.5), ("top_p", 0.0), ("max_tokens", 0), ("n", 0), ("presence_penalty", 3.0),
           ("frequency_penalty", -2.5), ("min_p", 1.5), ("repetition_penalty", 0.0), ("top_k", -2),
           ("logit_bias", {"abc": 1}), ("allowed_token_ids", []), ("stop_token_ids", ["x"]),
           ("min_tokens", -1), ("truncate_prompt_tokens", -2), ("seed", "seven"), ("bad_words", "Paris"))


def _maybe(rng: random.Random, p: float) -> bool:
    return rng.random() < p


def _sampling(rng: random.Random, body: dict, chat: bool) -> None:
    """vLLM's sampling extensions and OpenAI's sampling fields, each now and then."""
    if _maybe(rng, 0.25):
        body.update(temperature=round(rng.uniform(0.3, 1.2), 2), seed=rng.randrange(1000))
        if _maybe(rng, 0.4):
            body["n"] = rng.randint(2, 3)
    for key, p, value in (
            ("top_k", 0.15, lambda: rng.choice([-1, 0, 1, 5, 50])),
            ("min_p", 0.1, lambda: round(rng.uniform(0, 0.5), 2)),
            ("top_p", 0.1, lambda: round(rng.uniform(0.5, 1), 2)),
            ("repetition_penalty", 0.15, lambda: round(rng.uniform(0.8, 1.5), 2)),
            ("presence_penalty", 0.1, lambda: round(rng.uniform(-1, 1), 2)),
            ("frequency_penalty", 0.1, lambda: round(rng.uniform(-1, 1), 2)),
            ("logit_bias", 0.15, lambda: {str(rng.choice(TOKEN_POOL)): rng.choice([-100, -5, 5, 100])}),
            ("stop_token_ids", 0.1, lambda: rng.sample(TOKEN_POOL, rng.randint(1, 3))),
            ("stop", 0.1, lambda: rng.sample([".", " is", "\n", " the"], rng.randint(1, 2))),
            ("include_stop_str_in_output", 0.1, lambda: True),
            ("ignore_eos", 0.1, lambda: True),
            ("skip_special_tokens", 0.1, lambda: False),
            ("bad_words", 0.1, lambda: rng.sample(WORDS, rng.randint(1, 2))),
            ("allowed_token_ids", 0.08, lambda: rng.sample(TOKEN_POOL, rng.randint(2, 6))),
            ("return_token_ids", 0.15, lambda: True),
            ("truncate_prompt_tokens", 0.08, lambda: rng.randint(2, 12)),
            ("priority", 0.05, lambda: rng.randint(-5, 5))):
        if _maybe(rng, p):
            body[key] = value()
    if _maybe(rng, 0.15):
        body["min_tokens"] = rng.randint(0, body["max_tokens"])
    if _maybe(rng, 0.2):
        if chat:
            body.update(logprobs=True, top_logprobs=rng.randint(0, 5))
        else:
            body["logprobs"] = rng.randint(0, 5)
        if _maybe(rng, 0.2):
            body["return_tokens_as_token_ids"] = True
    if _maybe(rng, 0.08) and not body.get("stream"):
        body["prompt_logprobs"] = rng.randint(0, 2)
    if _maybe(rng, 0.08):
        body["structured_outputs"] = rng.choice([
            {"choice": ["yes", "no", "Paris"]}, {"regex": "[a-z ]{1,12}"},
            {"json": {"type": "object", "properties": {"a": {"type": "integer"}}}}])


def _chat(rng: random.Random) -> dict:
    messages: list[dict] = [{"role": "user", "content": rng.choice(QUESTIONS)}]
    if _maybe(rng, 0.2):
        messages.insert(0, {"role": "system", "content": "Answer briefly."})
    body: dict = {"model": MODEL, "messages": messages}
    if _maybe(rng, 0.15):
        body["tools"] = rng.sample([WEATHER, TIME], rng.randint(1, 2))
        body["tool_choice"] = rng.choice(["none", "required", {"type": "function", "function": {
            "name": body["tools"][0]["function"]["name"]}}])
        if _maybe(rng, 0.3):
            body["parallel_tool_calls"] = False
    elif _maybe(rng, 0.08):
        messages.append({"role": "assistant", "content": "The answer is"})
        body.update(add_generation_prompt=False, continue_final_message=True, echo=_maybe(rng, 0.5))
    return body


def _completion(rng: random.Random) -> dict:
    prompt: object = rng.choice(PROMPTS)
    if _maybe(rng, 0.15):
        prompt = PROMPT_IDS[: rng.randint(2, len(PROMPT_IDS))]
    elif _maybe(rng, 0.15):
        prompt = rng.sample(PROMPTS, 2)
    body: dict = {"model": MODEL, "prompt": prompt}
    if _maybe(rng, 0.15):
        body["echo"] = True
    return body


def generated_request(rng: random.Random) -> Request:
    kind = rng.choices(("chat", "completion", "responses"), (0.55, 0.37, 0.08))[0]
    if kind == "responses":
        body = {"model": MODEL, "input": rng.choice(QUESTIONS), "temperature": 0,
                "max_output_tokens": rng.randint(1, 16), "stream": _maybe(rng, 0.3)}
        return Request("POST", "/v1/responses", body)
    body = _chat(rng) if kind == "chat" else _completion(rng)
    body.update(temperature=0, max_tokens=rng.randint(1, 16))
    if _maybe(rng, 0.3):
        body["stream"] = True
        if _maybe(rng, 0.6):
            body["stream_options"] = {"include_usage": True}
    _sampling(rng, body, kind == "chat")
    if _maybe(rng, 0.08):
        key, value = rng.choice(INVALID)
        body[key] = value
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    return Request("POST", path, body)


def generated(count: int, seed: int) -> list[Case]:
    """`count` requests, the same for the same seed."""
    rng = random.Random(seed)
    return [Case(f"generated-{i}", generated_request(rng)) for i in range(count)]
