"""The command line (`python -m app`): serve, check a config, prepare the model, a local multi-node cluster, and
the reaper that leaves no process behind."""
