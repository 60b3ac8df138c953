"""XgrammarPin: the EngineCore's structured-output backend made xgrammar before its first constrained request.

vLLM's "auto" picks a backend per request in the front end (xgrammar; guidance or outlines for schema keywords
xgrammar lacks), but its EngineCore builds one backend, the first constrained request's, and compiles every later
request with it. Which one a replica ran thus depended on what came first: a schema with `multipleOf` first made it
guidance for every later grammar. A one-token `json_object` request sent ahead of the first constraint makes it
xgrammar, the backend the grammar gate (grammar_gate.py) compiles as, on every replica and after every restart.

    pin = XgrammarPin(llm, prompt_ids)   # once the engine has started
    await pin.ensure()                   # before a constrained request goes to the engine; at once after the first
"""

from __future__ import annotations

import asyncio
import uuid

from vllm.inputs import TokensPrompt
from vllm.sampling_params import SamplingParams, StructuredOutputsParams
from vllm.v1.engine.async_llm import AsyncLLM


class XgrammarPin:
    def __init__(self, llm: AsyncLLM, prompt_ids: list[int]):
        self._llm = llm
        self._prompt = TokensPrompt(prompt_token_ids=prompt_ids[:1] or [0])
        self._done: asyncio.Future[None] | None = None

    async def ensure(self) -> None:
        failed = self._done is not None and self._done.done() and (self._done.cancelled() or self._done.exception())
        if self._done is None or failed:  # tried again at the next constraint
            self._done = asyncio.ensure_future(self._pin())  # one for all the requests that wait on it
        await asyncio.shield(self._done)

    async def _pin(self) -> None:
        # json_object needs nothing xgrammar lacks: vLLM's front end gives it to xgrammar, and so the EngineCore.
        params = SamplingParams(max_tokens=1, structured_outputs=StructuredOutputsParams(json_object=True))
        async for _ in self._llm.generate(self._prompt, params, f"pin-xgrammar-{uuid.uuid4().hex}"):
            pass
