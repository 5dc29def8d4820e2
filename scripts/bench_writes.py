"""The write and metadata cases of scripts/bench.py: every chunk of one shard written
one at a time (through the mount, the FUSE floor, plain files and zarr-python 3), `find`
and `ls -R` of the 10,000-shard store, the time `shardfs mount` takes on it, and reading
it with the daemon limited to 1024 open files. What each case measures: bench.py's
docstring.

`WriteCases` is mixed into bench.py's `Bench`, which gives it `args`, `root`, `rows`,
`extra`, `log()` and `mount()`.
"""

from __future__ import annotations

import ctypes
import os
import statistics
import subprocess
import time
import uuid
from pathlib import Path

import numpy as np
import zarr

from benchlib import (
    BIN, MIB, Floor, Geometry, Row, RssSampler, create_plain, create_sharded, drop_caches,
    read_all,
)

LIBC = ctypes.CDLL(None, use_errno=True)


# ----- the daemon ------------------------------------------------------------------


def proc_io(pid: int | str) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        k, _, v = line.partition(":")
        out[k] = int(v)
    return out


def wait_daemon_gone(mnt: Path, timeout: float = 30) -> None:
    """Wait until no `shardfs mount ... MNT` process is left. `shardfs unmount` returns
    once the kernel mount is gone, before the daemon has finished its flush and exited:
    waiting keeps the old daemon's last work out of the next case's measurement."""
    deadline = time.monotonic() + timeout
    needle = str(mnt).encode()
    while time.monotonic() < deadline:
        alive = False
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if args and args[0].endswith(b"shardfs") and b"mount" in args and needle in args:
                alive = True
                break
        if not alive:
            return
        time.sleep(0.01)


# ----- measurements ----------------------------------------------------------------


def timed_cmd(cmd: list[str]) -> tuple[float, int]:
    t = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, check=True)
    return time.perf_counter() - t, r.stdout.count(b"\n")


class WriteCases:
    """The write cases (`writes`) and those on the 10,000-shard store (`metadata`,
    `many_shards`)."""

    # -- writes --------------------------------------------------------------------

    def writes(self, g: Geometry, label: str) -> None:
        """Every chunk of one shard written one at a time: with zarr-python's file pattern
        (mkdir -p, `<key>.<hex>.partial`, write, close, rename onto the key) through the
        mount and into plain files, against zarr-python 3 writing the sharded store
        directly; and zarr-python 3 itself through the mount and on plain files."""
        reps = self.args.write_reps
        d = self.root / f"w-{label}"
        store, plain = d / "store", d / "plain"
        one = Geometry(g.name, g.chunk, g.per_shard, (1, 1))
        names = ("via", "vianowb", "zvia", "direct")
        for r in range(reps):
            for n in names:
                create_sharded(store / f"{n}{r}", one)
            create_plain(plain / f"p{r}", one)
            create_plain(plain / f"ps{r}", one)
            create_plain(plain / f"zp{r}", one)
        rng = np.random.default_rng(3)
        block = rng.integers(0, 256, one.shape, dtype=np.uint8)
        ci, cj = g.chunk
        keys = one.keys()
        slices = [(slice(i * ci, (i + 1) * ci), slice(j * cj, (j + 1) * cj)) for i, j in keys]
        files = [(f"c/{i}/{j}", np.ascontiguousarray(block[s]).tobytes())
                 for (i, j), s in zip(keys, slices)]
        payload = one.n_chunks * one.chunk_bytes

        # µs per call of the writer, by tree: where a file's time goes.
        calls: dict[str, dict[str, list[float]]] = {}
        call_names = ("mkdir -p", "open", "write", "close", "rename")

        def put_files(arr: Path, timed: str | None = None) -> None:
            pc = time.perf_counter
            acc = calls.setdefault(timed, {c: [] for c in call_names}) if timed else None
            for key, data in files:
                path = arr / key
                t0 = pc()
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{uuid.uuid4().hex}.partial")
                t1 = pc()
                f = tmp.open("wb")
                t2 = pc()
                f.write(data)
                t3 = pc()
                f.close()
                t4 = pc()
                tmp.replace(path)
                if acc is not None:
                    t5 = pc()
                    for c, dt in zip(call_names, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
                        acc[c].append(dt * 1e6)

        def put_zarr(arr: Path) -> None:
            a = zarr.open_array(str(arr), mode="r+")
            for s in slices:
                a[s] = block[s]

        def via_mount(name: str, put, *args: str) -> tuple[float, float, int, float]:
            """Seconds (the final fsync flush included), amplification, peak RssAnon, and
            seconds until the last rename returned (before the flush)."""
            with self.mount(store, "w", *args) as m:
                arr = m.mnt / name
                os.sync()  # no writeback left over from the case before
                io0 = proc_io(m.pid)["write_bytes"]
                with RssSampler(m.pid) as s:
                    t = time.perf_counter()
                    put(arr)
                    written = time.perf_counter() - t
                    fd = os.open(arr, os.O_RDONLY | os.O_DIRECTORY)
                    os.fsync(fd)  # returns once the shard is durable
                    os.close(fd)
                    dt = time.perf_counter() - t
                return dt, (proc_io(m.pid)["write_bytes"] - io0) / payload, s.peak, written

        def here(arr: Path, put, sync: bool = False) -> tuple[float, float]:
            os.sync()
            io0 = proc_io("self")["write_bytes"]
            t = time.perf_counter()
            put(arr)
            if sync:  # as durable as the mount's final flush: syncfs(2) of the disk
                fd = os.open(arr, os.O_RDONLY | os.O_DIRECTORY)
                LIBC.syncfs(fd)
                os.close(fd)
            dt = time.perf_counter() - t
            return dt, (proc_io("self")["write_bytes"] - io0) / payload

        def via_floor() -> tuple[float, float]:
            empty = d / "floor-mirror"
            empty.mkdir(parents=True, exist_ok=True)
            with Floor(empty, self.root / "mnt" / "wfloor") as f:
                os.sync()
                t = time.perf_counter()
                put_files(f.mnt / "arr", "FUSE floor")
                return time.perf_counter() - t, 0.0

        res: dict[str, list[tuple[float, float]]] = {k: [] for k in
                                                     ("via", "vianowb", "zvia", "plain", "psync",
                                                      "zplain", "direct", "staged", "floor")}
        rss = 0
        def put_timed(arr: Path) -> None:
            put_files(arr, "shardfs")

        def put_plain_timed(arr: Path) -> None:
            put_files(arr, "plain files")

        for r in range(reps):
            for name, put in (("via", put_timed), ("zvia", put_zarr)):
                dt, amp, peak, written = via_mount(f"{name}{r}", put)
                res[name].append((dt, amp))
                if name == "via":
                    res["staged"].append((written, amp))
                rss = max(rss, peak)
            # The same writer with no flush behind it (the final fsync writes everything).
            dt, amp, _, _ = via_mount(f"vianowb{r}", put_files, "--write-behind", "0")
            res["vianowb"].append((dt, amp))
            res["floor"].append(via_floor())
            res["plain"].append(here(plain / f"p{r}", put_files))
            res["psync"].append(here(plain / f"ps{r}", put_plain_timed, sync=True))
            res["zplain"].append(here(plain / f"zp{r}", put_zarr))
            res["direct"].append(here(store / f"direct{r}", put_zarr))
            if r == 0:
                for n in ("via0", "zvia0", "direct0"):
                    if not np.array_equal(zarr.open_array(str(store / n), mode="r")[:], block):
                        raise RuntimeError(f"{n}: the shard reads back wrong")

        def med(k: str, i: int) -> float:
            return statistics.median(x[i] for x in res[k])

        note = f"{one.n_chunks} chunks/shard"
        rows = (
            ("write chunk by chunk, tmp+rename", "via", "direct", "zarr-python on shards", 20.0),
            ("write chunk by chunk, tmp+rename", "via", "plain", "plain files", 0.5),
            ("write chunk by chunk, tmp+rename", "via", "psync", "plain files + syncfs", 0.8),
            ("write chunk by chunk, tmp+rename, --write-behind 0", "vianowb", "psync",
             "plain files + syncfs", None),
            ("write chunk by chunk, tmp+rename", "via", "vianowb", "the mount with --write-behind 0",
             None),
            ("write chunk by chunk, tmp+rename", "via", "floor", "FUSE floor", None),
            ("write chunk by chunk, tmp+rename, until the last rename (before the flush)",
             "staged", "plain", "plain files", None),
            ("write chunk by chunk, tmp+rename, until the last rename (before the flush)",
             "staged", "floor", "FUSE floor", None),
            ("zarr-python 3 write chunk by chunk", "zvia", "direct", "zarr-python on shards", None),
            ("zarr-python 3 write chunk by chunk", "zvia", "zplain", "zarr-python on plain files",
             None),
        )
        floor_note = (f"{note}; the floor against plain files: "
                      f"{med('plain', 0) / med('floor', 0):.3f}×")
        for case, mine, base, base_name, target in rows:
            self.rows.append(Row(case, label, "s", med(mine, 0), med(base, 0), base_name, False,
                                 target, rss / MIB, floor_note if base == "floor" else note))
        self.extra.append(
            f"{label}, tmp+rename, median µs per call of the writer (every file of every run; "
            f"{', '.join(call_names)}): " + "; ".join(
                f"{tree} " + " / ".join(f"{statistics.median(v[c]):.0f}" for c in call_names)
                for tree, v in calls.items()))
        amp = med("via", 1)
        self.rows.append(Row("write amplification, tmp+rename", label, "bytes/payload", amp,
                             med("direct", 1), "zarr-python on shards", False, None, None,
                             f"plain files {med('plain', 1):.2f}, zarr-python through the mount "
                             f"{med('zvia', 1):.3f}; target ≤ 1.1: "
                             f"{'met' if amp <= 1.1 else 'MISSED'}"))
        self.log(f"{label} write: mount {med('via', 0):.2f} s (amp {amp:.3f}), plain "
                 f"{med('plain', 0):.2f} s, zarr direct {med('direct', 0):.2f} s (amp "
                 f"{med('direct', 1):.2f}); zarr via mount {med('zvia', 0):.2f} s, zarr plain "
                 f"{med('zplain', 0):.2f} s")

    # -- metadata ------------------------------------------------------------------

    def metadata(self, g: Geometry, store: Path, twin: Path) -> None:
        reps = self.args.reps
        label = f"{g.n_chunks:,} chunks"
        for tool, cmd in (("find", ["find"]), ("ls -R", ["ls", "-R"])):
            for state in ("cold", "warm"):
                tm, tp, rss = [], [], 0
                for _ in range(reps):
                    with self.mount(store, "m") as m:
                        if state == "cold":
                            drop_caches()
                        else:
                            timed_cmd(cmd + [str(m.mnt / "arr")])
                        with RssSampler(m.pid) as s:
                            dt, lines_m = timed_cmd(cmd + [str(m.mnt / "arr")])
                        rss = max(rss, s.peak)
                        tm.append(dt)
                    if state == "cold":
                        drop_caches()
                    dt, lines_p = timed_cmd(cmd + [str(twin / "arr")])
                    tp.append(dt)
                    if lines_m != lines_p:
                        raise RuntimeError(f"{tool}: mount lists {lines_m} lines, twin {lines_p}")
                self.rows.append(Row(f"`{tool}` of the array, {state}", label, "s",
                                     statistics.median(tm), statistics.median(tp), "plain files",
                                     False, None, rss / MIB))
                self.log(f"{tool} {state}: mount {statistics.median(tm):.3f} s, "
                         f"plain {statistics.median(tp):.3f} s")

        shards = g.shards[0] * g.shards[1]
        for mode, extra in (("rw", []), ("ro", ["--read-only"])):
            times = []
            mnt = self.root / "mnt" / "t"
            mnt.mkdir(parents=True, exist_ok=True)
            for _ in range(reps):
                drop_caches()
                t = time.perf_counter()
                subprocess.run([str(BIN), "mount", str(store), str(mnt), *self.args.mount_arg,
                                *extra], check=True)
                times.append(time.perf_counter() - t)
                try:
                    os.listdir(mnt)
                finally:
                    subprocess.run([str(BIN), "unmount", str(mnt)], check=True)
                    wait_daemon_gone(mnt)
            self.rows.append(Row(f"mount ({mode}), cold", f"{shards:,} shards", "s",
                                 statistics.median(times), 0.2, "target 0.2 s", False, 1.0,
                                 None, "`shardfs mount` until it returns"))
            self.log(f"mount {mode}: {statistics.median(times):.3f} s")

    # -- memory on a store larger than the caches ---------------------------------------

    def many_shards(self, g: Geometry, store: Path) -> None:
        """Read every chunk of the 10,000-shard store, the daemon limited to 1024 open
        files (a common default): more shards than the daemon's index cache holds, so the
        cache evicts as it would on a store larger than RAM."""
        paths = [str(self.root / "mnt" / "m" / f"arr/c/{i}/{j}") for i, j in g.keys()]
        with self.mount(store, "m", nofile=1024) as m:
            drop_caches()
            with RssSampler(m.pid) as s:
                t = time.perf_counter()
                try:
                    read_all(paths, g.chunk_bytes)
                    outcome = f"took {time.perf_counter() - t:.1f} s"
                except OSError as e:
                    outcome = f"FAILED after {time.perf_counter() - t:.1f} s ({e})"
            st = m.stats()
        self.extra.append(
            f"Reading all {g.n_chunks:,} chunks of the {g.shards[0] * g.shards[1]:,}-shard "
            f"store once, cold, with the daemon limited to 1024 open files, {outcome}; peak "
            f"daemon RssAnon {s.peak / MIB:.1f} MiB (index cache: "
            f"{st['index_cache_misses']:,} loads, {st['index_cache_hits']:,} hits)."
        )
        self.log(self.extra[-1])
