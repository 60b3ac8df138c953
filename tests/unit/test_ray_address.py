"""app/cli/ray_address.py: the local cluster removes its head's address from Ray's address file, and nobody else's."""

from __future__ import annotations

from app.cli import ray_address


def test_the_file_naming_this_head_is_removed_and_another_cluster_s_is_kept(tmp_path):
    path = ray_address.address_file(str(tmp_path))
    assert path == tmp_path / "ray_current_cluster"  # where `ray start --head --temp-dir` writes it
    path.write_text("192.0.2.2:23456")  # Ray writes the head's interface address
    assert not ray_address.forget(3456, str(tmp_path)) and path.exists()  # another head's port
    assert ray_address.forget(23456, str(tmp_path)) and not path.exists()
    assert not ray_address.forget(23456, str(tmp_path))  # nothing left to remove
