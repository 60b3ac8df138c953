"""`app/engine/quarantine.py`: a request held back is refused at once, by its prompt and parameters alone, until
its hold ends; the memory of held requests is bounded."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.engine import quarantine
from app.engine.quarantine import HOLD_S, Quarantine
from app.errors import RequestQuarantined
from tests.support.fake_stack import make_request


def test_the_same_prompt_and_parameters_are_refused_until_the_hold_ends(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(quarantine.time, "monotonic", lambda: now[0])
    held, other = Quarantine(), make_request("fine")
    request = make_request("POISON", temperature=0.5)
    held.refuse_if_held(request)  # nothing held: nothing refused
    assert held.broke(request, 0, "on replica r1") == 1
    held.refuse_if_held(request)  # one break: not held
    with pytest.raises(RequestQuarantined) as ended:
        held.broke(request, 1, "on replica r2")
    error = ended.value
    assert error.status == 503 and error.retry_after_s == HOLD_S and "the last on replica r2" in error.message
    resent = replace(request, request_id="another", trace_id="t", timeout_s=5.0)  # who and when do not count
    now[0] += HOLD_S / 2
    with pytest.raises(RequestQuarantined) as refused:
        held.refuse_if_held(resent)
    assert refused.value.retry_after_s == HOLD_S / 2
    held.refuse_if_held(other)
    held.refuse_if_held(replace(request, params=replace(request.params, temperature=0.6)))  # changed: sent
    now[0] += HOLD_S / 2
    held.refuse_if_held(resent)  # the hold is over


def test_the_oldest_holds_are_forgotten_past_the_bound(monkeypatch):
    monkeypatch.setattr(quarantine, "MAX_HELD", 2)
    held = Quarantine()
    requests = [make_request(f"prompt {i}") for i in range(3)]
    for request in requests:
        with pytest.raises(RequestQuarantined):
            held.broke(request, 1, "here")
    held.refuse_if_held(requests[0])
    for request in requests[1:]:
        with pytest.raises(RequestQuarantined):
            held.refuse_if_held(request)
