"""loadkit: the project's load-testing kit, a library with one command line (`python -m loadkit <experiment>`).
It drives any OpenAI-compatible deployment by URL and imports nothing from `app/`.

The shared nouns, each in one place:
  service       the service under test: process groups stopped leaving nothing, a `Server` on a free port, this
                project's service on a config derived from a base config, or one already running, by URL
  peers         the systems compared (this project's topologies, bare vLLM, Ray Serve LLM, the naive baseline)
  workload      what a request asks (`Ask`), the seeded chat mix, prompts of a given length
  record        one request as its client saw it (`Record`, its `Attempt`s)
  sdk, sse      the clients: the openai SDK (its own retries, every attempt counted) and raw SSE over httpx
  server_stats  what a running service says about itself (/stats, idle, a normal chat)
  stats         percentiles and pooling; report: run facts, PASS/FAIL targets, progress lines; markdown: the
                generated section of a doc
  proctree, machine, precision, waiting, cluster, steady_load, long_stream
The experiments, thin modules over them: bench, goodput, overload, burst, hostile, chaos, differential,
prefill_share and probe (`python -m loadkit --help`).
"""
