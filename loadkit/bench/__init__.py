"""The bench (`python -m loadkit bench`): this project against its peers, side by side in one run, at one or more
precisions, each system driven by vLLM's own load generator and stopped leaving nothing behind, in rounds.

Modules: load (the load generator, the sweep, warm-ups and rounds), launch (one launch of one variant), results
(launches, steps, pooled rows; results.json), cluster (the `app-cluster` system's facts and section), report (the
Markdown and the plots), run (the whole run and its command line). What is compared and how each system starts is
loadkit.peers'.
"""
