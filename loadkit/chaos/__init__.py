"""The chaos driver: steady load on the local multi-node cluster while each fault of issue 13 is injected in turn
(engine SIGKILL, engine SIGSTOP, replica SIGKILL, node loss, rolling update), with what each cost the clients.

`faults.py` owns the faults (how each is injected, and when the deployment is whole again), `round.py` one fault
under load and what it measured, `report.py` the table, `run.py` the command line: the cluster, the deployment
and the rounds, bounded in count and time, loopback only.
"""
