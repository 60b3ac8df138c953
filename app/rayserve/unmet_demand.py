"""UnmetDemand: the ingress's refusals by time, reported to the engine deployment for its autoscaling policy.

The ingress refuses at once a request every replica predicts late (app/routing/fleet_router.py); no replica sees it,
and Serve 2.60 gives a deployment's policy that deployment's own figures only. So the ingress adds up each refused
request's most output (`max_tokens` x n) and, at most once a second, hands the sum to one engine replica, which
counts it as refused demand (host/replica_load.refused_at_ingress); the policy sums the replicas' figures. Without
it, the policy saw only the replicas' `wait_s` past the target and asked for one more replica at a time.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ray.serve.handle import DeploymentHandle

from app.engine.interface import GenerateRequest
from app.rayserve.call_ids import remote

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
