"""vLLM's `/version`, as clients of `vllm serve` probe it: the running vLLM's version, read without loading vLLM."""

from __future__ import annotations

import vllm


async def test_version_is_the_installed_vllms(client):
    resp = await client.get("/version")
    assert resp.status_code == 200
    assert resp.json() == {"version": vllm.__version__}


async def test_metrics_name_the_version_route_as_the_router_knows_it(client):
    """The metrics' endpoint label comes from the app's own routes (a hand-kept list missed /version)."""
    assert (await client.get("/version")).status_code == 200
    assert (await client.get("/no/such/route")).status_code == 404
    metrics = (await client.get("/metrics")).text
    assert 'app_requests_total{endpoint="/version",model="-",status="200"} 1.0' in metrics
    assert 'app_requests_total{endpoint="other",model="-",status="404"} 1.0' in metrics
