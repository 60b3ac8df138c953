"""vLLM's `/version`, as clients of `vllm serve` probe it: the running vLLM's version, read without loading vLLM."""

from __future__ import annotations

import vllm


async def test_version_is_the_installed_vllms(client):
    resp = await client.get("/version")
    assert resp.status_code == 200
    assert resp.json() == {"version": vllm.__version__}
