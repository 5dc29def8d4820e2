"""The read cases of scripts/bench.py: every chunk read cold and warm (and through the
FUSE floor), random chunk reads, zarr-python 3 reading the whole array, and reads as
clients make them (`--only clients`). What each case measures: bench.py's docstring.

`ReadCases` is mixed into bench.py's `Bench`, which gives it `args`, `root`, `rows`,
`client_rows`, `log()` and `mount()`.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np
import zarr

from benchlib import (
    MIB, Floor, Geometry, Row, RssSampler, drop_caches, read_all, read_file,
)


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


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


class ReadCases:
    """The read cases: `reads` (with `floor_reads`) and `clients`."""

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
