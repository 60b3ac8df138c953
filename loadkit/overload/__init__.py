"""The overload driver: overload must become queueing and fast, honest refusals.

Bounded in time and request count, loopback only. By default it starts its own service (`python -m app serve`,
as a process: nothing of app/ is imported) from a config derived from configs/cpu.yaml with a free port and a
small, explicit capacity, and stops it at the end (Ctrl-C to its process group), leaving no process behind.
With a base URL it drives a running service instead.

Phases (httpx async clients):
  a. idle      resident memory of the service's process tree at idle (after one warm-up request);
  b. capacity  exactly max_ongoing_requests clients in a closed loop for the phase's duration;
  c. overload  overload-factor times as many clients, same request mix, same duration; refused
               clients back off min(Retry-After, 1 s) and retry;
  d. after     wait until /stats shows nothing running or queued, then one normal request.

Modules: mix (the seeded request mix and prompts), client (one request and a client's loop), stats_poll (what
/stats, /livez and the process tree show during a phase), phases (a phase's run and its figures), capacity (the
service under test: own or by URL), access_log (where a refusal's time goes), result (what a run found), timing
(admission by time: refusals by reason, first tokens against the target, the pace), targets (PASS/FAIL), render
(the Markdown section), run (the whole run, start to report).
"""
