"""The bench driver: this project against its peers, side by side in one run, at one or more precisions.

Starts each system (a variant: a system at a precision) in turn on the default model with identical engine
settings, drives it with the same load (vLLM's own load generator, `vllm bench serve`, against the streaming
chat endpoint), stops it (leaving no process behind) and moves on, in rounds; then writes a Markdown report and
two plots.

Modules: systems (what is compared and how each is started), load (the load generator, the sweep, warm-ups and
rounds), launch (one launch of one variant), results (launches, steps, pooled rows; results.json), meta (when,
where, asked how), tables and report (the Markdown), plots, run (the whole run).
"""
