"""What one request has produced so far, per choice, and the requests that finish it on another replica.

The ingress tier holds the client's connection; an engine replica that dies, wedges or is stopped under a
request ends its stream with a retryable 503 (`ServiceUnavailable`) after the client has already been sent
part of the answer. `Continuation` watches the stream on its way to the client and keeps, per choice, the
token ids already generated (the engine is asked for them: `return_token_ids`) and whether the choice has
finished; from that it makes the requests that resume each unfinished choice elsewhere: the prompt's token ids
plus that choice's, `max_tokens` less what was generated, the same sampling parameters and seed, one choice
each (`resume`). What it passes on (`observe`) is the stream the client would have had from one replica: one
`Admitted` (the first replica's prompt count; usage counts the prompt once), the resumed choices under their
own indices, completion tokens as generated overall.

Usage contract (`rayserve.handle_backend.HandleBackend`): `for_engine()` is the first request to send; every item that
comes back goes through `observe` (None: swallow it); after a mid-stream failure, `unresumable()` says why the
request cannot move (then it ends with the retryable error), else `resume(i, timeout_s)` for each index of
`unfinished()`, whose streams go through `observe(item, index=i)`.

A greedy choice continues exactly as it would have (the continuation's prefill computes the same tokens, up to
CPU float rounding; docs/architecture.md); a sampled one continues as a fresh sample of the same distribution
(the seed restarts its generator). Not resumable: structured outputs and forced tool calls (the grammar's state
is the replica's), `tool_choice: "auto"` (the tool-call parser's state is the replica's); `presence_penalty` and
`frequency_penalty` then count only the tokens generated after the resume (vLLM counts them over the output).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from app.engine.interface import Admitted, ChoiceDelta, GenerateRequest, GenerationDelta, PromptInput


@dataclass
class _Choice:
    token_ids: list[int] = field(default_factory=list)
    finished: bool = False


class Continuation:
    """One request's output so far, per choice (see the module's usage contract)."""

    def __init__(self, request: GenerateRequest):
        self.request = request
        self.prompt_ids: tuple[int, ...] | None = None
        self.admitted: Admitted | None = None
        self.choices = [_Choice() for _ in range(request.params.n)]
        self.resumes = 0  # continuation requests made so far

    def for_engine(self) -> GenerateRequest:
        """The request as first sent: asking for the token ids that a resume needs."""
        return replace(self.request, params=replace(self.request.params, return_token_ids=True))

    @property
    def started(self) -> bool:
        """Something has been passed on to the client (its 200 and the stream's first chunks)."""
        return self.admitted is not None

    def observe(self, item: object, index: int | None = None) -> object | None:
        """`item` as the client's stream carries it, or None when it must not reach the client (a resumed
        stream's own `Admitted`). `index`: the choice a resumed (single-choice) stream continues."""
        if isinstance(item, Admitted):
            if self.admitted is not None:
                return None
            self.admitted = item
            return item
        if not isinstance(item, GenerationDelta):
            return item
        if self.prompt_ids is None and item.prompt_token_ids is not None and index is None:
            self.prompt_ids = item.prompt_token_ids
        choices = tuple(self._absorb(c if index is None else replace(c, index=index)) for c in item.choices)
        client_wants_ids = self.request.params.return_token_ids
        return replace(
            item,
            choices=choices if client_wants_ids else tuple(replace(c, token_ids=None) for c in choices),
            prompt_token_ids=item.prompt_token_ids if client_wants_ids and index is None else None,
            cached_tokens=item.cached_tokens if index is None else None,  # a continuation's prompt is not the client's
            prompt_logprobs=item.prompt_logprobs if index is None else None,
        )

    def _absorb(self, c: ChoiceDelta) -> ChoiceDelta:
        state = self.choices[c.index]
        state.token_ids.extend(c.token_ids or ())
        if c.finish_reason is not None:
            state.finished = True
        return c

    def unfinished(self) -> list[int]:
        return [i for i, c in enumerate(self.choices) if not c.finished]

    def unresumable(self) -> str | None:
        """Why this request cannot continue on another replica, or None."""
        p = self.request.params
        if p.json_schema is not None or p.json_object or p.regex is not None or p.choice is not None or (
                p.grammar is not None):
            return "its structured output's grammar state stays with the replica that failed"
        if p.auto_tools is not None:
            return "its tool-call parser's state stays with the replica that failed"
        if self.started and self.prompt_ids is None and any(c.token_ids for c in self.choices):
            return "the engine did not report the prompt's token ids"
        return None

    def resume(self, index: int, timeout_s: float) -> GenerateRequest:
        """The request that finishes choice `index`: the prompt's ids and the choice's own as its prompt (or the
        original prompt when nothing was generated yet), the tokens still allowed, one choice. A default
        `max_tokens` stays a default: the replica shrinks it to the context left, as the first one did."""
        self.resumes += 1
        p, done = self.request.params, self.choices[index].token_ids
        prompt = (PromptInput(token_ids=(*self.prompt_ids, *done)) if self.prompt_ids is not None
                  else self.request.prompt)
        params = replace(
            p,
            n=1,
            max_tokens=p.max_tokens - len(done),
            min_tokens=max(0, p.min_tokens - len(done)),
            return_token_ids=True,
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
