"""An example test file for the shardfs pytest plugin: zarr-python 3 writes an array
through a mount in the test's temporary directory, and reads the sharded store directly.
Run by `scripts/wheel-test` from a fresh venv with the built wheel installed."""

import json
import os

import numpy as np
import pytest
import zarr

import shardfs


def test_zarr_writes_through_the_mount_and_the_store_is_sharded(shardfs_mount):
    data = np.arange(48 * 40, dtype="uint16").reshape(48, 40)
    a = zarr.create_array(str(shardfs_mount.path / "img"), shape=data.shape, chunks=(8, 8),
                          dtype=data.dtype)
    a[:] = data
    # fsync of the mount's root: what the mount staged is in the store.
    fd = os.open(shardfs_mount.path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    meta = json.loads((shardfs_mount.store / "img" / "zarr.json").read_text())
    assert meta["codecs"][0]["name"] == "sharding_indexed"
    direct = zarr.open_array(str(shardfs_mount.store / "img"), mode="r")
    np.testing.assert_array_equal(direct[:], data)


def test_the_context_manager_unmounts_also_when_the_body_raises(tmp_path, shardfs_mount):
    mnt = tmp_path / "ro"
    mnt.mkdir()
    with pytest.raises(ZeroDivisionError):
        with shardfs.mounted(shardfs_mount.store, mnt, read_only=True) as m:
            assert m == mnt
            assert os.path.ismount(m)
            raise ZeroDivisionError
    assert not os.path.ismount(mnt)


def test_errors_carry_the_commands_message(tmp_path):
    with pytest.raises(shardfs.MountError, match="does not exist|no such directory|not a directory"):
        shardfs.mount(tmp_path / "missing", tmp_path)


def test_a_mount_its_test_unmounted_itself_is_fine_at_teardown(tmp_path, shardfs_mounter):
    store = tmp_path / "s"
    store.mkdir()
    mnt = shardfs_mounter(store)
    assert os.path.ismount(mnt)
    shardfs.unmount(mnt)
    assert not os.path.ismount(mnt)


def test_the_readme_python_example_runs_as_written(tmp_path, monkeypatch):
    """The README's Python block, run as written in a directory holding data.zarr (its
    mount point /tmp/mnt replaced by one of the test's own)."""
    readme = open(os.environ["SHARDFS_README"]).read()
    block = readme.split("```python\n", 1)[1].split("```", 1)[0]
    store = tmp_path / "data.zarr"
    a = zarr.create_array(str(store / "raw"), shape=(8, 8), chunks=(2, 2), shards=(4, 4),
                          dtype="uint8")
    a[:] = 7
    (tmp_path / "mnt").mkdir()
    monkeypatch.chdir(tmp_path)
    code = block.replace('"/tmp/mnt"', repr(str(tmp_path / "mnt")))
    exec(compile(code, "README.md", "exec"), {})
