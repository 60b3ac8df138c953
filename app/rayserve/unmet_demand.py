"""UnmetDemand: the ingress's refusals by time, reported to the engine deployment for its autoscaling policy.

The ingress refuses at once a request every replica predicts late (app/routing/fleet_router.py); no replica sees it,
and Serve 2.60 gives a deployment's policy that deployment's own figures only. So the ingress adds up each refused
request's most output (`max_tokens` x n) and, at most once a second, hands the sum to one engine replica, which
counts it as refused demand (host/replica_load.refused_at_ingress); the policy sums the replicas' figures. Without
it, the policy saw only the replicas' `wait_s` past the target and asked for one more replica at a time.

The replicas' own refusals by time are counted here too (`unmet_refusal`), once the ingress has given up on the
request: each replica counted those it refused, so a request refused by one and then served or refused by another
was counted twice. The ingress marks its requests `demand_at_sender`, and the replicas leave them to it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ray.serve.handle import DeploymentHandle

from app.engine.interface import GenerateRequest
from app.errors import NeverInTime, OverTimeTarget
from app.rayserve.call_ids import remote
from app.rayserve.scaling_view import ScalingView

log = logging.getLogger(__name__)
REPORT_EVERY_S = 1.0


class UnmetDemand:
    def __init__(self, handle: DeploymentHandle):
        self._handle = handle
        self._steps = 0
        self._task: asyncio.Task[Any] | None = None

    def refused(self, request: GenerateRequest) -> None:
        self._steps += request.params.max_tokens * max(1, request.params.n)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._report())

    async def _report(self) -> None:
        while self._steps:
            await asyncio.sleep(REPORT_EVERY_S)
            steps, self._steps = self._steps, 0
            try:
                await asyncio.wait_for(remote(self._handle.refused_at_ingress, steps), REPORT_EVERY_S * 5)
            except Exception as err:  # the figure is lost, nothing else: the next refusals report again
                log.debug("could not report %d refused decode steps to the engine deployment: %s", steps, err)


def unmet_refusal(error: BaseException, request: GenerateRequest, unmet: UnmetDemand | None,
                  scaling: ScalingView | None) -> BaseException:
    """`error` as the client gets it. A refusal by time of an autoscaled model's request (not one that even an idle
    replica could not meet) is counted as unmet demand, once, and says when a replica being started will serve."""
    if unmet is None or scaling is None or not isinstance(error, OverTimeTarget) or isinstance(error, NeverInTime):
        return error
    unmet.refused(request)
    return scaling.refusal(error)
