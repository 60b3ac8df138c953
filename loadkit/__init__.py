"""loadkit: the load-testing kit that `scripts/bench.py`, `scripts/overload.py`, `scripts/goodput.py` and
`scripts/refusal_probe.py` are command lines over. It drives any OpenAI-compatible deployment by URL and
imports nothing from `app/`.

Shared parts, one noun each:
  service     a server (this project, or a peer) as a process group: start, stop, nothing left behind
  proctree    a process tree's memory and CPU (psutil), by role
  machine     machine and version facts (CPU model and flags, cores, packages)
  stats       percentiles and pooling of load-generator results
  sse         a streaming chat completion over httpx, as server-sent events
  markdown    a generated section of a Markdown file, keeping what people wrote around it
  probe       the refusal probe: a light client in its own process
The drivers: `loadkit.bench` (peers side by side), `loadkit.overload` (queueing and refusals),
`loadkit.goodput` (goodput under open-loop overload, peers side by side), `loadkit.burst` (issue 15's opening
burst against a running service) and `loadkit.prefill_share` (a long prompt beside running streams, per
`max_num_batched_tokens`); `loadkit.hostile`, `loadkit.chaos` and `loadkit.differential` have their own docs.
"""
