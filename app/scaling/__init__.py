"""Autoscaling: how many engine replicas a model's demand needs (policy.py, no Ray), and the Ray Serve custom policy
that feeds it the replicas' figures and the `autoscaling_config` naming it (serve_policy.py)."""
