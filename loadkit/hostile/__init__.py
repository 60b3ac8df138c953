"""The hostile-client driver (`python -m loadkit hostile`): hostile clients must not take the service from everyone
else.

Bounded in count and time, loopback only: its own service on a config derived from configs/cpu.yaml (a fresh key,
shorter connection clocks), or a running one by URL. While a polite client in its own process sends one short chat
a second, one client process opens at once streams it never reads, idle and slowloris connections, huge header
blocks, giant prompts and a /tokenize flood; it records when the polite client was served again, which hostile
sockets the server ended and when, the replica's event-loop lag, memory and descriptors, and whether the service
is idle and answers normally afterwards.

Modules: plan (the scenario's numbers and the service's clocks), sockets (the hostile sockets), attack (the attack
phase and its hostile requests), server_view (the server's side), polite (the polite client's process), result
(what a run found and its figures), report (targets and the Markdown section), run (the whole run and its
command line).
"""
