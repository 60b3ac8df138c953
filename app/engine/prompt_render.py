"""A prompt rendered to token ids, as the engine renders it: chat messages through the model's chat template (tools
and template variables included), text through the tokenizer, token ids as they are; vLLM's truncation after.

The engine replica renders every prompt it serves (host/prompt_tokenizer.py, with its refusals). The ingress renders
too, for the fleet router only (app/routing/): to know which replica's prefix cache holds a prompt before choosing
one. `ingress_renderer` gives it the model's own tokenizer without vLLM: for a vLLM model the tokenizer files
through transformers' fast tokenizer, as vLLM's own engine uses them (engine/vllm/engine.py renders the same way);
for the fake engine the fake's own rendering.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from app.config.model import ModelConfig
from app.engine.interface import PromptInput

log = logging.getLogger(__name__)


class Renderer(Protocol):
    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                    **template: Any) -> list[int]: ...

    def encode(self, text: str) -> list[int]: ...


def template_args(prompt: PromptInput) -> dict[str, Any]:
    """The chat template's variables for `prompt`: only what differs from the defaults."""
    template: dict[str, Any] = dict(prompt.template_kwargs)
    if not prompt.add_generation_prompt:
        template["add_generation_prompt"] = False
    if prompt.continue_final_message:
        template["continue_final_message"] = True
    return template


def render_prompt(renderer: Renderer, prompt: PromptInput) -> list[int]:
    """The prompt's token ids before truncation; raises what the template or tokenizer raises."""
    if prompt.messages is not None:
        messages = list(prompt.messages)
        if prompt.tools:
            return renderer.render_chat(messages, list(prompt.tools), **template_args(prompt))
        return renderer.render_chat(messages, **template_args(prompt))
    if prompt.text is not None:
        return renderer.encode(prompt.text)
    return list(prompt.token_ids or ())


def truncated(ids: list[int], keep: int, side: str, max_model_len: int) -> list[int]:
    """vLLM's truncate_prompt_tokens (`keep` -1: the context less one token for the output); `keep` is at most
    `max_model_len` (the replica refuses more)."""
    keep = max_model_len - 1 if keep == -1 else keep
    if len(ids) <= keep:
        return ids
    return ids[len(ids) - keep:] if side == "left" else ids[:keep]


class TokenizerRenderer:
    """A model folder's tokenizer and chat template, rendered as `VLLMEngine` renders them."""

    def __init__(self, folder: str):
        from transformers import PreTrainedTokenizerFast  # ~1 s and ~70 MB; AutoTokenizer also imports torch (7 s)

        self._tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                    **template: Any) -> list[int]:
        template.setdefault("add_generation_prompt", True)
        text = self._tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False, **template)
        return list(self._tokenizer.encode(str(text), add_special_tokens=False))

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text))


def ingress_renderer(model: ModelConfig) -> Renderer | None:
    """The renderer for `model` outside its engine, or None (logged) when its tokenizer cannot be loaded here: the
    fleet router then routes by load alone."""
    if model.engine_kind == "fake":
        from app.engine.fake import FakeEngine

        return FakeEngine()
    try:
        from app.engine.model_store import resolve_source

        return TokenizerRenderer(resolve_source(model.source))
    except Exception as err:
        log.warning("model %s: its tokenizer could not be loaded at the ingress (%s); its replicas are routed by "
                    "load alone, without knowing which holds a prompt's prefix", model.id, err)
        return None
