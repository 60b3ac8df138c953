"""Where an engine runs on a CPU: what the CPU can do (`facts`), the precision `dtype: auto` picks, which cores
each engine computes on (`core_plan`), the claims that keep engines of one machine off each other's cores, and
the affinity that keeps the front end off them."""
