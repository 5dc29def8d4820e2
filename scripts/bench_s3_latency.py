#!/usr/bin/env python3
"""Reads through a shardfs mount of S3 at real latency, against direct clients (issue 34).

Run through `scripts/bench-s3 latency [...]` (it builds the release binary, the venv and
the S3 server first).

The endpoint: s3s-fs (a fast S3 server from crates.io, serving a temporary directory:
keep-alive connections, requests served side by side), behind `scripts/s3_proxy.py`,
which adds D ms to every request's round trip. shardfs and every direct client talk to
the proxy. Two arrays, made by zarr-python 3 and written through obstore at D = 0:

* A: 4096 x 4096 uint16, 256 x 256 inner chunks (128 KiB), 2048 x 2048 shards (64
  chunks each, 4 shards), bytes + zstd;
* B: the same with 1024 x 512 inner chunks (1 MiB, 8 per shard).

Every case reads the whole array cold (a fresh mount each repetition, so the kernel's
page cache of the mount is empty; the direct clients open the array afresh), checked
equal to what was written; the median of the repetitions is printed with its ratio
against zarr-python 3 + obstore reading the bucket directly in the same run:

* direct: zarr-python 3 + obstore `[:]` (the baseline), tensorstore, zarr-python 3 +
  s3fs (where installed);
* mount: every chunk file read with Python open().read() in key order; `cp -r` of the
  array; 16 Python threads over the chunk files; zarr-python 3 `[:]` on the mount;
  zarr-python 2.18 `[:]` through a v2 view mount (`.venv-zarr2`); the key-order read
  again on the same mount once the kernel dropped the files' pages (a second pass);
* `--cache`: a fresh mount reading through a cache a first mount filled, the cache's
  files' pages dropped, against the same chunk files as plain local files read cold
  (pages dropped) and warm; zarr-python 2 on a plain local copy of the v2 view (the
  floor of the v2 case: zarr 2 decodes chunk by chunk in one thread);
* a cold chunk: a fresh mount, `stat` of the array's zarr.json, one chunk file read:
  the requests the mount made (its `.shardfs-stats`), against 3 for zarr-python + obstore
  (zarr.json, the shard index, the chunk);
* bytes moved by the mount's key-order read over the array's stored bytes.

Prints a markdown table per delay (and `--json FILE` for the raw numbers).
"""

from __future__ import annotations

import argparse
import atexit
import concurrent.futures
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr
from obstore.store import S3Store
from zarr.storage import LocalStore, ObjectStore

REPO = Path(__file__).resolve().parent.parent
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
BIN = Path(os.environ.get("SHARDFS", TARGET / "release" / "shardfs"))
S3S = Path(os.environ.get("S3S_FS", REPO / "target" / "tools" / "bin" / "s3s-fs"))
PROXY = REPO / "scripts" / "s3_proxy.py"
ZARR2_PY = REPO / ".venv-zarr2" / "bin" / "python"
BUCKET = "bench"
KEY, SECRET = "benchkey", "benchsecret"
MIB = 1 << 20

ARRAYS = {
    "A": dict(shape=(4096, 4096), chunks=(256, 256), shards=(2048, 2048)),
    "B": dict(shape=(4096, 4096), chunks=(1024, 512), shards=(2048, 2048)),
}

CHILDREN: list[subprocess.Popen] = []
MOUNTS: list[Path] = []


def cleanup() -> None:
    for m in list(MOUNTS):
        subprocess.run([str(BIN), "unmount", str(m)], capture_output=True)
        subprocess.run(["fusermount3", "-u", "-z", str(m)], capture_output=True)
    for c in CHILDREN:
        if c.poll() is None:
            c.send_signal(signal.SIGTERM)
            try:
                c.wait(timeout=10)
            except subprocess.TimeoutExpired:
                c.kill()


atexit.register(cleanup)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, what: str) -> None:
    import socket
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on {port}")


def start_server(root: Path) -> str:
    (root / BUCKET).mkdir(parents=True)
    port = free_port()
    log = open(root.parent / "s3s-fs.log", "ab")
    CHILDREN.append(subprocess.Popen(
        [str(S3S), "--host", "127.0.0.1", "--port", str(port), "--access-key", KEY,
         "--secret-key", SECRET, str(root)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log))
    wait_port(port, "s3s-fs")
    return f"http://127.0.0.1:{port}"


def start_proxy(endpoint: str, delay_ms: float) -> tuple[str, subprocess.Popen]:
    p = subprocess.Popen(
        [sys.executable, str(PROXY), "--to", endpoint.removeprefix("http://"),
         "--delay-ms", str(delay_ms)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    CHILDREN.append(p)
    line = p.stdout.readline().decode().strip()
    if not line.startswith("ready "):
        raise RuntimeError(f"latency proxy did not start: {line!r}")
    return line.split(" ", 1)[1], p


def stop(p: subprocess.Popen) -> None:
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=10)
    CHILDREN.remove(p)


def env_for(endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("AWS_SESSION_TOKEN", "AWS_PROFILE")}
    env.update(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET, AWS_REGION="us-east-1",
               AWS_ENDPOINT_URL=endpoint, AWS_ALLOW_HTTP="true")
    return env


def obstore_store(endpoint: str, prefix: str, read_only: bool = True) -> ObjectStore:
    s3 = S3Store(BUCKET, prefix=prefix, endpoint=endpoint, region="us-east-1",
                 access_key_id=KEY, secret_access_key=SECRET,
                 client_options={"allow_http": True}, virtual_hosted_style_request=False)
    return ObjectStore(s3, read_only=read_only)


def make_array(endpoint: str, name: str) -> np.ndarray:
    g = ARRAYS[name]
    rng = np.random.default_rng(34)
    # 12 bits of noise in 16: zstd stores about 3/4 of it, as with real sensor data.
    data = rng.integers(0, 4096, size=g["shape"], dtype=np.uint16)
    a = zarr.create_array(obstore_store(endpoint, name, read_only=False), shape=g["shape"],
                          chunks=g["chunks"], shards=g["shards"], dtype="uint16",
                          compressors=zarr.codecs.ZstdCodec(level=1), overwrite=True)
    a[:] = data
    return data


def stored_bytes(root: Path, name: str) -> int:
    return sum(p.stat().st_size for p in (root / BUCKET / name).rglob("*")
               if p.is_file() and not p.name.startswith("."))


class Mount:
    def __init__(self, endpoint: str, name: str, base: Path, opts: str = "ro",
                 binary: Path | None = None):
        self.bin = binary or BIN
        self.mnt = Path(tempfile.mkdtemp(dir=base, prefix="mnt-"))
        r = subprocess.run([str(self.bin), "mount", f"s3://{BUCKET}/{name}", str(self.mnt),
                            "-o", opts], env=env_for(endpoint), capture_output=True)
        if r.returncode != 0:
            raise RuntimeError(f"mount failed: {r.stderr.decode()}")
        MOUNTS.append(self.mnt)

    def stats(self) -> dict:
        return json.loads((self.mnt / ".shardfs-stats").read_bytes())["store_requests"]

    def close(self) -> None:
        r = subprocess.run([str(self.bin), "unmount", str(self.mnt)], capture_output=True)
        if r.returncode != 0:
            raise RuntimeError(f"unmount failed: {r.stderr.decode()}")
        MOUNTS.remove(self.mnt)
        self.mnt.rmdir()


def chunk_files(name: str) -> list[str]:
    g = ARRAYS[name]
    n = [s // c for s, c in zip(g["shape"], g["chunks"])]
    return [f"c/{i}/{j}" for i in range(n[0]) for j in range(n[1])]


def read_file(path: Path) -> int:
    with open(path, "rb") as f:
        return len(f.read())


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def check(got: np.ndarray, want: np.ndarray, what: str) -> None:
    if not np.array_equal(got, want):
        raise SystemExit(f"{what}: read values differ from those written")


def tensorstore_read(endpoint: str, name: str) -> np.ndarray:
    import tensorstore as ts
    spec = {"driver": "zarr3", "kvstore": {
        "driver": "s3", "bucket": BUCKET, "path": f"{name}/", "endpoint": endpoint,
        "aws_region": "us-east-1", "aws_credentials": {"type": "environment"}}}
    return ts.open(spec, read=True).result().read().result()


def s3fs_read(endpoint: str, name: str) -> np.ndarray:
    import s3fs
    from zarr.storage import FsspecStore
    fs = s3fs.S3FileSystem(key=KEY, secret=SECRET, asynchronous=True,
                           client_kwargs={"endpoint_url": endpoint, "region_name": "us-east-1"})
    return zarr.open_array(FsspecStore(fs, path=f"{BUCKET}/{name}", read_only=True))[:]


# The cases `--only` picks from (the baseline, zarr-python 3 + obstore direct, always runs).
CASES = ("tensorstore", "key", "cp", "threads", "zarr3", "cat", "zarr2", "again", "cache",
         "zarr2-local", "cold")


def run_delay(root: Path, endpoint: str, delay: float, reps: int, want: dict, base: Path,
              stored: dict, only: set[str] | None = None, before: Path | None = None) -> dict:
    """`only`: the cases to run (all when None); `before`: another shardfs binary whose
    mount cases run too, each beside the same case with this one (in turn first),
    labelled `before: ...` (before/after in the same run, on the same endpoint)."""
    def wanted(c: str) -> bool:
        return only is None or c in only

    proxy, proc = start_proxy(endpoint, delay)
    os.environ.update(env_for(proxy))  # tensorstore's credentials and endpoint
    results: dict = {}
    try:
        for name in ARRAYS:
            files = chunk_files(name)
            res: dict[str, list[float]] = {}

            def case(label: str, fn) -> None:
                res.setdefault(label, []).append(fn())

            for rep in range(reps):
                case("zarr-python 3 + obstore, direct", lambda: timed(lambda: check(
                    zarr.open_array(obstore_store(proxy, name))[:], want[name], "obstore")))
                if wanted("tensorstore"):
                    case("tensorstore, direct", lambda: timed(lambda: check(
                        tensorstore_read(proxy, name), want[name], "tensorstore")))
                try:
                    import s3fs  # noqa: F401
                    case("zarr-python 3 + s3fs, direct", lambda: timed(lambda: check(
                        s3fs_read(proxy, name), want[name], "s3fs")))
                except ImportError:
                    pass

                def through_mount(label: str, fn, opts: str = "ro", first=None,
                                  binary: Path | None = None) -> None:
                    if before is not None and binary is None:
                        # In turn first: the first of two runs in a row may be the
                        # slower, whichever binary it is.
                        pair = [(label, BIN), ("before: " + label, before)]
                        for lab, b in pair if rep % 2 == 0 else pair[::-1]:
                            through_mount(lab, fn, opts, first, b)
                        return
                    m = Mount(proxy, name, base, opts, binary)
                    try:
                        if first:
                            first(m.mnt)
                        s0 = m.stats()
                        # A case that times itself (another process) returns its time.
                        t = time.perf_counter()
                        own = fn(m.mnt)
                        case(label, lambda: own if own is not None else time.perf_counter() - t)
                        s1 = m.stats()
                        res.setdefault(label + " GETs", []).append(s1["get"] - s0["get"])
                        res.setdefault(label + " bytes", []).append(
                            s1["get_bytes"] - s0["get_bytes"])
                    finally:
                        m.close()

                if wanted("key"):
                    through_mount("mount: chunk files in key order",
                                  lambda mnt: key_order(mnt, files))
                if wanted("cp"):
                    through_mount("mount: cp -r", lambda mnt: cp_r(mnt, base))
                if wanted("threads"):
                    through_mount("mount: 16 threads over the chunk files",
                                  lambda mnt: threads16(mnt, files))
                if wanted("zarr3"):
                    through_mount("mount: zarr-python 3 [:]", lambda mnt: check(
                        zarr.open_array(LocalStore(mnt, read_only=True))[:], want[name],
                        "mount"))
                if wanted("cat"):
                    through_mount("mount: plain `cat` of the chunk files, key order",
                                  lambda mnt: cat_all(mnt, files))
                if ZARR2_PY.exists() and wanted("zarr2"):
                    through_mount("v2 mount: zarr-python 2.18 [:]",
                                  lambda mnt: zarr2_read(mnt, want[name]), "ro,format=v2")
                if wanted("again"):
                    # A second pass on the same mount once the kernel dropped the
                    # files' pages (memory pressure; a dataset read once per epoch).
                    through_mount("mount: chunk files in key order, second pass, pages "
                                  "dropped", lambda mnt: key_order(mnt, files),
                                  first=lambda mnt: (key_order(mnt, files), drop_pages(mnt)))
                if wanted("cache"):
                    cache_case(proxy, name, base, files, through_mount, case)
                if ZARR2_PY.exists() and wanted("zarr2-local"):
                    floor_case(proxy, name, base, want, case)
                if wanted("cold"):
                    cold_case(proxy, name, base, files, res)
            results[name] = {k: statistics.median(v) for k, v in res.items()}
            results[name]["stored bytes"] = stored[name]
    finally:
        stop(proc)
    return results


def cache_case(proxy: str, name: str, base: Path, files: list[str], through_mount,
               case) -> None:
    # --cache: a first mount fills it (a copy of the array read through it
    # is the plain local files beside), a fresh second mount reads through it.
    # Cold as every case is: the page cache of the cache's files (and of the
    # plain files) dropped first; the plain files are also read warm.
    cache_dir = Path(tempfile.mkdtemp(dir=base, prefix="cache-"))
    local = Path(tempfile.mkdtemp(dir=base, prefix="local-"))
    try:
        warm = Mount(proxy, name, base, f"ro,cache={cache_dir}")
        try:
            shutil.copytree(warm.mnt, local / "a")
        finally:
            warm.close()
        through_mount("mount, warm --cache: chunk files in key order",
                      lambda mnt: key_order(mnt, files),
                      f"ro,cache={cache_dir}", first=lambda _mnt: drop_pages(cache_dir))
        drop_pages(local)
        case("plain local files, page cache dropped: key order",
             lambda: timed(lambda: key_order(local / "a", files)))
        case("plain local files, page cache warm: key order",
             lambda: timed(lambda: key_order(local / "a", files)))
    finally:
        shutil.rmtree(cache_dir)
        shutil.rmtree(local)


def floor_case(proxy: str, name: str, base: Path, want: dict, case) -> None:
    # zarr-python 2 on a plain copy of the v2 view: the floor of the v2 case
    # (zarr 2 decodes chunk by chunk in one thread, whatever the files are).
    if ZARR2_PY.exists():
        local = Path(tempfile.mkdtemp(dir=base, prefix="local2-"))
        try:
            v2 = Mount(proxy, name, base, "ro,format=v2")
            try:
                shutil.copytree(v2.mnt, local / "a")
            finally:
                v2.close()
            drop_pages(local)
            case("zarr-python 2.18 [:] on plain local files (v2 copy)",
                 lambda: zarr2_read(local / "a", want[name]))
        finally:
            shutil.rmtree(local)


def cold_case(proxy: str, name: str, base: Path, files: list[str], res: dict) -> None:
    # A cold chunk: zarr.json, then one chunk file.
    m = Mount(proxy, name, base)
    try:
        before = m.stats()
        t = time.perf_counter()
        os.stat(m.mnt / "zarr.json")
        read_file(m.mnt / files[len(files) // 2 + 3])
        res.setdefault("cold chunk ms", []).append((time.perf_counter() - t) * 1e3)
        after = m.stats()
        res.setdefault("cold chunk requests", []).append(
            sum(after[k] - before[k] for k in ("get", "head", "list")))
    finally:
        m.close()


def drop_pages(root: Path) -> None:
    """Drop the page cache of every file below `root` (POSIX_FADV_DONTNEED: clean pages
    go; no root needed), so that reading them again is cold."""
    subprocess.run(["sync"], check=True)
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def key_order(mnt: Path, files: list[str]) -> None:
    for f in files:
        read_file(mnt / f)


def cp_r(mnt: Path, base: Path) -> None:
    dst = Path(tempfile.mkdtemp(dir=base, prefix="cp-"))
    try:
        subprocess.run(["cp", "-r", str(mnt), str(dst / "a")], check=True)
    finally:
        shutil.rmtree(dst)


def cat_all(mnt: Path, files: list[str]) -> None:
    subprocess.run(["cat", *files], cwd=mnt, check=True, stdout=subprocess.DEVNULL)


def threads16(mnt: Path, files: list[str]) -> None:
    with concurrent.futures.ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda f: read_file(mnt / f), files))


def zarr2_read(mnt: Path, want: np.ndarray) -> float:
    """zarr-python 2.18 in its own process, timed inside it (open_array and [:], not
    the interpreter's start and imports); returns seconds."""
    code = ("import sys, time, hashlib, numpy as np, zarr\n"
            "t = time.perf_counter()\n"
            "a = zarr.open_array(sys.argv[1], mode='r')[:]\n"
            "dt = time.perf_counter() - t\n"
            "print(dt, hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest())\n")
    out = subprocess.run([str(ZARR2_PY), "-c", code, str(mnt)], check=True,
                         capture_output=True, text=True).stdout.split()
    import hashlib
    if out[1] != hashlib.sha256(np.ascontiguousarray(want).tobytes()).hexdigest():
        raise SystemExit("zarr-python 2 through the v2 view read other values")
    return float(out[0])


def table(delay: float, results: dict) -> str:
    lines = [f"#### D = {delay:g} ms", "",
             "| read (whole array, cold; median s) | A | ratio A | B | ratio B |",
             "|---|---:|---:|---:|---:|"]
    base = "zarr-python 3 + obstore, direct"
    labels = [k for k in results["A"] if not k.endswith((" GETs", " bytes"))
              and not k.startswith(("cold chunk", "stored"))]
    for k in labels:
        row = [k]
        for name in ("A", "B"):
            v = results[name].get(k)
            b = results[name][base]
            row += ["-", "-"] if v is None else [f"{v:.3f}", f"{b / v:.2f}x"]
        lines.append("| " + " | ".join(row) + " |")
    for name in ("A", "B"):
        r = results[name]
        lines.append("")
        if "cold chunk requests" in r:
            lines.append(
                f"* {name}: a cold chunk through a fresh mount: {r['cold chunk requests']:g} "
                f"requests, {r['cold chunk ms']:.1f} ms (zarr-python + obstore: 3 requests)")
        for k in labels:
            if k + " GETs" in r:
                lines.append(
                    f"* {name}, {k}: {r[k + ' GETs']:g} GETs, "
                    f"{r[k + ' bytes'] / r['stored bytes']:.3f} bytes moved per stored byte")
        cached = r.get("mount, warm --cache: chunk files in key order")
        local = r.get("plain local files, page cache dropped: key order")
        local_warm = r.get("plain local files, page cache warm: key order")
        if cached and local:
            lines.append(
                f"* {name}: a fresh mount through a warm `--cache` (its files' pages "
                f"dropped), chunk files in key order: {cached:.3f} s, "
                f"{r['mount, warm --cache: chunk files in key order GETs']:g} GETs; the "
                f"same files as plain local files, pages dropped: {local:.3f} s, ratio "
                f"{local / cached:.2f}x (goal 0.8x); pages warm: {local_warm:.3f} s, "
                f"{local_warm / cached:.2f}x")
        floor2 = r.get("zarr-python 2.18 [:] on plain local files (v2 copy)")
        v2 = r.get("v2 mount: zarr-python 2.18 [:]")
        if floor2 and v2:
            lines.append(
                f"* {name}: zarr-python 2.18 through the v2 view {v2:.3f} s; on a plain "
                f"local copy of the same files {floor2:.3f} s (the client's own floor: "
                f"{r['zarr-python 3 + obstore, direct'] / floor2:.2f}x obstore)")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delays", default="0,10,30", help="ms added per request, comma-separated")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", type=Path, help="write the raw medians here")
    ap.add_argument("--only", help="the cases to run, comma-separated, of: "
                    + ", ".join(CASES) + " (default: all; the obstore baseline always runs)")
    ap.add_argument("--before", type=Path, metavar="BIN",
                    help="another shardfs binary (the one before a change): each mount case "
                    "also runs with it, beside this one's (in turn first), as `before: ...`")
    args = ap.parse_args()
    only = None
    if args.only:
        only = set(args.only.split(","))
        if only - set(CASES):
            raise SystemExit(f"unknown cases: {', '.join(sorted(only - set(CASES)))}")
    if args.before and not args.before.exists():
        raise SystemExit(f"{args.before} is missing")
    if os.geteuid() != 0 and not Path("/dev/fuse").exists():
        raise SystemExit("needs /dev/fuse")
    for exe in (BIN, S3S):
        if not exe.exists():
            raise SystemExit(f"{exe} is missing: run through scripts/bench-s3 latency")
    base = Path(tempfile.mkdtemp(prefix="shardfs-bench-lat-"))
    atexit.register(lambda: shutil.rmtree(base, ignore_errors=True))
    root = base / "s3"
    endpoint = start_server(root)
    want = {name: make_array(endpoint, name) for name in ARRAYS}
    stored = {name: stored_bytes(root, name) for name in ARRAYS}
    print(f"# shardfs {BIN} ({subprocess.run([str(BIN), '--version'], capture_output=True, text=True).stdout.strip()}), "
          f"{os.cpu_count()} CPUs, endpoint s3s-fs behind scripts/s3_proxy.py, "
          f"medians of {args.reps}; ratio = baseline time / this time (> 1: faster than "
          f"zarr-python 3 + obstore direct)", flush=True)
    out = {}
    for d in [float(x) for x in args.delays.split(",")]:
        out[d] = run_delay(root, endpoint, d, args.reps, want, base, stored, only, args.before)
        print(table(d, out[d]), flush=True)
        print(flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
