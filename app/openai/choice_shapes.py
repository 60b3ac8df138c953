"""How a choice looks on the wire, chat's and completions': its chunks, its whole form, its logprobs and the
prompt's scores. `ChatShape` and `CompletionShape` are the one place where the two APIs differ in an answer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.engine.interface import ChoiceDelta, PromptTokenLogprob, TokenLogprob, ToolCallDelta
from app.openai.tool_calls import REQUIRED, ForcedCalls, ToolCall


def utf8_bytes(text: str) -> list[int]:
    return list(text.encode("utf-8"))


class ChatShape:
    """Chat's choices. With `forced_tool_choice` ("required" or a function's name) the text is the JSON that
    decoding was held to, and the choice carries it as tool calls (app/openai/tool_calls.py); calls an engine's
    tool-call parser found (tool_choice "auto") arrive as `ChoiceDelta.tool_calls`. With `echo_text` (vLLM's
    `echo`: the final message's content, when that message is the assistant's) each choice's content starts
    with it."""

    object_full = "chat.completion"
    object_chunk = "chat.completion.chunk"

    def __init__(self, forced_tool_choice: str | None = None, echo_text: str | None = None, role: str = "assistant",
                 top_logprobs: int | None = None):
        self.forced_tool_choice = forced_tool_choice
        self.echo_text = echo_text if forced_tool_choice is None else None
        self.role = role  # vLLM's: "assistant", or the last message's role when no generation prompt was added
        self.top_logprobs = top_logprobs  # how many of each token's alternatives to show (None: all given)
        self._forced: dict[int, ForcedCalls] = {}  # choice index -> its calls so far (streaming)
        self._called: set[int] = set()  # choices with a tool call streamed

    def logprobs(self, lps: tuple[TokenLogprob, ...] | list[TokenLogprob]) -> dict[str, Any]:
        # The engine gives the chosen token first, then the top ones (engine/vllm/from_vllm.py); chat shows the first
        # `top_logprobs` of them, as vLLM's server does.
        return {
            "content": [
                {
                    "token": lp.token,
                    "logprob": lp.logprob,
                    # vLLM's: the chosen token's own text's bytes, even where `token` names it by id
                    "bytes": utf8_bytes(lp.token if lp.text is None else lp.text),
                    "top_logprobs": [{"token": t, "logprob": v, "bytes": utf8_bytes(t)}
                                     for t, v in lp.top[: self.top_logprobs]],
                }
                for lp in lps
            ]
        }

    def _finish_reason(self, reason: str | None, called: bool) -> str | None:
        # OpenAI's (and vLLM's): "tool_calls" when "required" or the model's own choice called a tool; a named
        # function's call ends with "stop".
        if reason == "stop" and called and self.forced_tool_choice in (None, REQUIRED):
            return "tool_calls"
        return reason

    def role_and_echo(self, index: int) -> tuple[str, str | None]:
        """Choice `index`'s role and echoed text (the same for every choice of one conversation)."""
        return self.role, self.echo_text

    def chunk_choice(self, c: ChoiceDelta, first: bool) -> dict[str, Any]:
        role, echo = self.role_and_echo(c.index)
        delta: dict[str, Any] = {"role": role} if first else {}
        if self.forced_tool_choice is not None:
            calls = self._forced.setdefault(c.index, ForcedCalls(self.forced_tool_choice)).feed(c.text)
        else:
            calls = list(c.tool_calls)
            text = (echo or "") + c.text if first else c.text
            if text or not calls:
                delta["content"] = text
        if calls:
            self._called.add(c.index)
            delta["tool_calls"] = [tool_call_delta(t) for t in calls]
        return {
            "index": c.index,
            "delta": delta,
            "logprobs": self.logprobs(c.logprobs) if c.logprobs is not None else None,
            "finish_reason": self._finish_reason(c.finish_reason, c.index in self._called),
        }

    def full_choice(self, acc: ChoiceState) -> dict[str, Any]:
        role, echo = self.role_and_echo(acc.index)
        message: dict[str, Any] = {"role": role, "content": (echo or "") + acc.text}
        if self.forced_tool_choice is not None:
            calls = ForcedCalls(self.forced_tool_choice).calls(acc.text)
            message["content"] = ""  # as vLLM answers a forced call
        else:
            calls = list(acc.tool_calls.values())
            if calls and not message["content"]:
                message["content"] = None
        if calls:
            message["tool_calls"] = [
                {"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
                for t in calls
            ]
        return {
            "index": acc.index,
            "message": message,
            "logprobs": self.logprobs(acc.logprobs) if acc.logprobs is not None else None,
            "finish_reason": self._finish_reason(acc.finish_reason, bool(calls)),
        }


def tool_call_delta(t: ToolCallDelta) -> dict[str, Any]:
    if t.id is None:
        return {"index": t.index, "function": {"arguments": t.arguments}}
    return {"index": t.index, "id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}


class CompletionShape:
    """Completions' choices. With `echo`, each choice's text starts with its prompt's: `echo_texts` by prompt
    (a batch's choice i * n + j is prompt i's), filled in for token-id prompts once the engine decoded them. With
    `echo_logprobs` (`echo` and `logprobs`), the prompt's tokens head the logprobs too, the first without a
    logprob, and `text_offset` counts from the start of the echoed prompt, as vLLM's server answers. Not
    `echo_in_text` (vLLM's `echo` with `return_token_ids`): the text leaves the prompt out, its ids being in
    `prompt_token_ids`; its logprobs and offsets stay as with it. `echo_only` (vLLM's `echo` with `max_tokens`
    0): the prompt alone; the one token generated is counted in usage, as vLLM's is, but not shown."""

    object_full = "text_completion"
    object_chunk = "text_completion"

    def __init__(self, echo_text: str | None = None, n: int = 1, echo_texts: list[str | None] | None = None,
                 echo_logprobs: bool = False, echo_in_text: bool = True, echo_only: bool = False):
        self.n, self.echo_in_text, self.echo_only = n, echo_in_text, echo_only
        self.echo_texts: list[str | None] = list(echo_texts) if echo_texts is not None else [echo_text]
        self.echo_logprobs = echo_logprobs
        self.prompt_scores: dict[int, list[PromptScore]] = {}  # prompt index -> its tokens, with echo_logprobs
        self._offsets: dict[int, int] = {}  # choice index -> where its next streamed text starts

    @property
    def echo_text(self) -> str | None:
        return self.echo_texts[0] if self.echo_texts else None

    def _echo(self, index: int) -> str:
        prompt = index // self.n
        return (self.echo_texts[prompt] if prompt < len(self.echo_texts) else None) or ""

    @staticmethod
    def logprobs(lps: Sequence[TokenLogprob], offset: int = 0, prompt: Sequence[PromptScore] = ()) -> dict[str, Any]:
        """`prompt`: the echoed prompt's tokens, first; offsets then run from 0 over both (vLLM's)."""
        offsets, pos = [], 0 if prompt else offset
        for token in [p.token for p in prompt] + [lp.token for lp in lps]:
            offsets.append(pos)
            pos += len(token)
        return {
            "tokens": [p.token for p in prompt] + [lp.token for lp in lps],
            "token_logprobs": [p.logprob for p in prompt] + [lp.logprob for lp in lps],
            "top_logprobs": [p.top for p in prompt] + [{t: v for t, v in lp.top} for lp in lps],
            "text_offset": offsets,
        }

    def _scores(self, index: int) -> list[PromptScore]:
        return self.prompt_scores.get(index // self.n, []) if self.echo_logprobs else []

    def chunk_choice(self, c: ChoiceDelta, first: bool) -> dict[str, Any]:
        echo = self._echo(c.index)
        out_text, out_lps = ("", ()) if self.echo_only else (c.text, c.logprobs or ())
        text = (echo if self.echo_in_text else "") + out_text if first else out_text
        start = self._offsets.get(c.index, len(echo))  # text_offset counts from the choice's whole text
        self._offsets[c.index] = start + len(out_text)
        shown = self._scores(c.index) if first else []
        return {
            "index": c.index,
            "text": text,
            "logprobs": self.logprobs(out_lps, start, shown) if c.logprobs is not None else None,
            "finish_reason": c.finish_reason,
        }

    def full_choice(self, acc: ChoiceState) -> dict[str, Any]:
        echo = self._echo(acc.index)
        shown = self._scores(acc.index)
        out_text, out_lps = ("", []) if self.echo_only else (acc.text, acc.logprobs or [])
        return {
            "index": acc.index,
            "text": (echo if self.echo_in_text else "") + out_text,
            "logprobs": self.logprobs(out_lps, len(echo), shown) if acc.logprobs is not None else None,
            "finish_reason": acc.finish_reason,
        }


@dataclass(frozen=True)
class PromptScore:
    """One echoed prompt token as completions' logprobs list it: the first has no logprob and no alternatives."""

    token: str
    logprob: float | None
    top: dict[str, float] | None


def prompt_scores(first: str | None, positions: tuple[tuple[PromptTokenLogprob, ...] | None, ...]
                   ) -> list[PromptScore]:
    scores = []
    for alts in positions:
        if alts is None:  # the first token
            scores.append(PromptScore(first or "", None, None))
        else:  # its own token first, then the others (engine/vllm/from_vllm.py), all shown as vLLM shows them
            scores.append(PromptScore(alts[0].name or alts[0].text, alts[0].logprob,
                                      {a.name or a.text: a.logprob for a in alts}))
    return scores


def prompt_logprobs_json(
    positions: tuple[tuple[PromptTokenLogprob, ...] | None, ...],
) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's JSON: per prompt position None (the first) or {token id: {logprob, rank, decoded_token}}."""
    return [None if alts is None else {str(a.token_id): {"logprob": a.logprob, "rank": a.rank, "decoded_token": a.text}
                                       for a in alts} for alts in positions]


@dataclass
class ChoiceState:
    index: int
    text: str = ""
    tokens: int = 0
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # vLLM's: the stop token id or string that ended it
    logprobs: list[TokenLogprob] | None = None
    started: bool = False
    tool_calls: dict[int, ToolCall] = field(default_factory=dict)  # found by the engine's parser, by call index
    token_ids: list[int] = field(default_factory=list)  # with return_token_ids
    prompt_token_ids: list[int] | None = None  # with return_token_ids: its prompt's (a batch has several)
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None  # with prompt_logprobs: its prompt's
