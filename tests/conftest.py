"""The suite's order: fewest real stacks up at once, each started once.

On two cores a stack that is up but idle still costs its neighbours (Ray's processes, an engine's memory), and a
stack start costs 30 to 90 s. So every integration module says which stack it runs on, with
`pytest.mark.stack(...)`, and the modules run in groups in this order, each in its collected order within the group:

1. the unit tests (no stack);
2. `stack("shared")`: the session's stack (`service`, tests/support/stacks.py), which these tests leave healthy;
3. `stack("spare")`: the same stack, handed to tests that may break it (`own_service`: a new one if they did);
4. `stack("spare-stopped")`: the Ctrl-C test, which stops it as its test, so it runs last of those;
5. `stack("own")`: the modules that start stacks or clusters of their own, once the session's stack is stopped
   (after the last test of groups 2-4, not at the end of the session, beside the cluster and two-engine tests).

A module without the mark, or a test whose fixtures disagree with its module's mark, stops the run at collection.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["tests.support.stacks"]

GROUPS = {"shared": 1, "spare": 2, "spare-stopped": 3, "own": 4}
# The fixture each stack mark implies, and the marks that may use it.
FIXTURES = {"service": {"shared"}, "own_service": {"spare", "spare-stopped"}}
# The session stack's stop, which `session_stack` registers, and the last test on it, after which it is called.
STOP_SESSION_STACK = pytest.StashKey[object]()
LAST_ON_SESSION_STACK = pytest.StashKey[str]()


def _stack(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("stack")
    return None if marker is None else str(marker.args[0])


def _group(items: list[pytest.Item]) -> int:
    if "unit" in items[0].path.parts:
        return 0
    return GROUPS[_stack(items[0]) or ""]


def _check(item: pytest.Item) -> None:
    if "unit" in item.path.parts:
        return
    stack = _stack(item)
    if stack not in GROUPS:
        raise pytest.UsageError(f"{item.nodeid}: mark its module with pytest.mark.stack(one of {sorted(GROUPS)})")
    for fixture, marks in FIXTURES.items():
        if fixture in item.fixturenames and stack not in marks:
            raise pytest.UsageError(f"{item.nodeid} uses `{fixture}` but is marked stack({stack!r})")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    modules: dict[object, list[pytest.Item]] = {}
    for item in items:
        _check(item)
        modules.setdefault(item.path, []).append(item)
    ordered = sorted(modules.values(), key=_group)  # stable: the collected order within a group
    items[:] = [item for module in ordered for item in module]


def pytest_collection_finish(session: pytest.Session) -> None:
    users = [i.nodeid for i in session.items if _stack(i) in ("shared", "spare", "spare-stopped")]
    if users:
        session.config.stash[LAST_ON_SESSION_STACK] = users[-1]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    config = item.config
    if nextitem is not None and config.stash.get(LAST_ON_SESSION_STACK, None) == item.nodeid:
        stop = config.stash.get(STOP_SESSION_STACK, None)
        if callable(stop):
            stop()
