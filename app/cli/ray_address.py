"""Ray's address file: where `ray start --head` writes the head's address for a bare `ray.init()` (and `serve run`)
on this machine to connect to, and which `ray stop` removes. The local cluster stops its nodes itself, so it removes
the file itself: left naming a stopped head, a later `serve run configs/serve-cpu.yaml` here retried that head for
minutes instead of starting a Ray of its own (seen after a local cluster had come and gone)."""

from __future__ import annotations

from pathlib import Path


def address_file(temp_dir: str | None) -> Path:
    """Where Ray keeps it for the session root `temp_dir` (None: Ray's default, /tmp/ray or $RAY_TMPDIR/ray)."""
    from ray._common.utils import get_ray_address_file  # what `ray start` and `ray stop` use

    return Path(get_ray_address_file(temp_dir))


def forget(gcs_port: int, temp_dir: str | None) -> bool:
    """Removes the address file where it names the head listening on `gcs_port` (Ray writes the head's interface
    address, not loopback); a file naming another cluster is left alone. Returns whether it was removed."""
    path = address_file(temp_dir)
    try:
        if not path.read_text().strip().endswith(f":{gcs_port}"):
            return False
        path.unlink()
    except OSError:  # none there, or gone meanwhile
        return False
    return True
