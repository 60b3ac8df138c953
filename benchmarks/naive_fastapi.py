"""BASELINE ONLY -- not part of the service in app/.

The "naive" peer for `python -m loadkit bench`: what one might write in an afternoon without an
inference engine. A plain FastAPI app (run by uvicorn) that loads the model with
transformers' AutoModelForCausalLM and calls `model.generate` once per request, at most
two at a time (asyncio.Semaphore(2)); no batching across requests, no paged KV cache,
no admission control beyond the semaphore. It speaks just enough of the OpenAI chat API
for vLLM's load generator (`vllm bench serve --backend openai-chat`):

  POST /v1/chat/completions  stream=true (SSE chunks, one per generated token, usage
                             chunk when stream_options.include_usage, then [DONE]) or
                             stream=false; honours max_tokens / max_completion_tokens,
                             temperature (0 or absent = greedy) and ignore_eos
                             (min_new_tokens = max_tokens)
  GET  /v1/models, GET /health

    python benchmarks/naive_fastapi.py --model FOLDER --served-model-name NAME --port P
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import uuid
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from transformers import AutoModelForCausalLM, AutoTokenizer, StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

CONCURRENT_GENERATIONS = 2


class _TokenQueueStreamer(BaseStreamer):
    """Hands each new token id from the generate() thread to the event loop; the first put() is the prompt."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue):
        self.loop, self.queue, self.prompt_seen = loop, queue, False

    def put(self, value):
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        for tok in value.reshape(-1).tolist():
            self.loop.call_soon_threadsafe(self.queue.put_nowait, tok)

    def end(self):
        self.loop.call_soon_threadsafe(self.queue.put_nowait, None)


class _StopWhenCancelled(StoppingCriteria):
    def __init__(self, cancelled: threading.Event):
        self.cancelled = cancelled

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), self.cancelled.is_set(), dtype=torch.bool)


def build_app(model_dir: str, served_name: str, dtype: str = "bfloat16", threads: int | None = None) -> FastAPI:
    if threads:
        torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # "auto": the folder's own dtype (its config's torch_dtype), as vLLM's `--dtype auto` starts from.
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype if dtype == "auto" else getattr(torch, dtype))
    model.eval()
    app = FastAPI(title="naive baseline (not part of app/)")
    gate = asyncio.Semaphore(CONCURRENT_GENERATIONS)

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status_code=status)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served_name, "object": "model", "created": 0, "owned_by": "naive"}]}

    async def generate_tokens(input_ids: torch.Tensor, max_new: int, ignore_eos: bool, temperature: float):
        """Yields generated token ids; runs model.generate in a thread, at most CONCURRENT_GENERATIONS at once."""
        queue: asyncio.Queue = asyncio.Queue()
        cancelled = threading.Event()
        kwargs: dict[str, Any] = dict(
            input_ids=input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new,
            streamer=_TokenQueueStreamer(asyncio.get_running_loop(), queue),
            stopping_criteria=StoppingCriteriaList([_StopWhenCancelled(cancelled)]),
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        )
        if ignore_eos:
            kwargs["min_new_tokens"] = max_new
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)

        def run():
            try:
                with torch.inference_mode():
                    model.generate(**kwargs)
            except Exception as err:  # surface it to the request instead of hanging
                asyncio.run_coroutine_threadsafe(queue.put(err), kwargs["streamer"].loop)

        async with gate:
            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            try:
                while True:
                    item = await queue.get()
                    if item is None:
                        break
                    if isinstance(item, Exception):
                        raise item
                    yield item
            finally:
                cancelled.set()  # client gone or done: let generate() stop at its next step
                await asyncio.to_thread(thread.join)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        try:
            body = await request.json()
            messages = body["messages"]
        except Exception:
            return error(400, "body must be JSON with 'messages'")
        if body.get("model") not in (None, served_name):
            return error(404, f"model {body.get('model')!r} does not exist")
        max_new = body.get("max_completion_tokens") or body.get("max_tokens") or 256
        ignore_eos = bool(body.get("ignore_eos", False))
        temperature = float(body.get("temperature") or 0.0)
        stream = bool(body.get("stream", False))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage", False))
        # The chat template wants plain strings; flatten OpenAI content parts ([{"type": "text", "text": ...}]).
        messages = [{**m, "content": "".join(p.get("text", "") for p in m["content"])
                     if isinstance(m.get("content"), list) else m.get("content")}
                    for m in messages]
        input_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                  return_dict=True)["input_ids"]
        prompt_tokens = int(input_ids.shape[-1])
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        def chunk(delta: dict, finish: str | None = None, usage: dict | None = None) -> str:
            obj = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": served_name,
                   "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}]}
            if usage:
                obj["usage"] = usage
            return f"data: {json.dumps(obj)}\n\n"

        def finish_reason(n: int) -> str:
            return "length" if n >= max_new else "stop"

        if not stream:
            ids = [t async for t in generate_tokens(input_ids, max_new, ignore_eos, temperature)]
            text = tokenizer.decode(ids, skip_special_tokens=True)
            return {"id": rid, "object": "chat.completion", "created": created, "model": served_name,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                 "finish_reason": finish_reason(len(ids))}],
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(ids),
                              "total_tokens": prompt_tokens + len(ids)}}

        async def sse():
            ids: list[int] = []
            sent = ""
            async for tok in generate_tokens(input_ids, max_new, ignore_eos, temperature):
                ids.append(tok)
                text = tokenizer.decode(ids, skip_special_tokens=True)
                delta = "" if text.endswith("\ufffd") else text[len(sent):]  # hold an incomplete UTF-8 sequence
                sent += delta
                yield chunk({"role": "assistant", "content": delta} if len(ids) == 1 else {"content": delta})
            yield chunk({}, finish_reason(len(ids)))
            if include_usage:
                yield chunk({}, usage={"prompt_tokens": prompt_tokens, "completion_tokens": len(ids),
                                       "total_tokens": prompt_tokens + len(ids)})
            yield "data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="Hugging Face model folder")
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dtype", default="bfloat16", choices=["auto", "bfloat16", "float16", "float32"])
    parser.add_argument("--threads", type=int, default=None,
                        help="torch compute threads (default: torch's own default)")
    args = parser.parse_args()
    app = build_app(args.model, args.served_model_name, args.dtype, args.threads)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
