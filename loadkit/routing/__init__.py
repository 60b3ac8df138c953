"""The routing benchmark (issue 24): the fleet router against power-of-two choices on a local multi-node cluster,
four workloads (workloads.py), sent by drive.py, counted by figures.py, reported by report.py; `run.py` is
`python -m loadkit routing`."""
