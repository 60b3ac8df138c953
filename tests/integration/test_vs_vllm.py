"""The service against bare `vllm serve` (0.32, this install, the same model, name and engine arguments as the
session's stack), request by request over the curated set (loadkit/differential/cases.py): each case is equal
field by field (ids, timestamps and fingerprints aside; floats within compare.FLOAT_TOLERANCE), or differs only
in known ways it names (loadkit/differential/differences.py;
docs/differential.md says why). Any mismatch no known difference accounts for fails its case.

The peer is started once for this module, beside the session's shared stack, and stopped at its end leaving no
process (about 40 s to start). Each case goes to both at once, each engine computing on a core of its own (the
peer on the one the service's engine leaves to its front end: `peer.binding_beside`).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from loadkit.bench.run import prepare_model
from loadkit.differential.cases import CURATED, Case
from loadkit.differential.exchange import send
from loadkit.differential.peer import EngineSettings, Peer, binding_beside
from loadkit.differential.verdict import judge
from tests.support.service import MODEL, REPO, Service, base_config

pytestmark = [pytest.mark.integration, pytest.mark.stack("shared")]


@pytest.fixture(scope="module")
def peer(service: Service, tmp_path_factory) -> Iterator[Peer]:
    """Bare vLLM with the engine arguments of the session stack's config (base_config), computing beside the
    service's engine."""
    settings = EngineSettings.from_config(base_config(0))
    engine = httpx.get(f"{service.base_url}/stats", headers=service.headers, timeout=30).json()[MODEL]["engine"]
    running = Peer.start(settings, REPO, prepare_model(REPO), tmp_path_factory.mktemp("vllm-peer"),
                         env=binding_beside(engine))
    try:
        yield running
    finally:
        stopped = running.stop()
        assert stopped.endswith("no process left behind"), stopped


@pytest.fixture(scope="module")
def clients(peer: Peer, service: Service) -> Iterator[tuple[httpx.Client, httpx.Client]]:
    with httpx.Client(base_url=peer.base_url) as v, httpx.Client(base_url=service.base_url,
                                                                  headers=service.headers) as s:
        yield v, s


@pytest.fixture(scope="module")
def beside() -> Iterator[ThreadPoolExecutor]:
    """A thread that sends to the peer while the test's own thread sends to the service."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="to-vllm") as pool:
        yield pool


def test_the_peer_runs_the_services_precision(peer: Peer, service: Service):
    from loadkit.precision import resolved_dtype

    assert peer.engine_dtype == peer.settings.dtype
    assert resolved_dtype(service.group.log_tail(2_000_000)) in (None, peer.engine_dtype)


@pytest.mark.parametrize("case", CURATED, ids=[c.name for c in CURATED])
def test_the_service_answers_as_vllm(case: Case, clients: tuple[httpx.Client, httpx.Client],
                                     beside: ThreadPoolExecutor):
    vllm, service = clients
    theirs = beside.submit(send, vllm, case.request)
    ours = send(service, case.request)
    # The shared stack has served the suite's other requests (its prefix cache has seen them), the peer only these.
    verdict = judge(case.request, theirs.result(), ours, same_history=False)
    if case.expect == "equal":
        assert verdict.outcome == "equal", f"{case.name} differs from vLLM:\n{verdict.text()}"
    elif verdict.outcome != "equal":  # equal to vLLM is always right; otherwise only in the ways it names
        shown = set(verdict.difference.split("+")) if verdict.difference else set()
        assert shown and shown <= set(case.expect.split("+")), (
            f"{case.name}: expected the known difference(s) {case.expect}, got "
            f"{verdict.difference or verdict.outcome}:\n{verdict.text()}")

