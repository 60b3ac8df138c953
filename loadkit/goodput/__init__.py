"""The open-loop goodput benchmark: this project, bare vLLM and Ray Serve LLM under 1x-8x their capacity.

Requests arrive at a fixed rate whatever the answers (open loop, as real traffic does), sent by the real `openai`
SDK with its default retry policy; a request counts as goodput when it completes within both latency targets.

Modules, one noun each: workload (the seeded request mix), schedule (the arrival times), client (one request's
outcome, attempts counted in the transport), capacity (the closed-loop rate each system can serve), step (one
rate's open-loop window), figures (per system and rate), launch (one system in one round), run (the whole run,
interleaved rounds), report (the Markdown) and plot (goodput against offered load).
"""
