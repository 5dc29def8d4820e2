"""pytest fixtures: a shardfs mount in the test's temporary directory, always unmounted.

    def test_write(shardfs_mount):            # an empty store, mounted writable
        ...                                   # shardfs_mount.store, shardfs_mount.path

    def test_read(shardfs_mounter):           # any store, any options
        mnt = shardfs_mounter("data.zarr", read_only=True)

Where /dev/fuse cannot be opened the tests are skipped with the reason (and fail when the
CI environment variable is set, so a CI machine without FUSE cannot pass by skipping).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

import shardfs


@dataclass(frozen=True)
class Mounted:
    store: Path
    path: Path


def _require_fuse() -> None:
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as e:
        why = f"cannot open /dev/fuse: {e}"
        if os.environ.get("CI"):
            pytest.fail(f"{why} (CI must be able to mount)")
        pytest.skip(why)


def _mounted(path: Path) -> bool:
    """Whether a mount is at `path`, from the mount table: `os.path.ismount` says no for
    a mount whose daemon died (its stat fails), the very one teardown must unmount."""
    want = os.path.realpath(path)
    with open("/proc/self/mountinfo", errors="surrogateescape") as f:
        for line in f:
            point = line.split()[4]
            # mountinfo escapes space, tab, newline and backslash as octal.
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), point)
            if point == want:
                return True
    return False


@pytest.fixture
def shardfs_mounter(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """A function `mount(store, **options) -> mountpoint` (options as for
    `shardfs.mount`); every mount it made and its test did not unmount itself is
    unmounted at teardown."""
    _require_fuse()
    made: list[Path] = []

    def mount(store: "os.PathLike[str] | str", **options: object) -> Path:
        mnt = tmp_path / f"mnt{len(made)}"
        mnt.mkdir()
        shardfs.mount(store, mnt, **options)
        made.append(mnt)
        return mnt

    yield mount
    errors = []
    for mnt in reversed(made):
        if not _mounted(mnt):
            continue  # the test unmounted it itself
        try:
            shardfs.unmount(mnt)
        except shardfs.MountError as e:
            errors.append(str(e))
    if errors:
        pytest.fail("; ".join(errors))


@pytest.fixture
def shardfs_mount(tmp_path: Path, shardfs_mounter: Callable[..., Path]) -> Mounted:
    """An empty store (`tmp_path / "store"`), mounted writable."""
    store = tmp_path / "store"
    store.mkdir()
    return Mounted(store=store, path=shardfs_mounter(store))
