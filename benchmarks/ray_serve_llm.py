"""Peer for `python -m loadkit bench`: Ray Serve LLM (`ray.serve.llm.build_openai_app`) on the CPU.

Not part of the service in app/. It starts a private, loopback-only Ray, deploys Ray's own
OpenAI-compatible LLM app for one model folder with the same engine settings the other
systems get, serves until SIGINT/SIGTERM, then shuts Serve and Ray down and kills whatever
it started that is still alive (vLLM's EngineCore was seen outliving `ray stop`).

Needs pyarrow, jsonref, pandas and hf_transfer next to ray[serve] (the project's `bench` extra;
never the ray[llm] extra: it pins a CUDA build of vLLM that would replace the CPU one). Without
them it exits at once with the import error, which `python -m loadkit bench` puts at the top of its report.
On a 2-core CPU machine two settings make it schedulable (see /work/shared/NOTES.md): the engine replica's
placement group is `{bundles: [{CPU: 1}]}` (otherwise it asks for a GPU), and the ingress
replica reserves no CPU.

    python benchmarks/ray_serve_llm.py --model FOLDER --served-model-name NAME --port P \
        [--max-model-len 2048 --max-num-seqs 64 --dtype bfloat16 --stream-batching-ms MS]
    (KV cache: env VLLM_CPU_KVCACHE_SPACE)
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the kit, also before `pip install -e .` knows it

from loadkit.service import kill_descendants  # noqa: E402  (the same reaping for every peer the kit starts)


def _say(message: str) -> None:
    print(f"[ray-serve-llm] {message}", file=sys.stderr, flush=True)


def build_app(model_dir: str, model_id: str, max_model_len: int, max_num_seqs: int, dtype: str,
              stream_batching_ms: float | None = None):
    from ray.serve.llm import LLMConfig, build_openai_app

    # Ray Serve LLM batches a stream's chunks (50 ms by default); None keeps its default.
    experimental = {} if stream_batching_ms is None else {"stream_batching_interval_ms": stream_batching_ms}
    llm_config = LLMConfig(
        experimental_configs=experimental,
        model_loading_config={"model_id": model_id, "model_source": model_dir},
        engine_kwargs={"enforce_eager": True, "max_model_len": max_model_len, "max_num_seqs": max_num_seqs,
                       "dtype": dtype},
        placement_group_config={"bundles": [{"CPU": 1}]},  # without it the engine replica asks for a GPU
        deployment_config={"num_replicas": 1},
    )
    return build_openai_app({
        "llm_configs": [llm_config],
        # The ingress needs no CPU of its own; on 2 cores it could not be scheduled otherwise.
        "ingress_deployment_config": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}},
    })


def main() -> int:
    parser = argparse.ArgumentParser(description="Ray Serve LLM peer for `python -m loadkit bench` (not part of app/)")
    parser.add_argument("--model", required=True, help="Hugging Face model folder")
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16", help="vLLM's dtype (auto: vLLM decides)")
    parser.add_argument("--stream-batching-ms", type=float, default=None,
                        help="experimental_configs.stream_batching_interval_ms (default: Ray Serve LLM's own, 50 ms)")
    args = parser.parse_args()
    # Before anything starts: a missing dependency ends the peer here, at once, with its import error.
    import ray.serve.llm  # noqa: F401

    stop = threading.Event()

    def on_signal(signum, _frame):
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)

    import ray
    from ray import serve

    started = time.monotonic()
    try:
        ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False,
                 num_cpus=os.cpu_count(), logging_level=logging.WARNING)
        for sig in (signal.SIGINT, signal.SIGTERM):  # ray.init may have installed its own
            signal.signal(sig, on_signal)
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(build_app(args.model, args.served_model_name, args.max_model_len, args.max_num_seqs, args.dtype,
                            args.stream_batching_ms),
                  name="ray-serve-llm", route_prefix="/", blocking=False)
        url = f"http://{args.host}:{args.port}/v1/models"
        while not stop.is_set():
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    if resp.status == 200:
                        _say(f"serving {args.served_model_name} at http://{args.host}:{args.port}/v1 "
                             f"(ready in {time.monotonic() - started:.0f} s)")
                        break
            except Exception:
                pass
            stop.wait(1.0)
        stop.wait()
        _say("stopping")
        serve.shutdown()
        return 0
    finally:
        try:
            ray.shutdown()
        finally:
            n = kill_descendants()
            _say(f"stopped; {n} leftover process(es) reaped" if n else "stopped; no process left behind")


if __name__ == "__main__":
    sys.exit(main())
