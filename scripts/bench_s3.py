#!/usr/bin/env python3
"""shardfs on object storage against zarr-python 3 on the same S3 endpoint (issue #16).

Run through `scripts/bench-s3` (it builds the release binary and the venv first).

Starts its own S3 endpoint, moto on 127.0.0.1 (`scripts/s3_local.py serve --threaded
--request-log FILE`; stopped by its pid at the end, also on errors and Ctrl-C), puts a
sharded uint8 array there (64 KiB inner chunks, 64 per shard, made by zarr-python 3 and
uploaded), and measures, each case as the median of several repetitions with its
baseline measured in the same run against the same endpoint:

* read all, cold: a fresh read-only mount (`shardfs mount s3://BUCKET/PREFIX -o ro`) per
  repetition; every chunk file read whole (open/read/close), and zarr-python 3 reading
  the whole array through the mount, against zarr-python 3 reading the sharded array
  straight from the endpoint (`zarr.storage.ObjectStore`, obstore's S3Store); and
  zarr-python 2 (the legacy client, `.venv-zarr2`) reading the array through a fresh
  mount's v2 view (`-o ro,format=v2`) against the same baseline. Goal: >= 0.8x. Metadata (zarr.json) reads are included on both sides for the zarr cases;
  the mount's start-up is not.
* requests per chunk: `shardfs stats` store_requests (GETs, GET bytes, HEADs, LISTs) of
  a full read divided by the chunks read, and of one cold chunk read (after its array's
  zarr.json was read): the bytes moved must be <= chunk + shard index + 4 KiB. The same
  for zarr-python direct, counted from the endpoint's request log.
* write chunk by chunk: every chunk of one shard written one at a time through a
  writable mount with zarr-python's file pattern (mkdir -p, write `<key>.<hex>.partial`,
  rename onto the key), then an fsync of the array's directory, which returns once the
  shard is stored on the endpoint; against zarr-python 3 writing the same chunks one at a
  time into the sharded array on the endpoint (each a read-modify-write of the shard).
  Goal: >= 10x. Both results are read back with zarr-python direct and compared.

Prints a table (case, shardfs, baseline, ratio, goal, met/MISSED) and writes it, with
the machine, into the "s3" section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.dont_write_bytecode = True  # importing benchlib.py leaves no scripts/__pycache__

import numpy as np  # noqa: E402
import zarr  # noqa: E402
from obstore.store import S3Store  # noqa: E402
from zarr.storage import ObjectStore  # noqa: E402

import benchlib  # noqa: E402  (scripts/benchlib.py: the benchmarks' shared code)
from benchlib import Geometry, RssSampler, machine_info, read_all  # noqa: E402

REPO = benchlib.REPO
BIN = benchlib.BIN
S3_LOCAL = REPO / "scripts" / "s3_local.py"
S3_PROXY = REPO / "scripts" / "s3_proxy.py"
ZARR2_PY = REPO / ".venv-zarr2" / "bin" / "python"
ZARR2_READ = (
    "import hashlib, sys, time\n"
    "import numpy as np, zarr\n"
    "t = time.perf_counter()\n"
    "a = zarr.open_array(sys.argv[1], mode='r')[:]\n"
    "dt = time.perf_counter() - t\n"
    "print(dt, hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest())\n"
)
BUCKET = "bench"
KIB, MIB = 1 << 10, 1 << 20


# ----- the endpoint ----------------------------------------------------------------


class Moto:
    """`s3_local.py serve --threaded --request-log FILE` as our child; stopped by pid.
    With `delay_ms`, every client (the mounts, zarr-python) talks to it through
    `s3_proxy.py --delay-ms` (a request latency of that many ms, as a far endpoint has);
    the set-up (uploads) and the request log do not."""

    def __init__(self, log: Path, request_log: Path, delay_ms: float = 0):
        self.request_log = request_log
        self.err = open(log, "ab")
        self.proxy: subprocess.Popen | None = None
        self.proc = subprocess.Popen(
            [sys.executable, str(S3_LOCAL), "serve", "--bucket", BUCKET, "--threaded",
             "--request-log", str(request_log)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.err,
        )
        line = self.proc.stdout.readline().decode().strip()
        if not line.startswith("ready "):
            self.stop()
            raise RuntimeError(f"moto did not start: {line!r}; see {log}")
        self.endpoint = line.split(" ", 1)[1]
        self.client_endpoint = self.endpoint
        if delay_ms:
            self.proxy = subprocess.Popen(
                [sys.executable, str(S3_PROXY), "--to", self.endpoint.removeprefix("http://"),
                 "--delay-ms", str(delay_ms)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.err)
            line = self.proxy.stdout.readline().decode().strip()
            if not line.startswith("ready "):
                self.stop()
                raise RuntimeError(f"s3_proxy did not start: {line!r}; see {log}")
            self.client_endpoint = line.split(" ", 1)[1]

    def stop(self) -> None:
        if self.proxy is not None and self.proxy.poll() is None:
            self.proxy.terminate()
            self.proxy.wait(timeout=10)
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.err.close()

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("AWS_SESSION_TOKEN", "AWS_PROFILE")}
        env.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test",
                   AWS_REGION="us-east-1", AWS_ENDPOINT_URL=self.client_endpoint,
                   AWS_ALLOW_HTTP="true")
        return env

    def store(self, prefix: str, read_only: bool = False) -> ObjectStore:
        """zarr-python 3's own S3 store for BUCKET/prefix (a fresh client)."""
        return ObjectStore(self.s3store(prefix), read_only=read_only)

    def s3store(self, prefix: str) -> S3Store:
        """obstore's S3 client for BUCKET/prefix."""
        return S3Store(BUCKET, prefix=prefix, endpoint=self.client_endpoint, access_key_id="test",
                       secret_access_key="test", region="us-east-1",
                       client_options={"allow_http": True})

    def upload(self, local: Path, prefix: str) -> None:
        subprocess.run([sys.executable, str(S3_LOCAL), "upload", "--endpoint", self.endpoint,
                        "--to", f"{BUCKET}/{prefix}", str(local)],
                       check=True, stdout=subprocess.DEVNULL)

    def mark(self) -> int:
        """Where the request log ends now (for `requests_since`)."""
        try:
            return self.request_log.stat().st_size
        except FileNotFoundError:
            return 0

    def requests_since(self, mark: int) -> dict[str, int]:
        """GETs, GET body bytes, HEADs, LISTs, PUTs and PUT count since `mark`."""
        out = {"get": 0, "get_bytes": 0, "head": 0, "list": 0, "put": 0}
        time.sleep(0.05)  # the server writes its line after the response
        with open(self.request_log, "rb") as f:
            f.seek(mark)
            for line in f.read().decode().splitlines():
                method, path, _range, _status, n = line.split("\t")
                if method == "GET" and "list-type=" in path:
                    out["list"] += 1
                elif method == "GET":
                    out["get"] += 1
                    out["get_bytes"] += int(n)
                elif method == "HEAD":
                    out["head"] += 1
                elif method in ("PUT", "POST"):
                    out["put"] += 1
        return out


# ----- the mounts ------------------------------------------------------------------

def requests(m: benchlib.Mount) -> dict[str, int]:
    """The requests the mount's store made so far (`shardfs stats`: store_requests)."""
    return m.stats()["store_requests"]


def delta(a: dict, b: dict) -> dict[str, int]:
    return {k: b[k] - a[k] for k in ("get", "get_bytes", "head", "list")}


# ----- the report ------------------------------------------------------------------


@dataclass
class Row:
    case: str
    metric: str
    shardfs: float
    baseline: float
    baseline_name: str
    higher_is_better: bool
    goal: float | None = None
    note: str = ""
    # A goal that is not a ratio (e.g. a byte limit): its text and whether it was met.
    goal_text: str | None = None
    met: bool | None = None

    @property
    def ratio(self) -> float:
        if self.shardfs == 0 or self.baseline == 0:
            return float("nan")
        return self.shardfs / self.baseline if self.higher_is_better else self.baseline / self.shardfs

    @property
    def verdict(self) -> str:
        if self.met is not None:
            return "met" if self.met else "MISSED"
        if self.goal is None:
            return ""
        return "met" if self.ratio >= self.goal else "MISSED"


def table(rows: list[Row]) -> str:
    out = ["| case | metric | shardfs | baseline | baseline is | ratio (>1: shardfs better) "
           "| goal | verdict | notes |",
           "|---|---|---:|---:|---|---:|---|---|---|"]
    for r in rows:
        goal = r.goal_text or (f"≥ {r.goal:g}×" if r.goal is not None else "")
        out.append(f"| {r.case} | {r.metric} | {benchlib.fmt(r.shardfs)} | {benchlib.fmt(r.baseline)} "
                   f"| {r.baseline_name} | {benchlib.fmt(r.ratio)}× | {goal} | {r.verdict} "
                   f"| {r.note} |")
    return "\n".join(out)


def fmt_req(r: dict, n: int) -> str:
    return (f"{r['get'] / n:.3g} GET ({r['get_bytes'] / n / KIB:,.1f} KiB), "
            f"{r['head'] / n:.3g} HEAD, {r['list'] / n:.3g} LIST")


# ----- the cases -------------------------------------------------------------------


class Bench:
    def __init__(self, args, root: Path, moto: Moto):
        self.args, self.root, self.moto = args, root, moto
        self.rows: list[Row] = []
        self.extra: list[str] = []
        self.n = 0

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    def mount(self, prefix: str, *args: str) -> benchlib.Mount:
        self.n += 1
        return benchlib.Mount(f"s3://{BUCKET}/{prefix}", self.root / "mnt" / f"m{self.n}",
                           self.root / "shardfs.log", *args, env=self.moto.env())

    def probe(self, g: Geometry) -> None:
        """The endpoint's cost of one request, as obstore sees it: a 64 KiB ranged GET and
        a whole 4 MiB-ish shard GET, one at a time (median of 20)."""
        import obstore
        s3 = self.moto.s3store("read/arr")
        key = "c/0/0"
        small, whole = [], []
        for _ in range(20):
            t = time.perf_counter()
            obstore.get_range(s3, key, start=0, length=g.chunk_bytes)
            small.append(time.perf_counter() - t)
            t = time.perf_counter()
            obstore.get(s3, key).bytes()
            whole.append(time.perf_counter() - t)
        med = statistics.median
        self.extra.append(
            f"the endpoint, one request at a time from obstore: a {g.chunk_bytes // KIB} KiB "
            f"ranged GET {med(small) * 1e3:.1f} ms, a whole shard GET "
            f"({(g.chunk_bytes * g.chunks_per_shard) / MIB:.0f} MiB) {med(whole) * 1e3:.1f} ms "
            f"(median of 20): moto's cost per request dominates, so the read times follow "
            f"the number of requests more than the bytes")
        self.log(self.extra[-1])

    def reads(self, g: Geometry) -> None:
        reps = self.args.reps
        local = self.root / "read"
        self.log(f"creating the array ({g.n_chunks} chunks of {g.chunk_bytes // KIB} KiB, "
                 f"{g.chunks_per_shard} per shard, {g.n_chunks * g.chunk_bytes / MIB:.0f} MiB) "
                 "and uploading it")
        benchlib.write_store_and_twin(local / "arr", self.root / "twin" / "arr", g, seed=1)
        self.moto.upload(local, "read")
        expect = zarr.open_array(str(local / "arr"), mode="r")[:]
        shutil.rmtree(self.root / "twin")
        rel = [f"arr/c/{i}/{j}" for i, j in g.keys()]
        self.probe(g)
        payload = g.n_chunks * g.chunk_bytes
        index_len = g.chunks_per_shard * 16 + 4

        t_files, t_zmnt, t_z2, t_direct, rss = [], [], [], [], 0
        want_sha = hashlib.sha256(np.ascontiguousarray(expect).tobytes()).hexdigest()
        req_files = req_zmnt = req_direct = None
        for r in range(reps):
            # every chunk file, fresh mount
            with self.mount("read", "-o", "ro") as m:
                paths = [str(m.mnt / p) for p in rel]
                before, mark = requests(m), self.moto.mark()
                with RssSampler(m.pid) as s:
                    t_files.append(read_all(paths, g.chunk_bytes))
                rss = max(rss, s.peak)
                got = delta(before, requests(m))
                logged = self.moto.requests_since(mark)
                if r == 0:
                    req_files = got
                    self.extra.append(
                        f"read all chunk files: shardfs stats counted {got}; the endpoint's "
                        f"log {logged}")
                    for p in (paths[0], paths[-1]):
                        i, j = map(int, p.rsplit("/", 2)[-2:])
                        ci, cj = g.chunk
                        want = expect[i * ci:(i + 1) * ci, j * cj:(j + 1) * cj].tobytes()
                        if Path(p).read_bytes() != want:
                            raise RuntimeError(f"{p} reads back wrong")
            # zarr-python 3 through a fresh mount
            with self.mount("read", "-o", "ro") as m:
                before = requests(m)
                with RssSampler(m.pid) as s:
                    t = time.perf_counter()
                    a = zarr.open_array(str(m.mnt / "arr"), mode="r", zarr_format=3)[:]
                    t_zmnt.append(time.perf_counter() - t)
                rss = max(rss, s.peak)
                if r == 0:
                    req_zmnt = delta(before, requests(m))
                    if not np.array_equal(a, expect):
                        raise RuntimeError("zarr-python through the mount reads wrong")
            # zarr-python 2 through a fresh mount's v2 view (the legacy client: it reads
            # the chunk files one after another)
            with self.mount("read", "-o", "ro,format=v2") as m:
                with RssSampler(m.pid) as s:
                    out = subprocess.run(
                        [str(ZARR2_PY), "-c", ZARR2_READ, str(m.mnt / "arr")],
                        check=True, capture_output=True, text=True).stdout.split()
                t_z2.append(float(out[0]))
                rss = max(rss, s.peak)
                if out[1] != want_sha:
                    raise RuntimeError("zarr-python 2 through the v2 view reads wrong")
            # zarr-python 3 direct, a fresh client
            mark = self.moto.mark()
            t = time.perf_counter()
            a = zarr.open_array(self.moto.store("read/arr", read_only=True), mode="r",
                                zarr_format=3)[:]
            t_direct.append(time.perf_counter() - t)
            if r == 0:
                req_direct = self.moto.requests_since(mark)
                if not np.array_equal(a, expect):
                    raise RuntimeError("zarr-python direct reads wrong")
            self.log(f"read rep {r + 1}/{reps}: files {t_files[-1]:.3f} s, zarr via mount "
                     f"{t_zmnt[-1]:.3f} s, zarr 2 via v2 view {t_z2[-1]:.3f} s, zarr direct "
                     f"{t_direct[-1]:.3f} s")
        med = statistics.median
        mib = payload / MIB
        note = (f"{g.n_chunks} chunks of {g.chunk_bytes // KIB} KiB, {mib:.0f} MiB; cold: a "
                f"fresh mount each rep; daemon peak RssAnon {rss / MIB:.0f} MiB")
        self.rows.append(Row("read all chunk files (open/read/close each) vs zarr-python "
                             "direct [:]", "MiB/s", mib / med(t_files), mib / med(t_direct),
                             "zarr-python 3 + obstore, direct", True, 0.8, note))
        self.rows.append(Row("zarr-python 3 [:] through the mount vs direct", "MiB/s",
                             mib / med(t_zmnt), mib / med(t_direct),
                             "zarr-python 3 + obstore, direct", True, 0.8, note))
        self.rows.append(Row("zarr-python 2 [:] through the mount's v2 view vs zarr-python 3 "
                             "direct", "MiB/s", mib / med(t_z2), mib / med(t_direct),
                             "zarr-python 3 + obstore, direct", True, 0.8,
                             note + "; zarr-python 2.18 in its own process, timed inside it "
                             "(open_array and [:])"))
        n = g.n_chunks
        self.rows.append(Row("requests per chunk, read all chunk files", "GETs/chunk",
                             req_files["get"] / n, req_direct["get"] / n,
                             "zarr-python direct [:] (endpoint log)", False, None,
                             f"shardfs: {fmt_req(req_files, n)}; zarr-python direct: "
                             f"{fmt_req(req_direct, n)}; zarr-python through the mount: "
                             f"{fmt_req(req_zmnt, n)}"))
        self.rows.append(Row("bytes moved per chunk byte, read all chunk files", "bytes/byte",
                             req_files["get_bytes"] / payload, req_direct["get_bytes"] / payload,
                             "zarr-python direct [:] (endpoint log)", False, None,
                             "GET body bytes / chunk bytes read"))
        self.rows.append(Row("bytes moved per chunk byte, zarr-python 3 [:] through the mount",
                             "bytes/byte", req_zmnt["get_bytes"] / payload,
                             req_direct["get_bytes"] / payload,
                             "zarr-python direct [:] (endpoint log)", False, None,
                             "zarr-python reads the chunk files concurrently: above 1, "
                             "read-ahead windows of one shard were fetched more than once"))

        # one cold chunk: a chunk in the middle of the last shard
        i, j = g.grid[0] - 1 - g.per_shard[0] // 2, g.grid[1] - 1 - g.per_shard[1] // 2
        ci, cj = g.chunk
        want = expect[i * ci:(i + 1) * ci, j * cj:(j + 1) * cj].tobytes()
        one_m, one_d, lat_m, lat_d = [], [], [], []
        for _ in range(reps):
            with self.mount("read", "-o", "ro") as m:
                (m.mnt / "arr" / "zarr.json").read_bytes()
                before = requests(m)
                t = time.perf_counter()
                got = (m.mnt / "arr" / "c" / str(i) / str(j)).read_bytes()
                lat_m.append(time.perf_counter() - t)
                one_m.append(delta(before, requests(m)))
                if got != want:
                    raise RuntimeError(f"chunk {i}/{j} reads back wrong")
            a = zarr.open_array(self.moto.store("read/arr", read_only=True), mode="r",
                                zarr_format=3)
            mark = self.moto.mark()
            t = time.perf_counter()
            v = a[i * ci:(i + 1) * ci, j * cj:(j + 1) * cj]
            lat_d.append(time.perf_counter() - t)
            one_d.append(self.moto.requests_since(mark))
            if v.tobytes() != want:
                raise RuntimeError("zarr-python direct reads the chunk wrong")
        worst = max(one_m, key=lambda x: x["get_bytes"])
        limit = g.chunk_bytes + index_len + 4 * KIB
        ok = worst["get_bytes"] <= limit
        self.rows.append(Row("one cold chunk read (after zarr.json)", "bytes moved",
                             worst["get_bytes"], max(x["get_bytes"] for x in one_d),
                             "zarr-python direct, one chunk (endpoint log)", False, None,
                             f"shardfs {worst['get']} GET, {worst['head']} HEAD, "
                             f"{worst['list']} LIST (worst of {reps}); zarr-python "
                             f"{one_d[0]['get']} GET; limit chunk + index + 4 KiB = "
                             f"{g.chunk_bytes:,} + {index_len:,} + 4,096 = {limit:,} B",
                             goal_text=f"shardfs ≤ {limit:,} B", met=ok))
        self.rows.append(Row("one cold chunk read (after zarr.json): latency", "ms",
                             statistics.median(lat_m) * 1e3, statistics.median(lat_d) * 1e3,
                             "zarr-python direct a[chunk] (array opened)", False, None,
                             f"shardfs: {worst['get'] + worst['head'] + worst['list']} "
                             f"requests in a row ({worst['list']} LIST, {worst['head']} HEAD "
                             f"for the lookups, {worst['get']} GET: the index, the chunk); "
                             f"zarr-python: "
                             f"{one_d[0]['get']} (index, chunk)"))
        self.log(f"one cold chunk: shardfs {one_m}, limit {limit}; zarr direct {one_d[0]}")
        self.oneverdict = ok

    def writes(self, g: Geometry) -> None:
        reps = self.args.write_reps
        one = Geometry(g.name, g.chunk, g.per_shard, (1, 1))
        rng = np.random.default_rng(3)
        block = rng.integers(0, 256, one.shape, dtype=np.uint8)
        ci, cj = g.chunk
        keys = one.keys()
        slices = [(slice(i * ci, (i + 1) * ci), slice(j * cj, (j + 1) * cj)) for i, j in keys]
        files = [(f"c/{i}/{j}", np.ascontiguousarray(block[s]).tobytes())
                 for (i, j), s in zip(keys, slices)]
        self.log(f"write: creating {2 * reps} empty one-shard arrays on the endpoint")
        for r in range(reps):
            for n in ("via", "direct"):
                zarr.create_array(store=self.moto.store(f"w/{n}{r}"), shape=one.shape,
                                  dtype="uint8", chunks=one.chunk, shards=one.shard_shape,
                                  compressors=None, filters=None, fill_value=0, zarr_format=3,
                                  overwrite=True)

        def put_files(arr: Path) -> None:
            for key, data in files:
                path = arr / key
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{uuid.uuid4().hex}.partial")
                with tmp.open("wb") as f:
                    f.write(data)
                tmp.replace(path)

        t_mnt, t_staged, t_direct, rss, reqs = [], [], [], 0, []
        for r in range(reps):
            with self.mount("w") as m:
                arr = m.mnt / f"via{r}"
                (arr / "zarr.json").read_bytes()
                mark = self.moto.mark()
                with RssSampler(m.pid) as s:
                    t = time.perf_counter()
                    put_files(arr)
                    t_staged.append(time.perf_counter() - t)
                    fd = os.open(arr, os.O_RDONLY | os.O_DIRECTORY)
                    os.fsync(fd)  # returns once the shard is stored on the endpoint
                    os.close(fd)
                    t_mnt.append(time.perf_counter() - t)
                rss = max(rss, s.peak)
                reqs.append(("mount", self.moto.requests_since(mark)))
            a = zarr.open_array(self.moto.store(f"w/direct{r}"), mode="r+", zarr_format=3)
            mark = self.moto.mark()
            t = time.perf_counter()
            for s_ in slices:
                a[s_] = block[s_]
            t_direct.append(time.perf_counter() - t)
            reqs.append(("direct", self.moto.requests_since(mark)))
            for n in (f"via{r}", f"direct{r}"):
                back = zarr.open_array(self.moto.store(f"w/{n}", read_only=True), mode="r",
                                       zarr_format=3)[:]
                if not np.array_equal(back, block):
                    raise RuntimeError(f"w/{n}: the shard reads back wrong (zarr direct)")
            self.log(f"write rep {r + 1}/{reps}: mount {t_mnt[-1]:.3f} s (staged "
                     f"{t_staged[-1]:.3f} s), zarr direct {t_direct[-1]:.3f} s; both read "
                     "back equal")
        med = statistics.median
        rm = next(x for k, x in reqs if k == "mount")
        rd = next(x for k, x in reqs if k == "direct")
        note = (f"{one.n_chunks} chunks of {g.chunk_bytes // KIB} KiB into one shard; the "
                f"final fsync (shard stored) included; endpoint requests: mount {rm['put']} "
                f"PUT, {rm['get']} GET; zarr-python {rd['put']} PUT, {rd['get']} GET "
                f"({rd['get_bytes'] / MIB:.1f} MiB); both read back equal; daemon peak "
                f"RssAnon {rss / MIB:.0f} MiB")
        self.rows.append(Row("write chunk by chunk (tmp + rename, then fsync)", "s",
                             med(t_mnt), med(t_direct),
                             "zarr-python 3 + obstore, arr[i, j] = ... direct", False, 10.0,
                             note))
        self.extra.append(f"write chunk by chunk: the mount's time until the last rename "
                          f"returned (chunks staged, before the fsync): {med(t_staged):.3f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: a smaller array, fewer repetitions")
    ap.add_argument("--reps", type=int, default=None, help="repetitions of each read case")
    ap.add_argument("--write-reps", type=int, default=None,
                    help="repetitions of the write case")
    ap.add_argument("--shards", type=int, default=None,
                    help="shards of 64 x 64 KiB chunks in the read array (default 4; quick 2)")
    ap.add_argument("--section", default="s3",
                    help="section of docs/BENCHMARKS.md to write (default: s3)")
    ap.add_argument("--title", default=None, help="heading of that section")
    ap.add_argument("--no-doc", action="store_true", help="do not touch docs/BENCHMARKS.md")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--only", default="reads,writes", help="reads, writes or both")
    ap.add_argument("--delay-ms", type=float, default=0,
                    help="request latency added in front of the endpoint for every client "
                         "(scripts/s3_proxy.py; default 0: none)")
    args = ap.parse_args()
    args.reps = args.reps or (2 if args.quick else 5)
    args.write_reps = args.write_reps or (1 if args.quick else 3)
    per = (4, 4) if args.quick else (8, 8)
    g = Geometry("64KiB", (256, 256), per, (1, args.shards or (2 if args.quick else 4)))
    only = set(args.only.split(","))

    if os.geteuid() != 0:
        print("bench-s3: run as root (mounting)", file=sys.stderr)
        return 2
    if not BIN.exists():
        print(f"bench-s3: {BIN} missing; run scripts/bench-s3 (it builds it)", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="shardfs-bench-s3-"))
    moto: Moto | None = None

    def on_signal(sig, _frame):
        raise KeyboardInterrupt(f"signal {sig}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    atexit.register(benchlib.cleanup_mounts)
    if not args.keep:
        atexit.register(lambda: shutil.rmtree(root, ignore_errors=True))
    machine = machine_info(root)
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    try:
        moto = Moto(root / "moto.log", root / "requests.log", args.delay_ms)
        atexit.register(moto.stop)
        b = Bench(args, root, moto)
        b.log(f"moto at {moto.endpoint}; data in {root}")
        if "reads" in only:
            b.reads(g)
        if "writes" in only:
            b.writes(g)
    except KeyboardInterrupt:
        print("bench-s3: interrupted; unmounting", file=sys.stderr)
        return 130
    finally:
        benchlib.cleanup_mounts()
        if moto is not None:
            moto.stop()
    elapsed = time.monotonic() - t0

    cmd = "scripts/bench-s3" + "".join(f" {a}" for a in sys.argv[1:])
    m = machine
    body = (
        f"`{cmd}` — {m['date']}, commit {m['commit']}, {elapsed / 60:.1f} min.\n"
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM, kernel "
        f"{m['kernel']}; load average (1 min) {load0:.2f} at the start, "
        f"{os.getloadavg()[0]:.2f} at the end. Endpoint: moto {moto_version()} on 127.0.0.1 (threaded, one "
        f"writer at a time), on the same machine as the client, so its CPU time competes "
        f"with both sides"
        + (f"; every client's requests through scripts/s3_proxy.py adding "
           f"{args.delay_ms:g} ms each" if args.delay_ms else "")
        + f". Baseline: zarr-python {zarr.__version__} with "
        f"zarr.storage.ObjectStore (obstore {obstore_version()}), same endpoint, same run. "
        f"Medians of {args.reps} runs (writes: {args.write_reps}); ratio > 1 means "
        f"shardfs is better (throughput ratio, or baseline / shardfs for times and "
        f"counts).\n\n"
        + table(b.rows)
        + ("\n\n" + "\n".join(f"* {e}" for e in b.extra) if b.extra else "")
        + "\n"
    )
    print()
    print(body)
    if not args.no_doc:
        title = args.title or f"Object storage: `scripts/bench-s3` ({m['date'][:10]})"
        print(f"written to {benchlib.write_doc(args.section, title, body)}", file=sys.stderr)
    return 0


def moto_version() -> str:
    from importlib.metadata import version
    return version("moto")


def obstore_version() -> str:
    from importlib.metadata import version
    return version("obstore")


if __name__ == "__main__":
    sys.exit(main())
