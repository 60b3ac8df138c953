"""The local cluster for the tests that deploy onto an existing cluster: `python -m app cluster up`'s code
(app/cli/local_cluster.py) started once for the block, Ray's logs in a temp dir of its own, and stopped after it,
leaving no process; inside, loadkit's `LocalCluster` operates it as a user would."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from app.cli import local_cluster, ray_address
from loadkit.cluster import LocalCluster


@contextmanager
def running_local_cluster(tmp: Path, workers: int = 2, env: dict[str, str] | None = None) -> Iterator[LocalCluster]:
    temp_dir = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))  # short: Ray's unix sockets live under it
    state_dir = tmp / "cluster-state"
    try:
        local_cluster.up(workers, state_dir=state_dir, env=env or {}, temp_dir=temp_dir)
        yield LocalCluster(state_dir)
    finally:
        leftovers = local_cluster.down(state_dir=state_dir)
        # `ray start --head` wrote its address there for a bare `ray.init()`; `down` removes it, as `ray stop` does
        address_left = ray_address.address_file(str(temp_dir)).exists()
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert leftovers == 0, f"{leftovers} process(es) of the local cluster outlived its nodes and were killed"
        assert not address_left, "the stopped head's address was left in Ray's address file"
