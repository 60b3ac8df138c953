"""The overload driver (`python -m loadkit overload`): overload must become queueing and fast, honest refusals.

Bounded in time and request count, loopback only: its own service on a config derived from configs/cpu.yaml with a
small, explicit capacity (stopped leaving nothing behind), or a running one by URL. Phases (httpx async clients):
  a. idle      resident memory of the service's process tree at idle (after one warm-up request);
  b. capacity  exactly max_ongoing_requests clients in a closed loop for the phase's duration;
  c. overload  overload-factor times as many clients, same request mix, same duration; refused
               clients back off min(Retry-After, 1 s) and retry;
  d. after     wait until /stats shows nothing running or queued, then one normal request.

Modules: mix (the seeded request mix), client (one request and a client's loop), stats_poll (what the service
shows during a phase), phases (a phase's run and figures), timing (admission by time), result (what a run set
and found), report (targets and the Markdown section), run (the whole run and its command line).
"""
