"""The real engine, in this process (no Ray): does a continued choice sample what it would have? For each of
greedy, and seeded sampled with and without its generator resumed (app/engine/vllm/generator_resume.py), an
answer of 48 tokens, then the same request continued from its first k tokens (the prompt's ids plus those k as
the prompt, 48 - k tokens, the same seed), for several k; prints how many continuations equal the rest of the
answer token for token, and one JSON line at the end.

    flock /tmp/realstack.lock .venv/bin/python scripts/engine_resume_probe.py [--config configs/cpu.yaml]

One vLLM engine start (about 25 s here); it leaves no process behind.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.config.app_config import load_config  # noqa: E402
from app.engine.interface import GenerationParams  # noqa: E402
from app.engine.vllm.engine import VLLMEngine  # noqa: E402

CUTS = (1, 8, 17, 30, 47)
TOKENS = 48


async def _ids(engine: VLLMEngine, name: str, prompt: list[int], params: GenerationParams) -> list[int]:
    out: list[int] = []
    async for delta in engine.generate(name, prompt, replace(params, return_token_ids=True)):
        for c in delta.choices:
            out.extend(c.token_ids or ())
    return out


async def probe(engine: VLLMEngine) -> dict[str, str]:
    prompt = engine.render_chat([{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}])
    kinds = {"greedy": (GenerationParams(max_tokens=TOKENS, temperature=0, ignore_eos=True), False),
             "seeded, generator resumed": (GenerationParams(max_tokens=TOKENS, temperature=0.8, seed=7,
                                                            ignore_eos=True), True),
             "seeded, generator restarted": (GenerationParams(max_tokens=TOKENS, temperature=0.8, seed=7,
                                                              ignore_eos=True), False)}
    results = {}
    for kind, (params, resume) in kinds.items():
        whole = await _ids(engine, f"{kind}-whole", prompt, params)
        same, diverged = 0, []
        for k in CUTS:
            rest = replace(params, max_tokens=TOKENS - k, generator_draws=k if resume else 0)
            continued = await _ids(engine, f"{kind}-{k}", [*prompt, *whole[:k]], rest)
            same += continued == whole[k:]
            apart = next((i for i, (a, b) in enumerate(zip(continued, whole[k:], strict=False)) if a != b), None)
            diverged.append("same" if apart is None else f"token {k + apart}")
        results[kind] = f"{same} of {len(CUTS)}"
        print(f"{kind}: continuations equal to the undisturbed answer: {same} of {len(CUTS)}; cut at "
              f"{', '.join(f'{k}: {d}' for k, d in zip(CUTS, diverged, strict=True))}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/cpu.yaml")
    args = parser.parse_args()
    engine = VLLMEngine(load_config(args.config).models[0])
    engine.start()
    try:
        print(json.dumps(asyncio.run(probe(engine))))
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
