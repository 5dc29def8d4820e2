#!/usr/bin/env python3
"""Writes through a shardfs mount with real clients, then checks the sharded store.

  write_interop.py write --mount MNT --expect FILE.npz
      zarr-python 3 writes regions of existing sharded arrays (seen unsharded through the
      mount) and creates new arrays through the mount, unsharded (stored sharded by
      shardfs) and sharded (shown as stored while that mount lives); tensorstore does the same. The
      values every array should now hold are saved to FILE.npz.
  write_interop.py check --store STORE --expect FILE.npz
      after unmounting: zarr-python 3 and tensorstore read the store *directly* (sharded)
      and must see exactly the saved values; every written array must be sharded.
  write_interop.py view --mount MNT --expect FILE.npz
      through a later mount: every written array is shown unsharded, with those values.

Prints one line per check and `write_interop: N passed, M failed`; exits non-zero on any
failure.
"""

import argparse
import json
import os
import sys

import numpy as np
import tensorstore as ts
import zarr
import zarr.storage

RESULTS = {"passed": 0, "failed": 0}


def report(ok, what):
    RESULTS["passed" if ok else "failed"] += 1
    print(("OK " if ok else "FAIL ") + what, flush=True)


def ts_spec(path, **extra):
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": path}}
    spec.update(extra)
    return spec


def pattern(shape, seed, dtype):
    rng = np.random.default_rng(seed)
    return rng.integers(1, 1000, size=shape).astype(dtype)


def do_write(mnt, expect_path):
    expected = {}
    store = zarr.storage.LocalStore(mnt)

    # zarr-python 3: region writes into an existing sharded array (partial and whole
    # inner chunks, across shard boundaries).
    a = zarr.open_array(store=store, path="u16_default_sparse", mode="r+")
    before = a[:]
    region = (slice(1, 15), slice(2, 13))
    block = pattern((14, 11), 1, before.dtype)
    a[region] = block
    before[region] = block
    expected["u16_default_sparse"] = before
    report(np.array_equal(a[:], before), "zarr write u16_default_sparse: read-your-writes through the mount")

    # zarr-python 3 into an array whose index is at the start (rewrite-and-rename path).
    b = zarr.open_array(store=store, path="index_start", mode="r+")
    vals = b[:]
    vals[0:8, 0:6] = pattern((8, 6), 2, vals.dtype)
    b[0:8, 0:6] = vals[0:8, 0:6]
    expected["index_start"] = vals

    # zarr-python 3 creates a new array through the mount: it writes an unsharded
    # zarr.json; shardfs stores it sharded.
    new = zarr.create_array(store=store, name="made_by_zarr", shape=(37, 23), chunks=(5, 4), dtype="int32",
                            compressors=None, fill_value=0, attributes={"by": "zarr-python"})
    data = pattern((37, 23), 3, "int32")
    new[:] = data
    expected["made_by_zarr"] = data
    meta = json.load(open(os.path.join(mnt, "made_by_zarr", "zarr.json")))
    report(meta["chunk_grid"]["configuration"]["chunk_shape"] == [5, 4]
           and "sharding_indexed" not in json.dumps(meta["codecs"]),
           "zarr create made_by_zarr: the view shows the writer's unsharded metadata")

    # Attributes update through the view keeps the sharding.
    new.attrs["note"] = "updated"
    # tensorstore: region write into an existing sharded array through the view.
    t = ts.open(ts_spec(os.path.join(mnt, "index_nocrc")), open=True).result()
    vals = t.read().result()
    vals[3:17, 1:12] = pattern((14, 11), 4, vals.dtype)
    t[3:17, 1:12].write(vals[3:17, 1:12]).result()
    expected["index_nocrc"] = vals

    # tensorstore creates a new (unsharded) array through the view.
    t2 = ts.open(ts_spec(os.path.join(mnt, "made_by_ts"), create=True, dtype=ts.uint16, metadata={
        "shape": [20, 30], "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 6]}},
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "gzip", "configuration": {"level": 5}}],
    })).result()
    d2 = pattern((20, 30), 5, "uint16")
    t2.write(d2).result()
    expected["made_by_ts"] = d2
    report(np.array_equal(t2.read().result(), d2), "tensorstore create made_by_ts: read-your-writes")

    # zarr-python 3 creates a *sharded* array through the mount and writes parts of
    # shards (it reads each shard back to merge): it must read exactly its own writes,
    # through the same array object and a fresh one (issue 20, item 1).
    sh = zarr.create_array(store=store, name="sharded_by_zarr", shape=(40, 30), chunks=(5, 5),
                           shards=(10, 10), dtype="int32", fill_value=0)
    d3 = pattern((40, 30), 6, "int32")
    sh[:] = d3
    d3[3:17, 2:9] = -1
    sh[3:17, 2:9] = -1
    report(np.array_equal(sh[:], d3), "zarr create sharded_by_zarr: read-your-writes (same object)")
    again = zarr.open_array(store=store, path="sharded_by_zarr", mode="r")
    report(np.array_equal(again[:], d3), "zarr create sharded_by_zarr: read-your-writes (reopened)")
    expected["sharded_by_zarr"] = d3

    # tensorstore creates a sharded array through the mount, writes, rewrites a region.
    t3 = ts.open(ts_spec(os.path.join(mnt, "sharded_by_ts"), create=True, dtype=ts.uint16, metadata={
        "shape": [24, 16], "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8, 8]}},
        "codecs": [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [4, 4], "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]}}],
    })).result()
    d4 = pattern((24, 16), 7, "uint16")
    t3.write(d4).result()
    d4[5:11, 3:14] = 1
    t3[5:11, 3:14].write(d4[5:11, 3:14]).result()
    report(np.array_equal(t3.read().result(), d4), "tensorstore create sharded_by_ts: read-your-writes")
    expected["sharded_by_ts"] = d4

    np.savez(expect_path, **expected)


def do_view(mnt, expect_path):
    """A later mount shows every written array unsharded, with the saved values."""
    expected = np.load(expect_path)
    store = zarr.storage.LocalStore(mnt, read_only=True)
    for name in expected.files:
        meta = json.load(open(os.path.join(mnt, name, "zarr.json")))
        report("sharding_indexed" not in json.dumps(meta["codecs"]), f"later mount {name}: shown unsharded")
        got = zarr.open_array(store=store, path=name, mode="r")[:]
        report(np.array_equal(got, expected[name]), f"later mount {name}: zarr reads the saved values")


def do_check(store_dir, expect_path):
    expected = np.load(expect_path)
    store = zarr.storage.LocalStore(store_dir, read_only=True)
    for name in expected.files:
        want = expected[name]
        meta = json.load(open(os.path.join(store_dir, name, "zarr.json")))
        sharded = [c["name"] for c in meta["codecs"]] == ["sharding_indexed"]
        report(sharded, f"store {name}: stored sharded")
        try:
            got = zarr.open_array(store=store, path=name, mode="r")[:]
            report(np.array_equal(got, want), f"zarr direct read {name}")
        except Exception as e:  # noqa: BLE001 - report every failure, keep checking
            report(False, f"zarr direct read {name}: {e}")
        try:
            got = ts.open(ts_spec(os.path.join(store_dir, name)), open=True, read=True).result().read().result()
            report(np.array_equal(got, want), f"tensorstore direct read {name}")
        except Exception as e:  # noqa: BLE001
            report(False, f"tensorstore direct read {name}: {e}")
    meta = json.load(open(os.path.join(store_dir, "made_by_zarr", "zarr.json")))
    report(meta["attributes"].get("note") == "updated" and meta["attributes"].get("by") == "zarr-python",
           "store made_by_zarr: attributes written through the view")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["write", "check", "view"])
    p.add_argument("--mount")
    p.add_argument("--store")
    p.add_argument("--expect", required=True)
    args = p.parse_args()
    if args.mode == "write":
        do_write(args.mount, args.expect)
    elif args.mode == "view":
        do_view(args.mount, args.expect)
    else:
        do_check(args.store, args.expect)
    print(f"write_interop: {RESULTS['passed']} passed, {RESULTS['failed']} failed")
    sys.exit(1 if RESULTS["failed"] or not RESULTS["passed"] else 0)


if __name__ == "__main__":
    main()
