"""Autoscaling: how many engine replicas a model's demand needs (policy.py). No Ray: Serve's custom autoscaling policy
(rayserve/autoscaling.py) feeds it the replicas' figures."""
