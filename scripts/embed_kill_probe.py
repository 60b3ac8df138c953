"""A running embedding model's engine killed under an embeddings request: is it answered, and as when undisturbed?
Against a service on this machine with one engine for the model (a replica that serves HTTP itself, or the ingress
tier with one engine replica: `service.colocate_ingress: false`), it times a batch of long inputs, sends another of
the same size (other texts: the engine's prefix cache would answer the same texts at once), SIGKILLs the
`VLLM::EngineCore` a third of the way into it, and prints the status, when it was answered, and how far its vectors
are from those of the same batch sent again undisturbed.

    .venv/bin/python scripts/embed_kill_probe.py --model smollm2-embed [--base-url http://127.0.0.1:8000]
        [--api-key KEY] [--inputs 24] [--words 1350]

It kills only the EngineCore of the `python -m app serve` whose processes listen on the URL's port (with several
models, the first it finds: serve the embedding model alone).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import time
from urllib.parse import urlparse

import httpx
from engine_kill_probe import engine_core  # this folder is the script's first import path

WORDS = "the quick brown fox jumps over the lazy dog ".split()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--model", required=True, help="an embedding model (runner: embed) the service serves")
    ap.add_argument("--inputs", type=int, default=24)
    ap.add_argument("--words", type=int, default=1350, help="words per input (about a token each)")
    args = ap.parse_args()

    def embed(batch: str) -> tuple[int, float, dict]:
        texts = [f"{batch} {i} " + " ".join(WORDS[j % len(WORDS)] for j in range(args.words))
                 for i in range(args.inputs)]
        started = time.monotonic()
        r = httpx.post(f"{args.base_url}/v1/embeddings", json={"model": args.model, "input": texts}, timeout=600,
                       headers={"Authorization": f"Bearer {args.api_key}"})
        return r.status_code, time.monotonic() - started, r.json()

    status, took, _ = embed("timing")
    print(f"a batch undisturbed: {status} in {took:.1f} s")
    core = engine_core(urlparse(args.base_url).port or 80)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        answer = pool.submit(embed, "killed")
        time.sleep(took / 3)
        killed = time.monotonic()
        core.kill()
        status, _, body_back = answer.result()
    print(f"EngineCore {core.pid} SIGKILLed; the request answered {status} {time.monotonic() - killed:.1f} s after")
    if status != 200:
        print(body_back)
        return
    _, _, undisturbed = embed("killed")
    diff = max(abs(a - b) for x, y in zip(undisturbed["data"], body_back["data"], strict=True)
               for a, b in zip(x["embedding"], y["embedding"], strict=True))
    print(f"largest difference from the undisturbed vectors: {diff:.2g}")


if __name__ == "__main__":
    main()
