"""`POST /v1/embeddings` on the wire: the request (OpenAI's, with vLLM's extensions that apply), converted into the
engine's `EmbedRequest` inputs, and the answer's shape (vLLM 0.32's `EmbeddingResponse`), floats or base64.

No HTTP and no vLLM here: http/routes.py parses and answers with these, host/engine_host.py computes.
"""

from __future__ import annotations

import base64
import struct
import time
import uuid
from dataclasses import replace
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from app.config.model import LimitsConfig
from app.engine.interface import Embeddings, PromptInput
from app.errors import InvalidRequest, UnsupportedParameter
from app.openai.json_depth import BoundedBody
from app.openai.sampling_bounds import MAX_REQUEST_ID_CHARS

ID_PREFIX = "embd"  # vLLM's ServingEmbedding.request_id_prefix
MAX_TOKEN_ID = 2**31 - 1  # above every vocabulary; the engine checks the model's own size
TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]
# Accepted and without effect.
IGNORED_PARAMETERS = frozenset({"user"})
# vLLM's options that this service takes only at their no-op value (anything else: 400 unsupported_parameter).
NO_OP_VALUES: dict[str, tuple[Any, ...]] = {
    "embed_dtype": (None, "float32"),
    "endianness": (None, "native", "little"),
    "use_activation": (None, True),
    "add_special_tokens": (None, True),
    "priority": (None, 0),
    "padding": (None, "do_not_pad"),
    "cache_salt": (None,),  # vLLM's, for the pooling runner's prefix cache: not carried to the engine here
    "mm_processor_kwargs": (None, {}),
}


class EmbeddingRequest(BoundedBody):
    """OpenAI's embeddings body (`input` a string, a list of strings, a list of token ids, or a list of token-id
    lists), with vLLM's `truncate_prompt_tokens` / `truncation_side`. Unknown fields are refused by name."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None  # as vLLM: left out, the served model
    input: str | list[str] | list[TokenId] | list[list[TokenId]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, le=2**31 - 1)
    truncate_prompt_tokens: int | None = Field(None, ge=-1, le=2**63 - 1)
    truncation_side: Literal["left", "right"] | None = None
    # vLLM's: the answer's id after `embd-` (an X-Request-Id header wins), as on chat
    request_id: str | None = Field(None, min_length=1, max_length=MAX_REQUEST_ID_CHARS)

    @model_validator(mode="before")
    @classmethod
    def _bytes_formats(cls, data: Any) -> Any:
        # vLLM's binary answers are not JSON; say so rather than "not float or base64".
        if isinstance(data, dict) and data.get("encoding_format") in ("bytes", "bytes_only"):
            raise UnsupportedParameter(
                f"encoding_format '{data['encoding_format']}' (vLLM's binary answer) is not supported; use 'float' "
                "or 'base64'",
                param="encoding_format",
            )
        return data

    @model_validator(mode="after")
    def _refuse_unknown(self) -> EmbeddingRequest:
        for name, value in (self.model_extra or {}).items():
            if name in IGNORED_PARAMETERS:
                continue
            if name in NO_OP_VALUES:
                if any(value == v and type(value) is type(v) for v in NO_OP_VALUES[name]):
                    continue
                only = " or ".join(repr(v) for v in NO_OP_VALUES[name] if v is not None) or "null"
                raise UnsupportedParameter(f"'{name}' is supported here only as {only}; remove it (see docs/api.md)",
                                           param=name)
            raise InvalidRequest(f"Unrecognized request argument supplied: {name}", param=name)
        return self

    def to_inputs(self, limits: LimitsConfig) -> tuple[PromptInput, ...]:
        """One `PromptInput` per input, in order, each naming `input` in a 400; at most
        `limits.max_embedding_inputs` of them."""
        raw: Any = self.input
        items: list[Any]
        if isinstance(raw, str):
            items = [raw]
        elif raw and all(isinstance(x, int) for x in raw):
            items = [list(raw)]  # one token-id list
        else:
            items = list(raw)
        if not items:
            raise InvalidRequest("'input' is empty; send at least one string or token-id list", param="input")
        if len(items) > limits.max_embedding_inputs:
            raise InvalidRequest(
                f"'input' has {len(items)} items; this model takes at most {limits.max_embedding_inputs} per request",
                param="input",
            )
        prompts = []
        for item in items:
            if isinstance(item, str):
                if not item:
                    raise InvalidRequest("'input' holds an empty string; every input needs some text", param="input")
                prompt = PromptInput(text=item, param="input")
            else:
                if not item:
                    raise InvalidRequest("'input' holds an empty token-id list", param="input")
                prompt = PromptInput(token_ids=tuple(item), param="input")
            if self.truncate_prompt_tokens is not None:
                prompt = replace(prompt, truncate_to=self.truncate_prompt_tokens,
                                 truncation_side=self.truncation_side or "left")
            prompts.append(prompt)
        return tuple(prompts)


def new_request_id() -> str:
    return f"{ID_PREFIX}-{uuid.uuid4().hex}"


def base64_of(vector: tuple[float, ...] | list[float]) -> str:
    """vLLM's (and OpenAI's) base64: the vector as float32, little-endian (vLLM's `native` on every machine it
    runs on here), which the openai SDK decodes with numpy's float32."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def response_body(request_id: str, model_id: str, answer: Embeddings, encoding_format: str) -> dict[str, Any]:
    """vLLM's EmbeddingResponse, field for field (its `usage` is UsageInfo: completion_tokens 0, no details)."""
    encode = base64_of if encoding_format == "base64" else list
    return {
        "id": request_id,
        "object": "list",
        "created": int(time.time()),
        "model": model_id,
        "data": [{"index": i, "object": "embedding", "embedding": encode(v)} for i, v in enumerate(answer.vectors)],
        "usage": {"prompt_tokens": answer.prompt_tokens, "total_tokens": answer.prompt_tokens,
                  "completion_tokens": 0, "prompt_tokens_details": None, "completion_tokens_details": None},
    }
