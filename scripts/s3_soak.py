#!/usr/bin/env python3
"""Reads and opens through one mount of an S3 prefix while two other mounts write the
same shards: no read may fail or return bytes no writer wrote, and after unmounting
every chunk holds its writer's last acknowledged write (issue 34, "No spurious errors").

    .venv/bin/python scripts/s3_soak.py [--reads 500000] [--readers 4] [--shardfs BIN]

A moto server on 127.0.0.1 (one request at a time, so conditional PUTs are checked as S3
checks them; scripts/s3_local.py) holds one 1-D uint8 array written by zarr-python: 4
shards of 16 chunks of 4 KiB. Mount W0 and W1 (read-write) each own every other chunk
and rewrite random ones of theirs, each write closed and fsynced (a shard commit: a GET
and a conditional PUT, merged again when the other mount got there first). Mount R
(read-only, `--ttl 1`) opens and reads random chunk files with `readers` threads until
`reads` reads are done. Each chunk's bytes say who wrote them, when, and a checksum of
the rest, so a read of a mix of two versions is caught. Prints the counts and exits 1
on any failure. The mounts are unmounted, and the server stopped, however it ends.
"""

from __future__ import annotations

import argparse
import errno
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHUNK = 4096
CHUNKS_PER_SHARD = 16
SHARDS = 4
N = CHUNKS_PER_SHARD * SHARDS
HEADER = struct.Struct("<IIQI")  # writer, chunk, sequence, crc32 of the rest


def chunk_bytes(writer: int, chunk: int, seq: int) -> bytes:
    rnd = random.Random(writer * 1_000_003 + chunk * 7919 + seq)
    rest = rnd.randbytes(CHUNK - HEADER.size)
    return HEADER.pack(writer, chunk, seq, zlib.crc32(rest)) + rest


def check(chunk: int, data: bytes) -> str | None:
    """Why `data` is not a whole chunk some writer wrote at `chunk`; None if it is."""
    if len(data) != CHUNK:
        return f"{len(data)} bytes"
    writer, at, seq, crc = HEADER.unpack_from(data)
    if at != chunk:
        return f"the bytes of chunk {at}"
    if zlib.crc32(data[HEADER.size:]) != crc or data != chunk_bytes(writer, chunk, seq):
        return f"a mix (writer {writer}, sequence {seq})"
    return None


def make_array(path: Path) -> None:
    import numpy as np
    import zarr

    a = zarr.create_array(
        store=str(path), shape=(N * CHUNK,), chunks=(CHUNK,),
        shards=(CHUNK * CHUNKS_PER_SHARD,), dtype="uint8", compressors=None,
        fill_value=0,
    )
    a[:] = np.frombuffer(b"".join(chunk_bytes(9, c, 0) for c in range(N)), dtype="uint8")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reads", type=int, default=500_000)
    ap.add_argument("--readers", type=int, default=4)
    ap.add_argument("--shardfs", default=str(REPO / "target/debug/shardfs"))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="shardfs-soak-"))
    procs: list[subprocess.Popen] = []
    mounts: list[Path] = []
    try:
        return run(args, tmp, procs, mounts)
    finally:
        for m in mounts:
            subprocess.run([args.shardfs, "unmount", "--lazy", str(m)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def run(args, tmp: Path, procs: list, mounts: list) -> int:
    server = subprocess.Popen(
        [sys.executable, str(REPO / "scripts/s3_local.py"), "serve", "--bucket", "bucket"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    procs.append(server)
    endpoint = server.stdout.readline().removeprefix("ready ").strip()
    make_array(tmp / "a")
    subprocess.run([sys.executable, str(REPO / "scripts/s3_local.py"), "upload",
                    "--endpoint", endpoint, "--to", "bucket/soak", str(tmp / "a")],
                   check=True, stdout=subprocess.DEVNULL)
    env = dict(os.environ, AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test",
               AWS_REGION="us-east-1", AWS_ENDPOINT_URL=endpoint, AWS_ALLOW_HTTP="true")
    env.pop("AWS_PROFILE", None)

    def mount(name: str, *opts: str) -> Path:
        m = tmp / name
        m.mkdir()
        subprocess.run([args.shardfs, "mount", "s3://bucket/soak", str(m),
                        "--log-file", str(tmp / f"{name}.log"), *opts],
                       env=env, check=True)
        mounts.append(m)
        return m

    writers = [mount("w0"), mount("w1")]
    reader = mount("r", "-o", "ro", "--ttl", "1")
    stop = threading.Event()
    last = {c: 0 for c in range(N)}  # the writer's last acknowledged sequence per chunk
    writes = [0, 0]
    failures: list[str] = []
    lock = threading.Lock()

    def write_loop(w: int) -> None:
        rnd = random.Random(w)
        seq = 0
        mine = [c for c in range(N) if c % 2 == w]
        while not stop.is_set():
            c = rnd.choice(mine)
            seq += 1
            path = writers[w] / "c" / str(c)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
                try:
                    os.write(fd, chunk_bytes(w, c, seq))
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as e:
                with lock:
                    failures.append(f"write {path}: {e}")
                continue
            with lock:
                last[c] = (w, seq)
                writes[w] += 1

    reads = [0]
    errors: dict[str, int] = {}

    def read_loop(i: int) -> None:
        rnd = random.Random(100 + i)
        while not stop.is_set():
            with lock:
                if reads[0] >= args.reads:
                    stop.set()
                    return
                reads[0] += 1
            c = rnd.randrange(N)
            path = reader / "c" / str(c)
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as e:
                name = errno.errorcode.get(e.errno, str(e.errno))
                with lock:
                    errors[name] = errors.get(name, 0) + 1
                    if len(failures) < 20:
                        failures.append(f"read {path}: {e}")
                continue
            why = check(c, data)
            if why:
                with lock:
                    errors["wrong bytes"] = errors.get("wrong bytes", 0) + 1
                    if len(failures) < 20:
                        failures.append(f"read {path}: {why}")

    started = time.monotonic()
    threads = [threading.Thread(target=write_loop, args=(w,)) for w in (0, 1)]
    threads += [threading.Thread(target=read_loop, args=(i,)) for i in range(args.readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - started
    for m in list(mounts):
        subprocess.run([args.shardfs, "unmount", str(m)], check=True)
        mounts.remove(m)
    # Every chunk as its writer last acknowledged it.
    check_dir = mount("check", "-o", "ro")
    lost = 0
    for c in range(N):
        got = (check_dir / "c" / str(c)).read_bytes()
        want = last[c]
        # A write whose fsync failed may have landed too: a later one of the same
        # writer is no loss.
        w, seq = (9, 0) if want == 0 else want
        ok = check(c, got) is None and (
            got == chunk_bytes(w, c, seq)
            or (HEADER.unpack_from(got)[0] == w and HEADER.unpack_from(got)[2] > seq))
        if not ok:
            lost += 1
            failures.append(f"chunk {c}: not the last acknowledged write {want}")
    print(f"{reads[0]} reads (each an open) in {took:.0f} s by {args.readers} threads, "
          f"{sum(writes)} writes+fsyncs by 2 mounts; read errors: {errors or 'none'}; "
          f"chunks not as last acknowledged: {lost}")
    for f in failures[:20]:
        print("  " + f)
    return 1 if failures or errors else 0


if __name__ == "__main__":
    sys.exit(main())
