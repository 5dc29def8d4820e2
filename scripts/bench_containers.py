"""zarr-python 3 reading a bcolz carray through a read-only mount, against bcolz-zipline's
own `carray[:]` on the same rootdir, in the same run (issue 36's goal: >= 0.8x).

    .venv/bin/python scripts/bench_containers.py [--mib N] [--runs R] [--dir DIR] [--shardfs BIN]

Both decompress the same blosc frames (the mount serves them as they are stored): the
ratio measures what the mount and zarr's chunk-file reads cost on top. The page cache is
warm for both (each reads the whole array once before the timed runs); medians of R runs.
Always unmounts, also on Ctrl-C.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
import make_containers  # noqa: E402  (aliases collections.MutableMapping for bcolz)


def timed(fn, runs):
    fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir")
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(os.path.dirname(__file__), "..", "target"))
    ap.add_argument("--shardfs", default=os.path.join(target, "release", "shardfs"))
    a = ap.parse_args()

    import bcolz
    import numpy as np
    import zarr

    work = tempfile.mkdtemp(dir=a.dir, prefix="shardfs-bench-containers-")
    store, mnt = os.path.join(work, "s"), os.path.join(work, "m")
    os.makedirs(store)
    os.makedirs(mnt)
    mounted = False
    try:
        make_containers.big(store, a.mib)
        c = bcolz.open(os.path.join(store, "big"), mode="r")
        subprocess.run([a.shardfs, "mount", store, mnt, "-o", "ro"], check=True)
        mounted = True
        z = zarr.open_array(os.path.join(mnt, "big"), mode="r")
        assert np.array_equal(z[:1000], c[:1000]) and np.array_equal(z[-1000:], c[-1000:])
        t_bcolz = timed(lambda: c[:], a.runs)
        t_zarr = timed(lambda: z[:], a.runs)
        gib = c.nbytes / (1 << 30)
        print(f"carray: {c.nbytes / (1 << 20):.0f} MiB float64, chunklen {c.chunklen} "
              f"({c.chunklen * 8 / 1024:.0f} KiB chunks), "
              f"{len(os.listdir(os.path.join(store, 'big', 'data')))} chunk files, "
              f"cbytes {c.cbytes / (1 << 20):.0f} MiB, lz4 level 5 shuffle")
        print(f"bcolz-zipline carray[:]          {t_bcolz:.3f} s  {gib / t_bcolz:.2f} GiB/s")
        print(f"zarr-python 3 through the mount  {t_zarr:.3f} s  {gib / t_zarr:.2f} GiB/s")
        print(f"ratio (zarr through the mount / bcolz): {t_bcolz / t_zarr:.2f}x")
    finally:
        if mounted:
            subprocess.run([a.shardfs, "unmount", mnt])
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
