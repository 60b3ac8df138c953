"""`deployment.autoscaling`: replicas that follow the demand (docs/autoscaling.md). Ray Serve scales the engine
deployment with the service's own policy (scaling/serve_policy.py): demand in output tokens per second, served and
refused by time, against what one replica serves within the first-token target. `policy: ongoing_requests` hands
the deployment to Serve's default policy instead (a count of requests in flight per replica), for operators who
want it and for measuring the two side by side on the same service."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from app.config.common import StrictModel


class AutoscalingSettings(StrictModel):
    policy: Literal["token_demand", "ongoing_requests"] = Field(
        "token_demand",
        description="`token_demand`: the service's policy (demand in output tokens/s, served and refused by time, "
        "against one replica's measured capacity). `ongoing_requests`: Ray Serve's default policy, "
        "`target_ongoing_requests` in flight per replica (it does not see requests refused by time; /stats and "
        "/metrics then show no scaling decision, and a refusal while a replica starts does not say when it will "
        "serve).",
    )
    target_ongoing_requests: float | None = Field(
        None, gt=0, description="With `policy: ongoing_requests` only: requests in flight per replica that Serve "
        "aims at (null: Serve's default, 2).")
    min_replicas: int = Field(1, ge=1, description="Fewest engine replicas; the deployment starts with this many.")
    max_replicas: int = Field(2, ge=1, description="Most engine replicas (on KubeRay, also the worker group's bound).")
    target_utilization: float = Field(
        0.8, gt=0, le=1,
        description="Share of one replica's measured output tokens/s the policy plans for: below 1 leaves room for "
        "a burst while a new replica loads (about 25-40 s on a CPU).",
    )
    upscale_delay_s: float = Field(
        10.0, ge=0, description="How long the demand must ask for more replicas before one is added.")
    downscale_delay_s: float = Field(
        120.0, ge=0, description="How long the demand must fit in fewer replicas before one is removed (slow, so "
        "that a pause in the load does not cost a replica's start).")
    look_back_s: float = Field(
        30.0, gt=10, description="The window over which Serve averages each replica's figures for a decision (more "
        "than 10 s: several of a replica's reports, one every 2 s).")

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSettings:
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas ({self.max_replicas}) must be at least min_replicas ({self.min_replicas})")
        if self.policy == "token_demand" and self.target_ongoing_requests is not None:
            raise ValueError("target_ongoing_requests applies to policy: ongoing_requests only; the token_demand "
                             "policy plans with target_utilization")
        if self.policy == "ongoing_requests" and "target_utilization" in self.model_fields_set:
            raise ValueError("target_utilization applies to policy: token_demand only; Serve's ongoing_requests "
                             "policy aims at target_ongoing_requests")
        return self
