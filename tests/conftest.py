"""The suite's order: fewest real stacks up at once, each started once.

On two cores a stack that is up but idle still costs its neighbours (Ray's processes, an engine's memory), and a
stack start costs 40 to 90 s. So modules run in groups, each in its collected order within the group:

1. the unit tests (no stack);
2. the modules on the session's shared stack (`service` in tests/integration/conftest.py), which is stopped
   once the last of them ends (not at the end of the session, beside the cluster and two-engine tests);
3. the modules on the spare stack (`own_service`, tests/support/stacks.py), the Ctrl-C test last: it stops
   the stack as its test, so no other test needs one started again;
4. the modules that start stacks or clusters of their own.
"""

from __future__ import annotations

import pytest

SHARED = "service"
SPARE = "own_service"
LAST_OF_THE_SPARE = "test_shutdown.py"
# The session stack's stop, which `service` registers, and the test after which to call it.
STOP_SHARED_STACK = pytest.StashKey[object]()
LAST_ON_SHARED_STACK = pytest.StashKey[str]()


def _group(items: list[pytest.Item]) -> tuple[int, int]:
    path = items[0].path
    if "unit" in path.parts:
        return (0, 0)
    if any(SHARED in i.fixturenames for i in items):
        return (1, 0)
    if any(SPARE in i.fixturenames for i in items):
        return (2, int(path.name == LAST_OF_THE_SPARE))
    return (3, 0)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    modules: dict[object, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.path, []).append(item)
    ordered = sorted(modules.values(), key=_group)  # stable: the collected order within a group
    items[:] = [item for module in ordered for item in module]


def pytest_collection_finish(session: pytest.Session) -> None:
    users = [i.nodeid for i in session.items if SHARED in i.fixturenames]
    if users:
        session.config.stash[LAST_ON_SHARED_STACK] = users[-1]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    config = item.config
    if nextitem is not None and config.stash.get(LAST_ON_SHARED_STACK, None) == item.nodeid:
        stop = config.stash.get(STOP_SHARED_STACK, None)
        if callable(stop):
            stop()
