"""The open-loop goodput benchmark (`python -m loadkit goodput`): this project, bare vLLM and Ray Serve LLM under
1x-8x their capacity.

Requests arrive at a fixed rate whatever the answers (open loop, as real traffic does), sent by the real `openai`
SDK with its default retry policy; a request counts as goodput when it completes within both latency targets.
Modules: loops (the capacity loop, the open-loop windows and their schedule), launch (one system in one round),
figures (per system and rate, pooled; results.json), report (the Markdown and the plot), run (the whole run and
its command line).
"""
