"""scalesim: the service's autoscaling policy (app/scaling/) run against simulated fleets, beside Serve's default
policy and a queue-depth rule, on traces of load (docs/autoscaling.md, `make autoscaling`).

It imports the product (the policy Serve is handed, the replicas' demand meter) and Ray Serve's own decision steps
(its scaling factors and delays), so what it compares is what runs; only the engines are simulated, with the fake
engine's cost model (app/engine/fake.py)."""
