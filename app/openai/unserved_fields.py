"""What a chat or completions request may carry that the service does not act on: fields accepted without effect,
known ones refused by name (unless sent as their no-op value), and anything else refused in vLLM's words. docs/api.md
lists them; the Responses API takes the same ignored ones (app/openai/responses_api.py)."""

from __future__ import annotations

from typing import Any

from app.errors import InvalidRequest, UnsupportedParameter

# Accepted and without effect (docs/api.md); vLLM's include_reasoning acts only through a reasoning parser (none here).
IGNORED_PARAMETERS = ("user", "metadata", "store", "service_tier", "safety_identifier", "include_reasoning")

# Known OpenAI parameters this service does not implement: a 400 that says so. (Chat takes tools; completions
# know them only as unsupported.)
UNSUPPORTED_PARAMETERS = (
    "tools", "tool_choice", "functions", "function_call", "parallel_tool_calls", "audio", "modalities", "prediction",
    "reasoning_effort",  # chat's is a field (app/openai/chat.py): this is completions'
    "verbosity", "web_search_options", "best_of", "suffix",
    # vLLM's for what is not run here: disaggregated prefill, custom logits processors, repeat detection, ...
    "kv_transfer_params", "ec_transfer_params", "vllm_xargs", "repetition_detection", "chat_template", "documents",
    "thinking_token_budget", "return_token_offsets", "return_prompt_text", "stream_interval", "mm_processor_kwargs",
    "media_io_kwargs", "mm_payload", "return_mm_kwargs", "watermarking", "routed_experts_prompt_start",
)


def refuse_unserved(extra: dict[str, Any]) -> None:
    """Raises the 400 for the first of a request's unknown fields (`extra`) that is neither ignored nor a no-op."""
    for name, value in extra.items():
        if name in IGNORED_PARAMETERS:
            continue
        if name in UNSUPPORTED_PARAMETERS:
            if (
                value in (None, [], {}, False)
                or (name == "tool_choice" and value == "none")
                or (name == "best_of" and value == 1)
                or (name == "modalities" and value == ["text"])  # the one modality there is
            ):
                continue
            raise UnsupportedParameter(
                f"'{name}' is not supported by this service; remove it from the request (see docs/api.md)",
                param=name,
            )
        raise InvalidRequest(f"Unrecognized request argument supplied: {name}", param=name)
