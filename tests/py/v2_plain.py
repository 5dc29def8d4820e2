#!/usr/bin/env python3
"""Unsharded Zarr v3 arrays through shardfs's v2 view, against zarr-python 2.18.

    make  --store DIR      zarr-python 3 writes unsharded v3 arrays of every key
                           encoding: default '/' (2-D), default '.' (1-D), v2 '.'
                           (2-D, no compressor), 0-d, and a 3-D one in a group with
                           attributes and dimension names.
    write --mount DIR      zarr-python 2.18 reads them through a writable v2 mount,
                           checks the values, then changes them: partial writes, a
                           grow and a shrink, attributes, the 0-d value, a deleted
                           array (del group[name]) and one replaced (mode='w').
    check --store DIR      zarr-python 3 reads the store: every change is there.

Prints one line per check and "v2_plain: N passed, M failed"; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import sys
import warnings

import numpy as np

warnings.filterwarnings("ignore")

PASSED: list[str] = []
FAILED: list[str] = []


def check(what: str, good: bool, detail: object = "") -> None:
    (PASSED if good else FAILED).append(what)
    print(f"{'OK' if good else 'FAIL'} {what}{'' if good else f': {detail}'}")


def source() -> dict[str, np.ndarray]:
    return {
        "nested": np.arange(70, dtype="uint16").reshape(10, 7),
        "flat": np.arange(9, dtype="float32") / 2,
        "v2keys": np.arange(25, dtype="int32").reshape(5, 5),
        "scalar": np.array(42, dtype="int64"),
        "g/three": np.arange(60, dtype="uint8").reshape(3, 4, 5),
        "replaced": np.ones((4, 4), dtype="uint8"),
    }


def make(args) -> None:
    import zarr

    data = source()
    root = zarr.open_group(args.store, mode="w", zarr_format=3)
    dot = {"name": "default", "separator": "."}
    v2dot = {"name": "v2", "separator": "."}
    specs = {
        "nested": dict(chunks=(4, 4)),
        "flat": dict(chunks=(4,), chunk_key_encoding=dot),
        "v2keys": dict(chunks=(2, 3), chunk_key_encoding=v2dot, compressors=None),
        "scalar": dict(),
        "g/three": dict(
            chunks=(2, 2, 2), attributes={"kind": "3d"}, dimension_names=["z", "y", "x"]
        ),
        "replaced": dict(chunks=(2, 2)),
    }
    for path, arr in data.items():
        z = root.create_array(path, shape=arr.shape, dtype=arr.dtype, **specs[path])
        z[...] = arr
    print("v2_plain: made")


def write(args) -> None:
    import zarr

    data = source()
    root = zarr.open_group(args.mount, mode="a")
    for path, want in data.items():
        got = root[path][...]
        check(f"zarr 2 reads {path}", np.array_equal(got, want), got)
    three = root["g/three"]
    check(
        "attributes and dimension names",
        dict(three.attrs) == {"kind": "3d", "_ARRAY_DIMENSIONS": ["z", "y", "x"]},
        dict(three.attrs),
    )
    a = root["nested"]
    a[8:10, 5:7] = 999
    a.resize(12, 7)
    a[11, :] = 7
    a.attrs["note"] = "written by zarr 2"
    b = root["flat"]
    b[0] = -1
    b.resize(5)
    b.resize(9)  # the shrink deleted chunk 2 (past 5): its fill value comes back
    root["v2keys"][...] = 5
    root["scalar"][...] = 7
    del root["g/three"]
    zarr.open_array(
        f"{args.mount}/replaced", mode="w", shape=(3,), chunks=(2,), dtype="int16"
    )[...] = [1, 2, 3]
    check("the deleted array is gone", "three" not in root["g"], list(root["g"]))
    check("read back through the mount", np.array_equal(root["nested"][11], [7] * 7))


def expected() -> dict[str, np.ndarray]:
    e = source()
    e["nested"] = np.concatenate([e["nested"], np.zeros((2, 7), "uint16")])
    e["nested"][8:10, 5:7] = 999
    e["nested"][11, :] = 7
    flat = e["flat"].copy()
    flat[0] = -1
    flat[8:] = 0  # chunk 1 (4..7) was kept by the shrink, as zarr 2 does on plain files
    e["flat"] = flat
    e["v2keys"] = np.full((5, 5), 5, dtype="int32")
    e["scalar"] = np.array(7, dtype="int64")
    e["replaced"] = np.array([1, 2, 3], dtype="int16")
    del e["g/three"]
    return e


def check_store(args) -> None:
    import zarr

    root = zarr.open_group(args.store, mode="r")
    for path, want in expected().items():
        got = root[path][...]
        check(
            f"zarr 3 reads {path} as written",
            got.dtype == want.dtype and np.array_equal(got, want),
            got,
        )
    check("the deleted array is gone from the store", "three" not in root["g"])
    check(
        "attributes written by zarr 2",
        root["nested"].attrs.get("note") == "written by zarr 2",
        dict(root["nested"].attrs),
    )
    check(
        "the replaced array is a new (sharded) one",
        root["replaced"].shards is not None,
        root["replaced"].metadata,
    )
    check(
        "the others are still unsharded",
        all(root[p].shards is None for p in ["nested", "flat", "v2keys", "scalar"]),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, arg in [("make", "--store"), ("write", "--mount"), ("check", "--store")]:
        sub.add_parser(name).add_argument(arg, required=True)
    args = ap.parse_args()
    {"make": make, "write": write, "check": check_store}[args.cmd](args)
    print(f"v2_plain: {len(PASSED)} passed, {len(FAILED)} failed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
