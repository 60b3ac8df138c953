"""ScalingView: one engine deployment's last autoscaling decision (scaling/decision.py), as the policy published it in
Ray's internal key-value store, read at the ingress: for /stats and /metrics (`current`, which reads it again when
it is older than REFRESH_S), and for requests refused by time while a new replica starts (`refusal`, which never
waits: it uses what was last read and asks for a fresh read in the background). Only an autoscaled deployment's
ingress has one (rayserve/handle_backend.py), and it reads nothing until something asks."""

from __future__ import annotations

import asyncio
import logging
import math
import time

from ray.experimental import internal_kv
from ray.serve.handle import DeploymentHandle

from app.errors import OverTimeTarget
from app.scaling.decision import KV_NAMESPACE, ScalingDecision, kv_key

log = logging.getLogger(__name__)
REFRESH_S = 2.0


class ScalingView:
    def __init__(self, handle: DeploymentHandle):
        self._handle = handle
        self._latest: ScalingDecision | None = None
        self._read_at = -math.inf
        self._reading: asyncio.Future[None] | None = None

    def _read(self) -> None:
        """In a thread: a call to Ray's GCS."""
        deployment = getattr(self._handle, "deployment_id", None)
        try:
            if deployment is not None and internal_kv._internal_kv_initialized():
                raw = internal_kv._internal_kv_get(kv_key(deployment.app_name, deployment.name),
                                                   namespace=KV_NAMESPACE)
                self._latest = ScalingDecision.from_json(raw) if raw else None
        except Exception as err:  # the last decision read stays; /stats shows its time
            log.debug("could not read the scaling decision: %s", err)
        finally:
            self._read_at = time.monotonic()

    def _refresh(self) -> asyncio.Future[None]:
        if self._reading is None or self._reading.done():
            self._reading = asyncio.get_running_loop().run_in_executor(None, self._read)
        return self._reading

    async def current(self) -> ScalingDecision | None:
        if time.monotonic() - self._read_at >= REFRESH_S:
            await asyncio.wait_for(asyncio.shield(self._refresh()), timeout=5.0)
        return self._latest

    def refusal(self, refused: OverTimeTarget) -> OverTimeTarget:
        """`refused` (the ingress's or a replica's), with a Retry-After of when the replica being started is expected
        to serve, while one starts."""
        if time.monotonic() - self._read_at >= REFRESH_S:
            self._refresh()
        now = time.time()
        ready = self._latest.ready_in_s(now) if self._latest is not None else None
        if self._latest is None or ready is None:
            return refused
        retry = self._latest.retry_after_s(refused.retry_after_s or 1.0, now)
        told = OverTimeTarget(f"{refused.message}. A new replica is starting and expected to serve in about "
                              f"{math.ceil(ready)} s", retry_after_s=retry)
        told.prompt_tokens = refused.prompt_tokens
        return told
