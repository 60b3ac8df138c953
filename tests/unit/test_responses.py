"""`app/openai/answers.py`: neutral engine output to OpenAI objects (stream chunks, the final body, usage,
logprobs and their offsets, echo), with no HTTP and no engine."""

from __future__ import annotations

from app.engine.interface import Admitted, ChoiceDelta, GenerationDelta, TokenLogprob
from app.openai.answers import Responder
from app.openai.choice_shapes import ChatShape, CompletionShape
from tests.support.fake_stack import usage_of

CREATED = 1_700_000_000


def delta(*choices: ChoiceDelta) -> GenerationDelta:
    return GenerationDelta(choices=choices)


def lp(token: str, logprob: float, *top: tuple[str, float]) -> TokenLogprob:
    return TokenLogprob(token=token, logprob=logprob, top=top)


def chat(n: int = 1, include_usage: bool = False) -> Responder:
    return Responder(request_id="chatcmpl-1", model="m", shape=ChatShape(), n=n, include_usage=include_usage,
                     created=CREATED)


def completion(echo: str | None = None, n: int = 1) -> Responder:
    return Responder(request_id="cmpl-1", model="m", shape=CompletionShape(echo_text=echo), n=n, created=CREATED)


def one_chunk(r: Responder, d: GenerationDelta) -> dict:
    """The one chunk of a delta of one choice."""
    (only,) = r.chunks(d)
    return only


async def stream_of(*deltas: GenerationDelta):
    for d in deltas:
        yield d


# -- chat ----------------------------------------------------------------------------------------

def test_chat_chunks_name_the_role_once_per_choice():
    r = chat()
    r.admitted(Admitted(prompt_tokens=5))
    first = one_chunk(r, delta(ChoiceDelta(index=0, text="Hel", num_tokens=1)))
    assert first == {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": CREATED, "model": "m",
                     "prompt_token_ids": None,  # vLLM's, on the first chunk only
                     "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}, "logprobs": None,
                                  "finish_reason": None, "token_ids": None}]}
    last = one_chunk(r, delta(ChoiceDelta(index=0, text="lo", num_tokens=1, finish_reason="stop")))
    assert "prompt_token_ids" not in last
    assert last["choices"] == [{"index": 0, "delta": {"content": "lo"}, "logprobs": None, "finish_reason": "stop",
                                "stop_reason": None, "token_ids": None}]  # stop_reason: on the chunk that ends it
    assert "usage" not in first and "usage" not in last  # only asked for with include_usage


def test_chat_chunks_of_several_choices_are_one_per_choice_each_starting_with_the_role():
    """vLLM's server and OpenAI send each choice in a chunk of its own: a client reading `choices[0]` of each
    chunk gets every choice's text."""
    r = chat(n=2, include_usage=True)
    r.continuous_usage = True
    r.admitted(Admitted(prompt_tokens=3))
    one = r.chunks(delta(ChoiceDelta(index=0, text="a", num_tokens=1)))
    two = r.chunks(delta(ChoiceDelta(index=0, text="b", num_tokens=1), ChoiceDelta(index=1, text="x", num_tokens=1)))
    assert [[c["delta"] for c in chunk["choices"]] for chunk in one] == [[{"role": "assistant", "content": "a"}]]
    assert [[(c["index"], c["delta"]) for c in chunk["choices"]] for chunk in two] == [
        [(0, {"content": "b"})], [(1, {"role": "assistant", "content": "x"})]]
    assert "prompt_token_ids" in one[0] and not any("prompt_token_ids" in c for c in two)  # the first chunk's only
    assert [c["usage"]["completion_tokens"] for c in (*one, *two)] == [1, 2, 3]  # each chunk: every choice so far


def test_chat_include_usage_sets_null_usage_on_chunks_then_a_usage_chunk():
    r = chat(include_usage=True)
    r.admitted(Admitted(prompt_tokens=4))
    chunk = one_chunk(r, delta(ChoiceDelta(index=0, text="Hi", num_tokens=2, finish_reason="length")))
    assert chunk["usage"] is None
    assert r.usage_chunk() == {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": CREATED, "model": "m",
                               "choices": [], "usage": usage_of(4, 2, streamed=True)}


def test_chat_full_body_accumulates_text_tokens_and_finish():
    r = chat(n=2)
    r.admitted(Admitted(prompt_tokens=3))
    for d in (delta(ChoiceDelta(index=0, text="Par", num_tokens=1), ChoiceDelta(index=1, text="Lon", num_tokens=1)),
              delta(ChoiceDelta(index=0, text="is", num_tokens=1, finish_reason="stop", stop_reason="\n")),
              delta(ChoiceDelta(index=1, text="don", num_tokens=2, finish_reason="length"))):
        r.chunks(d)
    assert r.full() == {
        "id": "chatcmpl-1", "object": "chat.completion", "created": CREATED, "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "Paris"}, "logprobs": None,
             "finish_reason": "stop", "stop_reason": "\n",  # the stop string that ended it (vLLM's extension)
             "token_ids": None},
            {"index": 1, "message": {"role": "assistant", "content": "London"}, "logprobs": None,
             "finish_reason": "length", "stop_reason": None, "token_ids": None},
        ],
        "prompt_token_ids": None, "prompt_logprobs": None,  # vLLM's fields, null unless asked for
        "usage": usage_of(3, 5),
    }


def test_chat_logprobs_with_utf8_bytes_in_chunks_and_body():
    r = chat()
    first = one_chunk(r, delta(ChoiceDelta(index=0, text="é", num_tokens=1,
                                           logprobs=(lp("é", -0.5, ("é", -0.5), ("e", -1.0)),))))
    one_chunk(r, delta(ChoiceDelta(index=0, text="!", num_tokens=1, finish_reason="stop", logprobs=(lp("!", -0.25),))))
    entry = {"token": "é", "logprob": -0.5, "bytes": [0xC3, 0xA9],
             "top_logprobs": [{"token": "é", "logprob": -0.5, "bytes": [0xC3, 0xA9]},
                              {"token": "e", "logprob": -1.0, "bytes": [0x65]}]}
    assert first["choices"][0]["logprobs"] == {"content": [entry]}
    body = r.full()["choices"][0]["logprobs"]
    assert body == {"content": [entry, {"token": "!", "logprob": -0.25, "bytes": [0x21], "top_logprobs": []}]}


async def test_collect_builds_the_same_body_as_chunks_do():
    deltas = (delta(ChoiceDelta(index=0, text="a", num_tokens=1, logprobs=(lp("a", -1.0),))),
              delta(ChoiceDelta(index=0, text="b", num_tokens=1, finish_reason="stop", logprobs=(lp("b", -2.0),))))
    streamed = chat()
    for d in deltas:
        streamed.chunks(d)
    collected = chat()
    assert await collected.collect(stream_of(*deltas)) == streamed.full()
    assert collected.full()["choices"][0]["message"]["content"] == "ab"
    assert collected.usage()["completion_tokens"] == 2


def test_a_choice_that_produced_nothing_is_empty_and_unfinished():
    r = chat(n=2)
    one_chunk(r, delta(ChoiceDelta(index=1, text="x", num_tokens=1, finish_reason="stop")))
    choices = r.full()["choices"]
    assert choices[0]["message"]["content"] == "" and choices[0]["finish_reason"] is None
    assert choices[1]["message"]["content"] == "x"


def test_usage_before_admission_counts_no_prompt():
    assert chat().usage() == usage_of(0, 0)


# -- completions ---------------------------------------------------------------------------------

def test_completion_chunks_and_body_shape():
    r = completion()
    r.admitted(Admitted(prompt_tokens=2))
    chunk = one_chunk(r, delta(ChoiceDelta(index=0, text=" Paris", num_tokens=1, finish_reason="length")))
    assert chunk == {"id": "cmpl-1", "object": "text_completion", "created": CREATED, "model": "m",
                     "choices": [{"index": 0, "text": " Paris", "logprobs": None, "finish_reason": "length",
                                  "stop_reason": None, "prompt_token_ids": None, "token_ids": None}]}
    assert r.full() == {"id": "cmpl-1", "object": "text_completion", "created": CREATED, "model": "m",
                        "choices": [{"index": 0, "text": " Paris", "logprobs": None, "finish_reason": "length",
                                     "stop_reason": None, "prompt_token_ids": None, "token_ids": None,
                                     "prompt_logprobs": None}],
                        "usage": usage_of(2, 1)}


def test_completion_echo_prefixes_the_first_chunk_and_the_body_only():
    r = completion(echo="Q: ")
    chunks = [one_chunk(r, delta(ChoiceDelta(index=0, text=t, num_tokens=1))) for t in ("A", "B")]
    assert [c["choices"][0]["text"] for c in chunks] == ["Q: A", "B"]
    assert r.full()["choices"][0]["text"] == "Q: AB"


def test_completion_logprobs_offsets_count_from_the_whole_text_across_chunks():
    r = completion(echo="Hi ")
    a = one_chunk(r, delta(ChoiceDelta(index=0, text="ab", num_tokens=2,
                                       logprobs=(lp("a", -0.1, ("a", -0.1), ("b", -3.0)), lp("b", -0.2)))))
    c = one_chunk(r, delta(ChoiceDelta(index=0, text="cd", num_tokens=1, finish_reason="stop",
                                       logprobs=(lp("cd", -0.3),))))
    assert a["choices"][0]["logprobs"] == {"tokens": ["a", "b"], "token_logprobs": [-0.1, -0.2],
                                           "top_logprobs": [{"a": -0.1, "b": -3.0}, {}], "text_offset": [3, 4]}
    assert c["choices"][0]["logprobs"]["text_offset"] == [5]  # after the echo and the first chunk's text
    body = r.full()["choices"][0]
    assert body["text"] == "Hi abcd"
    assert body["logprobs"] == {"tokens": ["a", "b", "cd"], "token_logprobs": [-0.1, -0.2, -0.3],
                                "top_logprobs": [{"a": -0.1, "b": -3.0}, {}, {}], "text_offset": [3, 4, 5]}
    for token, offset in zip(body["logprobs"]["tokens"], body["logprobs"]["text_offset"], strict=True):
        assert body["text"][offset:offset + len(token)] == token  # each offset indexes the text the client gets


def test_completion_offsets_are_per_choice():
    r = completion(n=2)
    one_chunk(r, delta(ChoiceDelta(index=0, text="xyz", num_tokens=1, logprobs=(lp("xyz", -1.0),))))
    other = one_chunk(r, delta(ChoiceDelta(index=1, text="q", num_tokens=1, logprobs=(lp("q", -1.0),))))
    again = one_chunk(r, delta(ChoiceDelta(index=0, text="w", num_tokens=1, logprobs=(lp("w", -1.0),))))
    assert other["choices"][0]["logprobs"]["text_offset"] == [0]  # choice 1 starts at its own beginning
    assert again["choices"][0]["logprobs"]["text_offset"] == [3]


def test_completion_without_echo_offsets_start_at_zero():
    r = completion()
    one_chunk(r, delta(ChoiceDelta(index=0, text="ok", num_tokens=1, logprobs=(lp("ok", -0.5),))))
    assert r.full()["choices"][0]["logprobs"]["text_offset"] == [0]


def test_each_completion_choice_gets_its_prompts_ids_though_it_starts_in_a_later_delta():
    """vLLM sends the prompt's ids with each choice's first chunk (return_token_ids); the engine brings them with
    the first delta only, which may hold only some of the prompt's choices."""
    r = Responder(request_id="cmpl-1", model="m", shape=CompletionShape(n=2), n=2, created=CREATED,
                  return_token_ids=True)
    r.admitted(Admitted(prompt_tokens=3))
    first = one_chunk(r, GenerationDelta(choices=(ChoiceDelta(index=0, text="a", num_tokens=1, token_ids=(7,)),),
                                         prompt_token_ids=(1, 2, 3)))
    later = one_chunk(r, delta(ChoiceDelta(index=1, text="b", num_tokens=1, token_ids=(8,))))
    assert first["choices"][0]["prompt_token_ids"] == [1, 2, 3]
    assert later["choices"][0]["index"] == 1 and later["choices"][0]["prompt_token_ids"] == [1, 2, 3]
