"""Mount sharded Zarr stores from Python: a context manager around the `shardfs` command.

    with shardfs.mounted("data.zarr", "/tmp/mnt", read_only=True) as mnt:
        ...  # every inner chunk is a file under mnt

The pytest plugin (`shardfs.pytest_plugin`, registered as a pytest11 entry point) gives
tests a mount in their temporary directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sysconfig
import time
from pathlib import Path
from typing import Iterator, Union

__all__ = ["MountError", "binary", "mount", "mounted", "unmount"]

PathLike = Union[str, "os.PathLike[str]"]


class MountError(RuntimeError):
    """`shardfs mount` or `shardfs unmount` failed; the message is the command's own."""


def binary() -> str:
    """The `shardfs` executable: `$SHARDFS_BIN`, the one installed with this package (the
    environment's scripts directory), or the first on `PATH`."""
    env = os.environ.get("SHARDFS_BIN")
    if env:
        return env
    here = Path(sysconfig.get_path("scripts")) / "shardfs"
    if here.exists():
        return str(here)
    found = shutil.which("shardfs")
    if found is None:
        raise MountError("the shardfs command is not installed (pip install shardfs)")
    return found


def _run(args: list[str]) -> None:
    res = subprocess.run([binary(), *args], capture_output=True, text=True)
    if res.returncode != 0:
        msg = res.stderr.strip().removeprefix("shardfs: ") or f"exit status {res.returncode}"
        raise MountError(msg)


def mount(store: PathLike, mountpoint: PathLike, *, read_only: bool = False,
          format: str = "v3", **options: object) -> Path:
    """Mount `store` at `mountpoint` (an existing empty directory); returns once the mount
    is live. `options` are the command's long options: `write_buffer=64` is
    `--write-buffer 64`, `open_checks=True` is `--open-checks`."""
    if format not in ("v2", "v3"):
        raise ValueError(f"format must be 'v2' or 'v3', not {format!r}")
    args = ["mount", os.fspath(store), os.fspath(mountpoint), "--format", format]
    if read_only:
        args.append("--read-only")
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is not False and value is not None:
            args += [flag, str(value)]
    _run(args)
    return Path(mountpoint)


def unmount(mountpoint: PathLike, *, timeout: float = 10.0) -> None:
    """Unmount (flushing what is staged first). A mount kept busy by a process of ours
    that has not let go yet is retried for `timeout` seconds, then detached lazily."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            _run(["unmount", os.fspath(mountpoint)])
            return
        except MountError as e:
            if "busy" not in str(e) or time.monotonic() >= deadline:
                if "busy" in str(e):
                    _run(["unmount", "--lazy", os.fspath(mountpoint)])
                raise
            time.sleep(0.1)


@contextlib.contextmanager
def mounted(store: PathLike, mountpoint: PathLike, *, read_only: bool = False,
            format: str = "v3", **options: object) -> Iterator[Path]:
    """Mount for the body of a `with` block, and always unmount after it, also when the
    body raises (an unmount error is raised only when the body did not)."""
    mnt = mount(store, mountpoint, read_only=read_only, format=format, **options)
    try:
        yield mnt
    except BaseException:
        with contextlib.suppress(MountError):
            unmount(mnt)
        raise
    unmount(mnt)
