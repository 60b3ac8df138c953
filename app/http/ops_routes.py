"""The operations routes: /livez, /health (readiness), /stats, /stats/tenants and /metrics.

Probes and scrapes need no API key (`http.gate.OPEN_PATHS`) and never fail because one model's replica
is busy or dead: each backend is asked with a timeout, and a failure counts as "not ready". /stats and
/metrics report every replica of each model (a replica that did not answer as such), and /stats the
model's single figure beside them (`host.stats.combined`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from app.host.stats import ReplicaStats, combined
from app.http.ingress_state import Backend, state_of
from app.http.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from app.http.scaling_metrics import ScalingCollector
from app.routing.figures import FleetFigures
from app.scaling.decision import ScalingDecision

router = APIRouter()
_PROBE_TIMEOUT_S = 5


@router.get("/livez")
async def livez() -> dict[str, str]:
    return {"status": "alive"}


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    backends = state_of(request).backends
    results = await asyncio.gather(*(_ready(b) for b in backends.values()))
    per_model = dict(zip(backends.keys(), results, strict=True))
    ok = all(per_model.values())
    return JSONResponse({"status": "ok" if ok else "unavailable", "models": per_model}, status_code=200 if ok else 503)


async def _every_replica(backends: Mapping[str, Backend]) -> dict[str, dict[str, ReplicaStats | None]]:
    async def of(backend: Backend) -> dict[str, ReplicaStats | None]:
        try:
            return await asyncio.wait_for(backend.replica_stats(), timeout=2 * _PROBE_TIMEOUT_S)
        except Exception:  # a model none of whose replicas answers must not break the rest
            return {}

    answers = await asyncio.gather(*(of(b) for b in backends.values()))
    return dict(zip(backends.keys(), answers, strict=True))


async def _scaling(backends: Mapping[str, Backend]) -> dict[str, ScalingDecision]:
    """Each autoscaled model's last scaling decision (rayserve/scaling_view.py; app/scaling/decision.py)."""
    out = {}
    for model_id, backend in backends.items():
        view = getattr(backend, "scaling", None)
        try:
            decision = await view.current() if view is not None else None
        except Exception:  # the key-value store is slow or gone: no figure this time
            decision = None
        if decision is not None:
            out[model_id] = decision
    return out


def _routing(backends: Mapping[str, Backend]) -> dict[str, FleetFigures]:
    """Each fleet-routed model's router figures (rayserve/handle_backend.py; app/routing/)."""
    routers = {model_id: getattr(b, "routing", None) for model_id, b in backends.items()}
    return {model_id: r.router.figures() for model_id, r in routers.items() if r is not None}


@router.get("/stats")
async def stats(request: Request) -> dict[str, Any]:
    out: dict[str, Any] = {}
    backends = state_of(request).backends
    routing, scaling = _routing(backends), await _scaling(backends)
    for model_id, replicas in (await _every_replica(backends)).items():
        answered = [s for s in replicas.values() if s is not None]
        model = asdict(combined(answered)) if answered else {"model": model_id, "ready": False, "healthy": False}
        out[model_id] = {**model, "replicas": {r: None if s is None else asdict(s) for r, s in replicas.items()}}
        if model_id in routing:
            out[model_id]["routing"] = routing[model_id].as_json()
        if model_id in scaling:
            out[model_id]["autoscaling"] = scaling[model_id].as_stats(time.time())
        # Requests in flight through this ingress, by tenant (app/tenancy.py; with several ingress replicas, each
        # counts its own).
        out[model_id]["tenants_in_flight"] = dict(state_of(request).capacity.held.get(model_id, {}))
    return out


@router.get("/stats/tenants")
async def tenant_stats(request: Request) -> dict[str, Any]:
    """Per tenant, what this ingress has seen of it (http/tenant_accounts.py)."""
    return state_of(request).capacity.accounts.as_json()


@router.get("/metrics", response_class=PlainTextResponse)
async def prometheus_metrics(request: Request) -> Response:
    state = state_of(request)
    per_model = await _every_replica(state.backends)
    # Only the ingress tier retries and migrates (rayserve/handle_backend.py keeps the counts); an in-process host
    # has none.
    retried = {model_id: b.retried for model_id, b in state.backends.items() if hasattr(b, "retried")}
    migrated = {model_id: b.migrated for model_id, b in state.backends.items() if hasattr(b, "migrated")}
    scaling = ScalingCollector(await _scaling(state.backends))
    return Response(state.metrics.render(per_model, retried, migrated, _routing(state.backends),
                                         [scaling, state.capacity.accounts]),
                    media_type=METRICS_CONTENT_TYPE)


async def _ready(backend: Backend) -> bool:
    try:
        await asyncio.wait_for(backend.check_ready(), timeout=_PROBE_TIMEOUT_S)
        return True
    except Exception:
        return False
