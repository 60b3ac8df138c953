"""The hostile-client driver: hostile clients must not take the service from everyone else.

Bounded in count and time, loopback only. By default it starts its own service (`python -m app serve`, as a
process: nothing of app/ is imported) from a config generated from configs/cpu.yaml (a free port, a fresh API
key, shorter connection clocks) and stops it at the end; with a URL it drives a running service.

While a polite client (its own process) sends one short chat a second, one client process on loopback opens
at once: streams it never reads (small SO_RCVBUF, large max_tokens, ignore_eos), idle connections, slowloris
connections (one header byte every 5 s), header blocks of megabytes, giant prompts and a /tokenize flood.
It records when the polite client was served again, which hostile sockets the server ended and when, the
replica's event-loop lag (/metrics histogram deltas), its memory and descriptors over time, and whether the
service is idle and answers normally afterwards.

Modules: plan (the scenario's numbers and the service's clocks), wire (the bytes the hostile sockets send),
sockets (one hostile socket's record and how its end is seen), attackers (one coroutine per kind, the fleet),
floods (giant prompts, /tokenize), polite (the polite client's process and its figures), lag (the lag
histogram), server_view (listener and replica: connections, RSS, descriptors), deployment (the service under
attack: own or by URL), checks (/stats, idle, the normal chat, /metrics), attack (the attack phase), result
(what a run found, as JSON), figures (what it is judged by), targets (PASS/FAIL), render (the Markdown
section), run (the whole run, start to report).
"""
