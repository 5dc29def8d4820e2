#!/usr/bin/env python3
"""A timeline of one reader in key order through a read-only S3 mount at D = 30 ms.

Issue 34's arrays A and B (scripts/bench_s3_latency.py, whose set-up this reuses: s3s-fs
behind scripts/s3_proxy.py), each read three times through a fresh mount with
`RUST_LOG=shardfs=debug` and `--log-file OUT/<array>-<rep>.log` (the daemon's requests,
with times), printing when each chunk file's read began and ended (ms after the first
open) and the mount's request counts; then zarr-python 3 + obstore reading the bucket
directly, three times. Compare the two by hand: where the reader waits, and on which
request. Last, `find` of the whole bucket (both arrays) through a fresh read-only and a
fresh writable mount, taking turns, 5 each: the median and the mount's requests (a
writable mount also asks, per directory, for the document an unlink keeps). Run as root
(it mounts), with the venv's Python:

    .venv/bin/python scripts/s3_timeline.py OUT_DIR

(`SHARDFS=` and `S3S_FS=` name other binaries, as for bench_s3_latency.py.)
"""
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_s3_latency as b  # noqa: E402

out = Path(sys.argv[1])
base = Path(tempfile.mkdtemp())
ep = b.start_server(base / "s3")
for n in ("B", "A"):
    b.make_array(ep, n)
proxy, _ = b.start_proxy(ep, 30)
for name in ("B", "A"):
    files = b.chunk_files(name)
    for rep in range(3):
        log = out / f"{name}-{rep}.log"
        env = b.env_for(proxy)
        env["RUST_LOG"] = "shardfs=debug"
        mnt = Path(tempfile.mkdtemp(dir=base))
        t_mount = time.monotonic()
        subprocess.run([str(b.BIN), "mount", f"s3://{b.BUCKET}/{name}", str(mnt), "-o", "ro",
                        "--log-file", str(log)], env=env, check=True)
        t0 = time.monotonic()
        marks = []
        for f in files:
            s = time.monotonic()
            b.read_file(mnt / f)
            marks.append((f, (s - t0) * 1e3, (time.monotonic() - t0) * 1e3))
        total = time.monotonic() - t0
        stats = json.loads((mnt / ".shardfs-stats").read_bytes())["store_requests"]
        subprocess.run([str(b.BIN), "unmount", str(mnt)], check=True)
        print(f"{name} rep {rep}: mount {(t0 - t_mount) * 1e3:.0f} ms, read {total * 1e3:.0f} ms, "
              f"wall clock at t0 {time.time() - (time.monotonic() - t0):.3f}, {stats}", flush=True)
        for m in marks:
            print("   %-8s open@%7.1f done@%7.1f" % m)
    for rep in range(3):
        t = b.timed(lambda n=name: b.zarr.open_array(b.obstore_store(proxy, n))[:])
        print(f"{name} obstore direct rep {rep}: {t * 1e3:.0f} ms", flush=True)


def find_once(opts: str) -> tuple[float, dict]:
    mnt = Path(tempfile.mkdtemp(dir=base))
    subprocess.run([str(b.BIN), "mount", f"s3://{b.BUCKET}", str(mnt), "-o", opts],
                   env=b.env_for(proxy), check=True)
    try:
        s0 = json.loads((mnt / ".shardfs-stats").read_bytes())["store_requests"]
        t = time.monotonic()
        subprocess.run(["find", str(mnt)], check=True, stdout=subprocess.DEVNULL)
        dt = time.monotonic() - t
        s1 = json.loads((mnt / ".shardfs-stats").read_bytes())["store_requests"]
        return dt, {k: s1[k] - s0[k] for k in ("get", "head", "list")}
    finally:
        subprocess.run([str(b.BIN), "unmount", str(mnt)], check=True)


times: dict[str, list[float]] = {"ro": [], "rw": []}
asked: dict[str, dict] = {}
for _ in range(5):
    for opts in ("ro", "rw"):
        dt, asked[opts] = find_once(opts)
        times[opts].append(dt)
for opts in ("ro", "rw"):
    print(f"find of the bucket, -o {opts}: median {statistics.median(times[opts]) * 1e3:.0f} ms "
          f"(of 5), requests {asked[opts]}", flush=True)
