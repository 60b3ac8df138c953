"""What one request has produced so far, per choice, and the requests that finish it on another replica.

The ingress tier holds the client's connection; an engine replica that dies, wedges or is stopped under a
request ends its stream with a retryable 503 (`ServiceUnavailable`) after the client has already been sent
part of the answer. `Continuation` watches the stream on its way to the client and keeps, per choice, the
token ids already generated (the engine is asked for them: `return_token_ids`) and whether the choice has
finished; from that it makes the requests that resume each unfinished choice elsewhere: the prompt's token ids
plus that choice's, `max_tokens` less what was generated, the same sampling parameters, choice i's seed
(vLLM samples choice i with `seed + i`), one choice each (`resume`). What it passes on (`observe`) is the
stream the client would have had from one replica: one `Admitted` (the first replica's prompt count; usage
counts the prompt once), the resumed choices under their own indices, completion tokens as generated overall.

Stop strings are matched here, at the layer that holds every token's text (app/engine/stop_strings.py): an
engine holding back the text that may start a stop string would lose it with the replica, and a stop string
spanning the cut would never match on the next one. The engine is asked to stop on them with
`include_stop_str_in_output` (so it holds nothing back and still ends the choice itself); where that would add
a stop token's text to the output (`stop_token_ids`, special tokens kept) it is not given them at all and the
stream is closed here when one matches.

Usage contract (`rayserve.handle_backend.HandleBackend`): `for_engine()` is the first request to send; every item
that comes back goes through `observe` (None: swallow it); once `finished(i)` (or `all_finished()`) the stream
may be closed; after a mid-stream failure, `unresumable()` says why the request cannot move (then it ends with
the retryable error), else `resume(i, timeout_s)` for each index of `unfinished()`, whose streams go through
`observe(item, index=i)`.

A greedy choice continues exactly as it would have (the continuation's prefill computes the same tokens, up to
CPU float rounding; docs/architecture.md); a seeded sampled one too on a CPU engine, its generator advanced by
the draws already made (app/engine/vllm/generator_resume.py); an unseeded one continues as a fresh sample of the
same distribution. The engine counts the choice's tokens so far as its output (`resumed_output`;
app/engine/vllm/output_resume.py): penalties, bad words and a structured output's grammar (forced tool calls
included) go on from where the first replica was. With `tool_choice: "auto"` the model's tool-call parser runs
beside the engine, and the stop strings are matched there, before it: each step's text is kept here
(`ChoiceDelta.parsed_text`) and read again by the next replica's stop strings and parser before the new tokens
(`parser_replay`; app/engine/vllm/tool_parsing.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from app.engine.interface import Admitted, ChoiceDelta, GenerateRequest, GenerationDelta, GenerationParams, PromptInput
from app.engine.stop_strings import StopStrings


@dataclass
class _Choice:
    token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    stops: StopStrings | None = None  # the client's stop strings, when matched here
    parsed: list[tuple[str, tuple[int, ...]]] | None = None  # with auto_tools: each step's text and token ids


def stops_in_engine(p: GenerationParams) -> bool:
    """The engine is asked to stop on the client's stop strings itself (the text it adds stays the client's), so
    nothing runs on once this layer has matched one; with stop token ids, or special tokens kept, a stop token's
    text would be added to the output, and the stop strings are matched here only."""
    return not p.stop_token_ids and p.skip_special_tokens


class Continuation:
    """One request's output so far, per choice (see the module's usage contract)."""

    def __init__(self, request: GenerateRequest):
        self.request = request
        self.prompt_ids: tuple[int, ...] | None = None
        self.admitted: Admitted | None = None
        p = request.params
        matched_here = bool(p.stop) and p.auto_tools is None  # with auto tools: before the parser, on the replica
        self.choices = [_Choice(stops=StopStrings(p.stop, p.include_stop_str_in_output, p.min_tokens)
                                if matched_here else None, parsed=[] if p.auto_tools is not None else None)
                        for _ in range(p.n)]
        self.resumes = 0  # continuation requests made so far

    def _engine_params(self, params: GenerationParams) -> GenerationParams:
        """`params` as an engine is asked them: the token ids a resume needs; the stop strings as the module
        docstring says."""
        params = replace(params, return_token_ids=True)
        if self.choices[0].stops is None:
            return params
        if not stops_in_engine(params):
            return replace(params, stop=())  # a stop token's text would be kept: match here only
        return replace(params, include_stop_str_in_output=True)

    def for_engine(self) -> GenerateRequest:
        """The request as first sent."""
        return replace(self.request, params=self._engine_params(self.request.params))

    @property
    def started(self) -> bool:
        """Something has been passed on to the client (its 200 and the stream's first chunks)."""
        return self.admitted is not None

    def observe(self, item: object, index: int | None = None) -> object | None:
        """`item` as the client's stream carries it, or None when it must not reach the client (a resumed
        stream's own `Admitted`; what a choice finished here still makes). `index`: the choice a resumed
        (single-choice) stream continues."""
        if isinstance(item, Admitted):
            if self.admitted is not None:
                return None
            self.admitted = item
            return item
        if not isinstance(item, GenerationDelta):
            return item
        if self.prompt_ids is None and item.prompt_token_ids is not None and index is None:
            self.prompt_ids = item.prompt_token_ids
        live = [c if index is None else replace(c, index=index) for c in item.choices]
        choices = tuple(self._absorb(c) for c in live if not self.choices[c.index].finished)
        if not choices and item.choices:
            return None
        client_wants_ids = self.request.params.return_token_ids
        return replace(
            item,
            choices=choices if client_wants_ids else tuple(replace(c, token_ids=None) for c in choices),
            prompt_token_ids=item.prompt_token_ids if client_wants_ids and index is None else None,
            cached_tokens=item.cached_tokens if index is None else None,  # a continuation's prompt is not the client's
            created_cache_tokens=item.created_cache_tokens if index is None else None,
            prompt_logprobs=item.prompt_logprobs if index is None else None,
        )

    def _absorb(self, c: ChoiceDelta) -> ChoiceDelta:
        state = self.choices[c.index]
        state.token_ids.extend(c.token_ids or ())
        if state.parsed is not None and c.parsed_text is not None:
            state.parsed.append((c.parsed_text, tuple(c.token_ids or ())))
        if state.stops is not None:
            engine_stopped_on_string = c.finish_reason == "stop" and isinstance(c.stop_reason, str)
            matched = state.stops.add(c.text, c.num_tokens)
            if matched is None and engine_stopped_on_string:
                matched = str(c.stop_reason)
                state.stops.ended_by(matched)
            finish = "stop" if matched is not None else c.finish_reason
            c = replace(c, text=state.stops.release(finish is not None), finish_reason=finish,
                        stop_reason=matched if matched is not None else c.stop_reason)
        if c.finish_reason is not None:
            state.finished = True
        return c

    def finished(self, index: int) -> bool:
        return self.choices[index].finished

    def all_finished(self) -> bool:
        return all(c.finished for c in self.choices)

    def unfinished(self) -> list[int]:
        return [i for i, c in enumerate(self.choices) if not c.finished]

    def unresumable(self) -> str | None:
        """Why this request cannot continue on another replica, or None."""
        if self.started and self.prompt_ids is None and any(c.token_ids for c in self.choices):
            return "the engine did not report the prompt's token ids"
        if any(c.parsed is not None and sum(len(ids) for _, ids in c.parsed) != len(c.token_ids)
               for c in self.choices):
            return "the engine did not report the text its tool-call parser read"  # a replica of an older version
        return None

    def resume(self, index: int, timeout_s: float) -> GenerateRequest:
        """The request that finishes choice `index`: the prompt's ids and the choice's own as its prompt (or the
        original prompt when nothing was generated yet), the tokens still allowed, one choice with choice
        `index`'s seed. A default `max_tokens` stays a default: the replica shrinks it to the context left, as
        the first one did (and ends the choice at once when none is left)."""
        self.resumes += 1
        p, done = self.request.params, self.choices[index].token_ids
        prompt = (PromptInput(token_ids=(*self.prompt_ids, *done)) if self.prompt_ids is not None
                  else self.request.prompt)
        params = replace(
            self._engine_params(p),
            n=1,
            seed=None if p.seed is None else p.seed + index,
            max_tokens=p.max_tokens - len(done),
            min_tokens=max(0, p.min_tokens - len(done)),
            prompt_logprobs=None,  # the client had the prompt's from the first replica
            generator_draws=len(done) if p.seed is not None and p.temperature > 0 else 0,
            resumed_output=len(done) if self.prompt_ids is not None else 0,
            parser_replay=tuple(self.choices[index].parsed or ()),
        )
        return replace(
            self.request,
            request_id=f"{self.request.request_id}-resume{self.resumes}-{index}",
            prompt=prompt,
            params=params,
            timeout_s=timeout_s,
            want_prompt_text=False,
            resumed_tokens=len(done) if self.prompt_ids is not None else 0,
            continuation=True,
        )
