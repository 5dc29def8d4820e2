#!/usr/bin/env python3
"""shardfs against plain files and zarr-python 3, every case in one run (issue #6).

Run through `scripts/bench` (it builds the release binary and the venv first). This
file holds the command line, the run and its table; the read cases are in
bench_reads.py, the write and metadata cases in bench_writes.py, the code they share
with the other benchmarks in benchlib.py.

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
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.dont_write_bytecode = True  # importing benchlib.py leaves no scripts/__pycache__

from bench_reads import ReadCases  # noqa: E402  (scripts/bench_reads.py: the read cases)
from bench_writes import WriteCases  # noqa: E402  (the write and metadata cases)
from benchlib import (  # noqa: E402  (scripts/benchlib.py, beside this script)
    BIN, FLOOR, MIB, Geometry, Mount, Row, cleanup_mounts, fmt, machine_info, write_doc,
    write_store_and_twin,
)


@dataclass
class Bench(ReadCases, WriteCases):
    """One run: the cases (ReadCases: bench_reads.py; WriteCases: bench_writes.py) add
    their results to `rows`, `extra` and `client_rows`, which main() prints."""

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
