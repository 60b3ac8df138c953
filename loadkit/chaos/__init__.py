"""The chaos driver (`python -m loadkit chaos`): steady load on a local multi-node cluster while each fault of issue
13 is injected in turn (engine SIGKILL, engine SIGSTOP, replica SIGKILL, node loss, rolling update), with what each
cost the clients.

Modules: faults (how each is injected, and when the deployment is whole again), round (one fault under load, what
it measured, and the table), run (the cluster, the deployment, the rounds and the command line).
"""
