#!/usr/bin/env python3
"""shardfs against plain files and zarr-python 3, every case in one run (issue #6).

Run through `scripts/bench` (it builds the release binary and the venv first).

For 1 MiB chunks (uint8, no compression, 64 per shard) and 16 KiB chunks (256 per
shard) it creates, in one temporary directory on one disk, a sharded store and its
unsharded twin (one plain file per chunk, the same bytes), then measures:

* reads as clients make them (`--only clients`): every chunk read warm with Python's
  `open().read()`, unbuffered `open().readall()`, `os.open` + `os.readv`, zarr-python 3
  reading the whole array and `cp -r` of the array, on plain files, the read-only mount,
  the writable mount, the writable mount with `-o open_checks` and each mount's FUSE
  floor, interleaved in one run; and the round
  trip of the `TCGETS` ioctl behind Python's `isatty()` (every default `open()` before
  Python 3.14 makes one);
* read all chunks: the mount vs the twin, cold (page cache dropped, fresh daemon) and
  warm; throughput; the read cases run on a writable mount and again on a read-only
  one (`-o ro`; on both the kernel opens files itself);
* random chunk reads: open+read+close latency of distinct random chunks, p50 and p99,
  page cache dropped before the run (fresh daemon);
* zarr-python 3 reading the whole array: through the mount vs directly from the shards,
  and vs the twin (the same chunk files, unsharded on the disk) (warm);
* write chunk by chunk: every chunk of one shard written one at a time with
  zarr-python's file pattern (mkdir -p, write `<key>.<hex>.partial`, rename onto the
  key) through the mount (the final fsync flush included) and into plain files, against
  zarr-python 3 writing the same chunks one at a time into the sharded store directly
  (it rewrites the shard each time); also zarr-python 3 itself through the mount and on
  plain files; and, for reference, the mount's time until the last rename returned
  (the chunks staged, before the flush); and each call of that writer timed on its own
  (mkdir -p, open, write, close, rename) on the mount, the floor and plain files + syncfs,
  medians printed below the table. Write amplification = bytes the writer (for the mount: the daemon) sent
  to the disk (/proc/PID/io write_bytes) per payload byte;
* metadata: `find` and `ls -R` of an array with 100,000 chunks (10,000 shards), mount
  vs twin; the time `shardfs mount` takes to return for that store of 10,000 shards;
* memory: the daemon's peak anonymous RSS (RssAnon sampled every 2 ms) in every case;
* the FUSE floor: warm read all (writable-mount pass) and the chunk-by-chunk writer
  through `examples/fuse_floor`, a FUSE file system that shows a directory's tree and
  does nothing else: what the kernel round trips alone cost here, against shardfs and
  against plain files.

Prints a table of medians with "speed vs baseline" (>1: shardfs faster; throughput
ratio, or baseline time / shardfs time) and writes it, with the machine, into a section
of docs/BENCHMARKS.md (`--section`).
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zarr

sys.dont_write_bytecode = True  # importing benchlib.py leaves no scripts/__pycache__

from benchlib import (  # noqa: E402  (scripts/benchlib.py, beside this script)
    BIN, LIVE_MOUNTS, TARGET, Geometry, Mount, RssSampler, cleanup_mounts, create_plain,
    create_sharded, fmt, is_mounted, machine_info, read_all, read_file, write_doc,
    write_store_and_twin,
)

LIBC = ctypes.CDLL(None, use_errno=True)

FLOOR = TARGET / "release" / "examples" / "fuse_floor"
MIB = 1 << 20


# ----- machine ---------------------------------------------------------------------


DROP_WARNED = False


def drop_caches() -> bool:
    """Drop the kernel's page, dentry and inode caches (root). Warns once if it cannot."""
    global DROP_WARNED
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError as e:
        if not DROP_WARNED:
            print(f"bench: cannot drop caches ({e}): 'cold' numbers are warm", file=sys.stderr)
            DROP_WARNED = True
        return False


# ----- the daemon ------------------------------------------------------------------


def proc_io(pid: int | str) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        k, _, v = line.partition(":")
        out[k] = int(v)
    return out


class Floor:
    """`examples/fuse_floor [--no-open] MIRROR MNT`: a FUSE file system that shows the
    tree of MIRROR (names, sizes, and the bytes of its files read from MIRROR), set up and
    replying as shardfs does where speed is concerned. What a case costs through it is
    what the kernel round trips alone cost on this machine. `no_open`: the kernel opens
    files without asking, as on a shardfs mount without `-o open_checks` (that mount's
    floor)."""

    def __init__(self, mirror: Path, mnt: Path, no_open: bool = False,
                 answer_flush: bool = False):
        mnt.mkdir(parents=True, exist_ok=True)
        self.mnt = mnt
        flags = (["--no-open"] if no_open else []) + (["--answer-flush"] if answer_flush else [])
        self.proc = subprocess.Popen([str(FLOOR), *flags, str(mirror), str(mnt)],
                                     stdin=subprocess.DEVNULL)
        LIVE_MOUNTS.append(self)
        deadline = time.monotonic() + 30
        while not is_mounted(mnt):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"fuse_floor did not mount {mnt}")
            time.sleep(0.002)

    def close(self) -> None:
        if self in LIVE_MOUNTS:
            LIVE_MOUNTS.remove(self)
        if is_mounted(self.mnt):
            subprocess.run(["umount", str(self.mnt)], capture_output=True)
        if is_mounted(self.mnt):
            subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


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


def random_latencies(paths: list[str], size: int) -> list[float]:
    mv = memoryview(bytearray(size + 4096))
    out = []
    for p in paths:
        t = time.perf_counter()
        n = read_file(p, mv)
        out.append(time.perf_counter() - t)
        if n != size:
            raise RuntimeError(f"{p}: read {n} bytes, expected {size}")
    return out


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def timed_cmd(cmd: list[str]) -> tuple[float, int]:
    t = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, check=True)
    return time.perf_counter() - t, r.stdout.count(b"\n")


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@dataclass
class Row:
    case: str
    size: str
    metric: str
    shardfs: float
    baseline: float
    baseline_name: str
    higher_is_better: bool
    target: float | None = None
    rss_mib: float | None = None
    note: str = ""

    @property
    def speed(self) -> float:
        if self.shardfs == 0 or self.baseline == 0:
            return float("nan")
        return self.shardfs / self.baseline if self.higher_is_better else self.baseline / self.shardfs

    @property
    def verdict(self) -> str:
        if self.target is None:
            return ""
        return "met" if self.speed >= self.target else "MISSED"


@dataclass
class Bench:
    args: argparse.Namespace
    root: Path
    rows: list[Row] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    client_rows: list[str] = field(default_factory=list)

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    def mount(self, store: Path, name: str, *args: str, nofile: int | None = None) -> Mount:
        return Mount(store, self.root / "mnt" / name, self.root / "daemon.log",
                     *self.args.mount_arg, *args, nofile=nofile)

    # -- reads ---------------------------------------------------------------------

    def reads(self, g: Geometry, store: Path, twin: Path, label: str, ro: bool) -> None:
        """The read cases on a writable mount (`ro` False) or a read-only one (`-o ro`); on
        both the kernel opens files without asking."""
        reps = self.args.reps
        ro_args = ("-o", "ro") if ro else ()
        kind = ", -o ro" if ro else ""
        keys = g.keys()
        rel = [f"arr/c/{i}/{j}" for i, j in keys]
        plain_paths = [str(twin / r) for r in rel]
        mnt = self.root / "mnt" / "r"
        mount_paths = [str(mnt / r) for r in rel]
        mib = g.n_chunks * g.chunk_bytes / MIB

        # read all, cold: a fresh daemon and an empty page cache for every repetition.
        cold_m, cold_p, rss, req = [], [], 0, []
        for _ in range(reps):
            drop_caches()
            cold_p.append(read_all(plain_paths, g.chunk_bytes))
            with self.mount(store, "r", *ro_args) as m:
                drop_caches()
                with RssSampler(m.pid) as s:
                    cold_m.append(read_all(mount_paths, g.chunk_bytes))
                rss = max(rss, s.peak)
                st = m.stats()
                req.append(st["chunk_bytes_read"] / max(1, st["chunk_reads"]))
        self.rows.append(Row("read all, cold" + kind, label, "MiB/s",
                             mib / statistics.median(cold_m),
                             mib / statistics.median(cold_p), "plain files", True,
                             0.8 if g.chunk_bytes >= MIB else 0.5, rss / MIB,
                             f"mean FUSE read {statistics.median(req) / 1024:.0f} KiB"))
        self.log(f"{label}{kind} read all cold: mount "
                 f"{mib / statistics.median(cold_m):.0f} MiB/s, "
                 f"plain {mib / statistics.median(cold_p):.0f} MiB/s")

        # read all, warm (and zarr-python, warm) on one daemon.
        with self.mount(store, "r", *ro_args) as m:
            read_all(mount_paths, g.chunk_bytes)
            read_all(plain_paths, g.chunk_bytes)
            warm_m, warm_p = [], []
            with RssSampler(m.pid) as s:
                for _ in range(reps):
                    warm_p.append(read_all(plain_paths, g.chunk_bytes))
                    warm_m.append(read_all(mount_paths, g.chunk_bytes))
            self.rows.append(Row("read all, warm" + kind, label, "MiB/s",
                                 mib / statistics.median(warm_m),
                                 mib / statistics.median(warm_p), "plain files", True,
                                 0.8 if g.chunk_bytes >= MIB else 0.5, s.peak / MIB))
            self.log(f"{label}{kind} read all warm: mount "
                     f"{mib / statistics.median(warm_m):.0f} MiB/s, "
                     f"plain {mib / statistics.median(warm_p):.0f} MiB/s")
            if not ro:
                self.floor_reads(g, twin, rel, plain_paths, label, mib,
                                 statistics.median(warm_m))

            za_m, za_d, za_t = [], [], []
            direct = zarr.open_array(str(store / "arr"), mode="r")
            via = zarr.open_array(str(mnt / "arr"), mode="r")
            if not np.array_equal(direct[:], via[:]):
                raise RuntimeError("zarr-python reads different data through the mount")
            with RssSampler(m.pid) as s:
                for _ in range(reps):
                    t = time.perf_counter()
                    zarr.open_array(str(store / "arr"), mode="r")[:]
                    za_d.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    zarr.open_array(str(mnt / "arr"), mode="r")[:]
                    za_m.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    zarr.open_array(str(twin / "arr"), mode="r")[:]
                    za_t.append(time.perf_counter() - t)
            self.rows.append(Row("zarr-python 3 read array, warm" + kind, label, "s",
                                 statistics.median(za_m), statistics.median(za_d),
                                 "zarr-python on shards", False, None, s.peak / MIB))
            # The same chunk files, unsharded on the disk: what one file per chunk costs
            # zarr-python itself, FUSE aside.
            self.rows.append(Row("zarr-python 3 read array, warm" + kind, label, "s",
                                 statistics.median(za_m), statistics.median(za_t),
                                 "zarr-python on plain files", False, None, s.peak / MIB))
            self.log(f"{label}{kind} zarr read: mount {statistics.median(za_m):.2f} s, "
                     f"direct {statistics.median(za_d):.2f} s, plain files {statistics.median(za_t):.2f} s")

        # random chunk reads, cold.
        n = min(self.args.random_reads, len(keys))
        pick = random.Random(7).sample(range(len(keys)), n)
        drop_caches()
        lat_p = random_latencies([plain_paths[i] for i in pick], g.chunk_bytes)
        with self.mount(store, "r", *ro_args) as m:
            drop_caches()
            with RssSampler(m.pid) as s:
                lat_m = random_latencies([mount_paths[i] for i in pick], g.chunk_bytes)
        for q, name in ((0.5, "p50"), (0.99, "p99")):
            self.rows.append(Row(f"random chunk read {name}, cold{kind}", label, "ms",
                                 pct(lat_m, q) * 1e3, pct(lat_p, q) * 1e3, "plain files",
                                 False, None, s.peak / MIB, f"{n} distinct chunks"))
        self.log(f"{label}{kind} random p50: mount {pct(lat_m, .5) * 1e3:.2f} ms, "
                 f"plain {pct(lat_p, .5) * 1e3:.2f} ms")

    def floor_reads(self, g: Geometry, twin: Path, rel: list[str], plain_paths: list[str],
                    label: str, mib: float, mount_s: float) -> None:
        """Warm read all through the FUSE floor (the kernel opens files itself, as on a
        shardfs mount without `open_checks`), against the same plain files."""
        reps = self.args.reps
        with Floor(twin, self.root / "mnt" / "floor", no_open=True) as f:
            paths = [str(f.mnt / r) for r in rel]
            read_all(paths, g.chunk_bytes)
            floor, plain = [], []
            for _ in range(reps):
                plain.append(read_all(plain_paths, g.chunk_bytes))
                floor.append(read_all(paths, g.chunk_bytes))
        fl, pl = statistics.median(floor), statistics.median(plain)
        self.rows.append(Row("read all, warm", label, "MiB/s", mib / mount_s, mib / fl,
                             "FUSE floor", True, None, None,
                             f"the floor against plain files: {pl / fl:.3f}×"))
        self.log(f"{label} read all warm: FUSE floor {mib / fl:.0f} MiB/s, "
                 f"plain {mib / pl:.0f} MiB/s ({pl / fl:.3f}×)")

    # -- reads as clients make them ----------------------------------------------------

    def clients(self, g: Geometry, store: Path, twin: Path, label: str) -> None:
        """Warm reads through the calls clients make, on six trees at once, interleaved
        round by round (the order rotating): plain files (the twin), a read-only mount and
        its floor (`fuse_floor --no-open`: the kernel opens files itself), a writable
        mount (the kernel opens files itself, as on the read-only mount: the same floor),
        and a writable mount with `-o open_checks` and its floor (every open asks the
        daemon). One table row per call."""
        reps = self.args.reps
        rel = [f"arr/c/{i}/{j}" for i, j in g.keys()]
        mnt = self.root / "mnt"
        shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else self.root
        dest = shm / f"shardfs-bench-cp-{os.getpid()}"
        with self.mount(store, "cro", "-o", "ro") as ro, self.mount(store, "crw") as rw, \
                self.mount(store, "coc", "-o", "open_checks") as oc, \
                Floor(twin, mnt / "fro", no_open=True) as fro, Floor(twin, mnt / "frw") as frw:
            trees = {"plain": twin, "ro floor": fro.mnt, "ro mount": ro.mnt,
                     "rw mount": rw.mnt, "rw floor": frw.mnt, "rw open checks": oc.mnt}
            paths = {k: [str(v / r) for r in rel] for k, v in trees.items()}
            expect = g.n_chunks * g.chunk_bytes

            def buffered(ps: list[str]) -> int:
                n = 0
                for p in ps:
                    with open(p, "rb") as f:
                        n += len(f.read())
                return n

            def unbuffered(ps: list[str]) -> int:
                n = 0
                for p in ps:
                    with open(p, "rb", buffering=0) as f:
                        n += len(f.readall())
                return n

            mv = memoryview(bytearray(g.chunk_bytes + 4096))

            def raw(ps: list[str]) -> int:
                return sum(read_file(p, mv) for p in ps)

            def whole_array(tree: Path) -> int:
                return zarr.open_array(str(tree / "arr"), mode="r")[:].nbytes

            def cp_r(tree: Path) -> int:
                shutil.rmtree(dest, ignore_errors=True)
                subprocess.run(["cp", "-r", str(tree / "arr"), str(dest)], check=True)
                return dir_bytes(dest / "c")

            per_file = [("`open(p,'rb').read()`", buffered),
                        ("`open(p,'rb',buffering=0).readall()`", unbuffered),
                        ("`os.open` + `os.readv`", raw)]
            whole = [("zarr-python 3 `open_array(...)[:]`", whole_array),
                     ("`cp -r` of the array (to /dev/shm)", cp_r)]
            # Correct bytes first: zarr-python through every tree equals the plain twin.
            want = zarr.open_array(str(twin / "arr"), mode="r")[:]
            for k, v in trees.items():
                if not np.array_equal(zarr.open_array(str(v / "arr"), mode="r")[:], want):
                    raise RuntimeError(f"zarr-python reads different data through {k}")
            order = list(trees)
            # Each per-file timing covers at least 4,096 file reads (the 1 MiB array has
            # 256 chunks: 16 passes), so that one timing is long enough (≥ 0.1 s) not to
            # be decided by a stray scheduling delay on a small machine.
            passes = max(1, 4096 // g.n_chunks)
            times: dict[tuple[str, str], list[float]] = {}
            try:
                for name, fn in per_file + whole:
                    arg = paths if (name, fn) in per_file else trees
                    for k in order:  # warm every tree's page cache and dentries
                        if fn(arg[k]) != expect:
                            raise RuntimeError(f"{name} on {k}: wrong byte count")
                    n = passes if arg is paths else 1
                    for rnd in range(reps):
                        for k in order[rnd % len(order):] + order[:rnd % len(order)]:
                            t = time.perf_counter()
                            for _ in range(n):
                                fn(arg[k])
                            times.setdefault((name, k), []).append(
                                (time.perf_counter() - t) / n)
            finally:
                shutil.rmtree(dest, ignore_errors=True)
            # isatty() on an open chunk: Python < 3.14 calls it at every default open();
            # FUSE forwards the TCGETS ioctl to the daemon each time.
            n_tty = 2000
            for rnd in range(reps):
                for k in order[rnd % len(order):] + order[:rnd % len(order)]:
                    fd = os.open(paths[k][0], os.O_RDONLY)
                    try:
                        t = time.perf_counter()
                        for _ in range(n_tty):
                            os.isatty(fd)
                        times.setdefault(("isatty", k), []).append(
                            (time.perf_counter() - t) / n_tty * g.n_chunks)
                    finally:
                        os.close(fd)
        med = {key: statistics.median(v) for key, v in times.items()}
        us = 1e6 / g.n_chunks
        lines = []
        for name, _ in per_file + whole + [("`isatty()` (TCGETS ioctl), per call", None)]:
            key = "isatty" if name.startswith("`isatty") else name
            m = {k: med[(key, k)] for k in order}
            fl_ro = m["ro floor"] / m["ro mount"]
            rw_ro = m["ro mount"] / m["rw mount"]
            oc_ro = m["ro mount"] / m["rw open checks"]
            # The goals are on reads; the ioctl row is there to show its round trip. The
            # writable goal is for the default writable mount (the kernel opens files);
            # the strict one's (-o open_checks) is shown beside its floor.
            goal_ro = "" if key == "isatty" else (" met" if fl_ro >= 0.9 else " MISSED")
            goal_rw = "" if key == "isatty" else (" met" if rw_ro >= 0.8 else " MISSED")
            lines.append(
                f"| {name} | {label} | {m['plain'] * us:.1f} | {m['ro floor'] * us:.1f} | "
                f"{m['ro mount'] * us:.1f} | {m['plain'] / m['ro floor']:.2f} | "
                f"{m['plain'] / m['ro mount']:.2f} | {fl_ro:.2f}{goal_ro} | "
                f"{m['rw mount'] * us:.1f} | {m['plain'] / m['rw mount']:.2f} | "
                f"{rw_ro:.2f}{goal_rw} | "
                f"{m['rw floor'] * us:.1f} | {m['rw open checks'] * us:.1f} | "
                f"{m['plain'] / m['rw floor']:.2f} | {m['plain'] / m['rw open checks']:.2f} | "
                f"{oc_ro:.2f} |")
            self.log(f"{label} {name}: plain {m['plain'] * us:.1f} µs/chunk, ro mount "
                     f"{m['ro mount'] * us:.1f} (floor {m['ro floor'] * us:.1f}), rw mount "
                     f"{m['rw mount'] * us:.1f}, rw open_checks "
                     f"{m['rw open checks'] * us:.1f} (floor {m['rw floor'] * us:.1f})")
        self.client_rows.extend(lines)

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


# ----- report ----------------------------------------------------------------------


def table(rows: list[Row]) -> str:
    out = [
        "| case | chunks | metric | shardfs | baseline | baseline is | speed vs baseline | target | daemon peak RssAnon MiB | notes |",
        "|---|---|---|---:|---:|---|---:|---|---:|---|",
    ]
    for r in rows:
        target = f"≥ {r.target:g}× {r.verdict}" if r.target is not None else ""
        rss = fmt(r.rss_mib) if r.rss_mib is not None else ""
        out.append(
            f"| {r.case} | {r.size} | {r.metric} | {fmt(r.shardfs)} | {fmt(r.baseline)} | "
            f"{r.baseline_name} | {fmt(r.speed)}× | {target} | {rss} | {r.note} |"
        )
    return "\n".join(out)


CLIENTS_HEAD = """Reads as clients make them (`--only clients`): every chunk of the array read \
warm, µs per chunk (the `isatty()` row: µs per call), medians, the six trees measured \
interleaved in one run: plain files (the unsharded twin), the read-only mount and its \
floor (`fuse_floor --no-open`: the kernel opens files itself), the writable mount (the \
kernel opens files itself too: its floor is the read-only floor), and a writable mount \
with `-o open_checks` and its floor (every open asks the daemon). Ratios are against \
plain files (> 1: faster than plain) or, for the writable mounts, against the read-only \
mount; goals: read-only mount ≥ 0.9 × its floor, writable mount ≥ 0.8 × read-only.

| call | chunks | plain µs | ro floor µs | ro mount µs | ro floor / plain | ro mount / plain | ro mount vs floor (≥ 0.9) | rw mount µs | rw mount / plain | rw vs ro mount (≥ 0.8) | rw floor (asks at open) µs | rw open_checks µs | rw floor / plain | rw open_checks / plain | rw open_checks vs ro mount |
|---|---|---:|---:|---:|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---:|
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="a 1-2 minute smoke run: smaller arrays, fewer repetitions")
    ap.add_argument("--dir", type=Path, default=None,
                    help="where to create the data (default: the system temp dir); "
                         "it must be on the disk you want to measure")
    ap.add_argument("--reps", type=int, default=None, help="repetitions of each read case")
    ap.add_argument("--write-reps", type=int, default=None,
                    help="repetitions of each write case (default 3; quick 1)")
    ap.add_argument("--large-shards", type=int, default=None,
                    help="shards of 64 x 1 MiB chunks in the read array (default 16; quick 2)")
    ap.add_argument("--small-shards", type=int, default=None,
                    help="shards of 256 x 16 KiB chunks in the read array (default 64; quick 8)")
    ap.add_argument("--section", default="latest",
                    help="name of the section of docs/BENCHMARKS.md to write (default: latest)")
    ap.add_argument("--title", default=None, help="heading of that section")
    ap.add_argument("--no-doc", action="store_true", help="do not touch docs/BENCHMARKS.md")
    ap.add_argument("--keep", action="store_true", help="keep the data directory")
    ap.add_argument("--only", default="clients,reads,writes,metadata",
                    help="comma-separated subset of clients,reads,writes,metadata")
    ap.add_argument("--mount-arg", action="append", default=[],
                    help="extra argument for every `shardfs mount` (repeatable)")
    args = ap.parse_args()
    args.reps = args.reps or (2 if args.quick else 5)
    args.write_reps = args.write_reps or (1 if args.quick else 3)
    args.random_reads = 300 if args.quick else 1000
    only = set(args.only.split(","))
    large = Geometry("1MiB", (1024, 1024), (8, 8),
                     (1, args.large_shards or (2 if args.quick else 16)))
    small = Geometry("16KiB", (128, 128), (16, 16),
                     (1, args.small_shards or (8 if args.quick else 64)))
    meta = Geometry("meta", (4, 4), (1, 10), (1000, 10))

    if os.geteuid() != 0:
        print("bench: run as root (drop_caches, mounting)", file=sys.stderr)
        return 2
    if not BIN.exists() or not FLOOR.exists():
        print(f"bench: {BIN} or {FLOOR} missing; run scripts/bench (it builds them)",
              file=sys.stderr)
        return 2
    base = args.dir or Path(tempfile.gettempdir())
    need = 2 * (large.n_chunks * large.chunk_bytes + small.n_chunks * small.chunk_bytes) \
        + 4 * 3 * 64 * MIB + 512 * MIB
    free = shutil.disk_usage(base).free
    if free < 3 * need:
        print(f"bench: {base} has {free / 2**30:.1f} GiB free, want {3 * need / 2**30:.1f}",
              file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="shardfs-bench-", dir=base))

    def on_signal(sig, _frame):
        raise KeyboardInterrupt(f"signal {sig}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    atexit.register(cleanup_mounts)
    if not args.keep:
        atexit.register(lambda: shutil.rmtree(root, ignore_errors=True))
    b = Bench(args, root)
    machine = machine_info(root)
    t0 = time.monotonic()
    try:
        b.log(f"data in {root}")
        if only & {"reads", "writes", "clients"}:
            for g in (large, small):
                label = "1 MiB" if g is large else "16 KiB"
                if "reads" in only or "clients" in only:
                    b.log(f"creating the {label} store and its twin "
                          f"({g.n_chunks} chunks, {g.n_chunks * g.chunk_bytes / MIB:.0f} MiB)")
                    store, twin = root / f"s-{g.name}", root / f"t-{g.name}"
                    write_store_and_twin(store / "arr", twin / "arr", g, seed=1)
                    if "clients" in only:
                        b.clients(g, store, twin, label)
                    if "reads" in only:
                        b.reads(g, store, twin, label, ro=False)
                        b.reads(g, store, twin, label, ro=True)
                    shutil.rmtree(store)
                    shutil.rmtree(twin)
                if "writes" in only:
                    b.writes(g, label)
                    shutil.rmtree(root / f"w-{label}", ignore_errors=True)
        if "metadata" in only:
            b.log("creating the 10,000-shard store with 100,000 chunks and its twin")
            store, twin = root / "s-meta", root / "t-meta"
            write_store_and_twin(store / "arr", twin / "arr", meta, seed=2)
            b.metadata(meta, store, twin)
            b.many_shards(meta, store)
    except KeyboardInterrupt:
        print("bench: interrupted; unmounting", file=sys.stderr)
        return 130
    finally:
        cleanup_mounts()
    elapsed = time.monotonic() - t0

    cmd = "scripts/bench" + "".join(f" {a}" for a in sys.argv[1:])
    m = machine
    body = (
        f"`{cmd}` — {m['date']}, commit {m['commit']}, {elapsed / 60:.1f} min.\n"
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM, kernel "
        f"{m['kernel']}, disk {m['disk']}. Medians of {args.reps} runs (writes: "
        f"{args.write_reps}); \"speed vs baseline\" > 1 means shardfs is faster (throughput "
        f"ratio, or baseline time / shardfs time).\n\n"
        + (table(b.rows) if b.rows else "")
        + ("\n\n" + "\n".join(f"* {e}" for e in b.extra) if b.extra else "")
        + ("\n\n" + CLIENTS_HEAD + "\n".join(b.client_rows) if b.client_rows else "")
        + "\n"
    )
    print()
    print(body)
    if not args.no_doc:
        title = args.title or f"Latest run of `scripts/bench` ({m['date'][:10]})"
        print(f"written to {write_doc(args.section, title, body)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
