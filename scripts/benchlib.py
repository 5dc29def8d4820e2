"""The benchmarks' shared code: the shardfs binary, the machine (and dropping its caches),
the test array and its unsharded twin, a mount daemon in a child, its peak RSS, the FUSE
floor (`examples/fuse_floor`) in a child, timed reads, the report (and the row of
scripts/bench.py's table).

Used by scripts/bench.py (and its cases, bench_reads.py and bench_writes.py) and
scripts/bench_s3.py (imported from the scripts directory).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import google_crc32c
import numpy as np
import zarr

REPO = Path(__file__).resolve().parent.parent
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
BIN = TARGET / "release" / "shardfs"
FLOOR = TARGET / "release" / "examples" / "fuse_floor"
MIB = 1 << 20


# ----- machine ---------------------------------------------------------------------


def machine_info(data_dir: Path) -> dict:
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kib = int(line.split()[1])
    src = subprocess.run(
        ["findmnt", "-n", "-o", "SOURCE,FSTYPE", "-T", str(data_dir)],
        capture_output=True, text=True,
    ).stdout.strip()
    dev = src.split()[0] if src else ""
    rota = ""
    if dev.startswith("/dev/"):
        name = Path(dev).name
        rot = Path(f"/sys/block/{name}/queue/rotational")
        if rot.exists():
            rota = "rotational" if rot.read_text().strip() == "1" else "non-rotational"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": round(mem_kib / (1 << 20), 1),
        "kernel": platform.release(),
        "disk": f"{src} {('(' + rota + ' as reported by the VM)') if rota else ''}".strip(),
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "commit": subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True,
        ).stdout.strip()
        + (
            "+dirty"
            if subprocess.run(
                ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True, text=True,
            ).stdout.strip()
            else ""
        ),
    }


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


# ----- data ------------------------------------------------------------------------


@dataclass
class Geometry:
    """A 2-D uint8 array: inner chunk shape, chunks per shard, shards."""

    name: str
    chunk: tuple[int, int]
    per_shard: tuple[int, int]
    shards: tuple[int, int]

    @property
    def chunk_bytes(self) -> int:
        return self.chunk[0] * self.chunk[1]

    @property
    def shard_shape(self) -> tuple[int, int]:
        return (self.chunk[0] * self.per_shard[0], self.chunk[1] * self.per_shard[1])

    @property
    def grid(self) -> tuple[int, int]:
        return (self.per_shard[0] * self.shards[0], self.per_shard[1] * self.shards[1])

    @property
    def shape(self) -> tuple[int, int]:
        return (self.chunk[0] * self.grid[0], self.chunk[1] * self.grid[1])

    @property
    def n_chunks(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def chunks_per_shard(self) -> int:
        return self.per_shard[0] * self.per_shard[1]

    def keys(self) -> list[tuple[int, int]]:
        return [(i, j) for i in range(self.grid[0]) for j in range(self.grid[1])]


def create_sharded(path: Path, g: Geometry, shape=None) -> zarr.Array:
    return zarr.create_array(
        store=str(path), shape=shape or g.shape, dtype="uint8", chunks=g.chunk,
        shards=g.shard_shape, compressors=None, filters=None, fill_value=0,
        zarr_format=3, overwrite=True,
    )


def create_plain(path: Path, g: Geometry, shape=None) -> zarr.Array:
    return zarr.create_array(
        store=str(path), shape=shape or g.shape, dtype="uint8", chunks=g.chunk,
        compressors=None, filters=None, fill_value=0, zarr_format=3, overwrite=True,
    )


def chunk_bytes(seed: int, key: tuple[int, int], n: int) -> bytes:
    # Distinct, incompressible-looking bytes per chunk, cheap to make.
    rng = np.random.Generator(np.random.PCG64([seed, key[0], key[1]]))
    return rng.integers(0, 256, n, dtype=np.uint8).tobytes()


def write_store_and_twin(store: Path, twin: Path, g: Geometry, seed: int) -> None:
    """The sharded array at `store` and its unsharded twin, the same bytes per chunk,
    shards written directly (index at the end: offset, nbytes little-endian, crc32c)."""
    create_sharded(store, g)
    create_plain(twin, g)
    pi, pj = g.per_shard
    for si in range(g.shards[0]):
        for sj in range(g.shards[1]):
            parts, index = [], []
            off = 0
            for a in range(pi):
                for b in range(pj):
                    key = (si * pi + a, sj * pj + b)
                    data = chunk_bytes(seed, key, g.chunk_bytes)
                    parts.append(data)
                    index.append((off, len(data)))
                    off += len(data)
                    d = twin / "c" / str(key[0])
                    d.mkdir(parents=True, exist_ok=True)
                    (d / str(key[1])).write_bytes(data)
            idx = np.array(index, dtype="<u8").tobytes()
            idx += google_crc32c.value(idx).to_bytes(4, "little")
            d = store / "c" / str(si)
            d.mkdir(parents=True, exist_ok=True)
            with open(d / str(sj), "wb") as f:
                for p in parts:
                    f.write(p)
                f.write(idx)


# ----- the daemon ------------------------------------------------------------------


def proc_status(pid: int) -> dict[str, int]:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            k, _, v = line.partition(":")
            if v.strip().endswith("kB"):
                out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


class RssSampler:
    """Peak RssAnon of a process, sampled every 2 ms while running."""

    def __init__(self, pid: int):
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, proc_status(self.pid).get("RssAnon", 0))
            self._stop.wait(0.002)

    def __enter__(self):
        self.peak = proc_status(self.pid).get("RssAnon", 0)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, proc_status(self.pid).get("RssAnon", 0))


LIVE_MOUNTS: list["Mount"] = []


def is_mounted(path: Path) -> bool:
    p = str(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == p for line in f)


class Mount:
    """`shardfs mount --foreground` in a child we control: its pid is the daemon."""

    def __init__(self, store: Path | str, mnt: Path, log: Path, *args: str,
                 nofile: int | None = None, env: dict[str, str] | None = None):
        mnt.mkdir(parents=True, exist_ok=True)
        self.mnt = mnt
        self.log = open(log, "ab")

        def limit():  # runs in the child: the daemon's descriptor limit, soft and hard
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen(
            [str(BIN), "mount", str(store), str(mnt), "--foreground", *args],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
            env={**(env or os.environ), "RUST_LOG": os.environ.get("RUST_LOG", "warn")},
            preexec_fn=limit,
        )
        LIVE_MOUNTS.append(self)
        deadline = time.monotonic() + 30
        while not is_mounted(mnt):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"shardfs mount did not come up (exit status "
                                   f"{self.proc.returncode}); see {log}")
            time.sleep(0.002)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stats(self) -> dict:
        return json.loads((self.mnt / ".shardfs-stats").read_bytes())

    def close(self) -> None:
        if self in LIVE_MOUNTS:
            LIVE_MOUNTS.remove(self)
        if self.proc.poll() is None:
            r = subprocess.run([str(BIN), "unmount", str(self.mnt)], capture_output=True)
            if r.returncode != 0:
                print(f"bench: unmount {self.mnt}: {r.stderr.decode().strip()}", file=sys.stderr)
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if is_mounted(self.mnt):
            subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True)
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


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


def cleanup_mounts() -> None:
    for m in list(LIVE_MOUNTS):
        try:
            m.close()
        except Exception as e:  # noqa: BLE001 - best effort at exit
            print(f"bench: cleaning up {m.mnt}: {e}", file=sys.stderr)


# ----- measurements ----------------------------------------------------------------


def read_file(path: str, mv: memoryview) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        n = 0
        while True:
            k = os.readv(fd, [mv[n:]])
            if k == 0:
                return n
            n += k
    finally:
        os.close(fd)


def read_all(paths: list[str], size: int) -> float:
    """Read every file whole; returns seconds. Checks the byte count."""
    mv = memoryview(bytearray(size + 4096))
    t = time.perf_counter()
    total = 0
    for p in paths:
        total += read_file(p, mv)
    dt = time.perf_counter() - t
    if total != size * len(paths):
        raise RuntimeError(f"read {total} bytes, expected {size * len(paths)}")
    return dt


# ----- report ----------------------------------------------------------------------


def fmt(x: float) -> str:
    if x != x:
        return "–"
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


@dataclass
class Row:
    """One row of scripts/bench.py's table (bench_s3.py has its own)."""

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


def write_doc(section: str, title: str, body: str) -> Path:
    doc = REPO / "docs" / "BENCHMARKS.md"
    text = doc.read_text()
    begin, end = f"<!-- scripts/bench:{section}:begin -->", f"<!-- scripts/bench:{section}:end -->"
    block = f"{begin}\n### {title}\n\n{body}\n{end}"
    if begin in text and end in text:
        pre, rest = text.split(begin, 1)
        _, post = rest.split(end, 1)
        text = pre + block + post
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    doc.write_text(text)
    return doc
