"""The hostile-client driver (`python -m loadkit hostile`): hostile clients must not take the service from everyone
else. While a polite client in its own process sends one short chat a second, one client process opens at once
streams it never reads, idle and slowloris connections, huge header blocks, giant prompts and a /tokenize flood;
the run records what the server did with each and how the polite client and the service fared (docs/hostile.md).

Modules: plan (the scenario's numbers and the service's clocks), sockets (the hostile sockets), attack (the attack
phase and its hostile requests), server_view (the server's side), polite (the polite client's process), result
(what a run found and its figures), report (targets and the Markdown section), run (the whole run and its
command line).
"""
