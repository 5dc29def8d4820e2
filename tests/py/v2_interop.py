#!/usr/bin/env python3
"""Zarr v2 clients against shardfs's v2 view, and the 2022 draft layout.

Each subcommand runs under the Python that has the library it needs; the
results travel between them as .npz files (array path with '/' -> '__').

    read    --root DIR --out F.npz [--draft]
            Read every array of the hierarchy at DIR with whatever zarr is
            installed (zarr-python 2.18 for a v2 mount, 3 for a v3 mount or a
            store). --draft: DIR is a store of the 2022 draft layout, read
            directly with zarr-python 2.18's experimental v3 API.
    compare --want F.npz --got G.npz [--expect a,b,c] [--subset]
            The arrays of G equal those of F (NaN-aware, same dtype values)
            for every path in --expect (default: every path of F), and G has
            exactly those paths (with --subset: at least those).
    write   --mount DIR --out F.npz
            zarr-python 2.18 writes through a v2 mount: new arrays (gzip,
            zstd, blosc; C and F order; big-endian; nested and flat keys; a
            nested group), partial overwrites of an existing array,
            attributes, a resize. The values it expects are saved to F.
    check   --store DIR --want F.npz
            zarr-python 3 and tensorstore read the arrays of F directly from
            the (unmounted) store: each must be a sharded v3 array with the
            expected values (and attributes, for the ones written).

Prints one line per array and "v2_interop: N passed, M failed"; exits 1 on
any failure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

import numpy as np

warnings.filterwarnings("ignore")

FAILED = []
PASSED = []


def ok(msg: str) -> None:
    PASSED.append(msg)
    print(f"OK {msg}")


def fail(msg: str) -> None:
    FAILED.append(msg)
    print(f"FAIL {msg}")


def key(path: str) -> str:
    return path.replace("/", "__")


def same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape:
        return False
    nan = a.dtype.kind in "fc" and b.dtype.kind in "fc"
    return bool(np.array_equal(a, b, equal_nan=nan))


def read(args) -> None:
    if args.draft:
        os.environ["ZARR_V3_EXPERIMENTAL_API"] = "1"
        os.environ["ZARR_V3_SHARDING"] = "1"
    import zarr

    if args.draft:
        from zarr._storage.v3 import DirectoryStoreV3

        root = zarr.open_group(store=DirectoryStoreV3(args.root), path="/", mode="r",
                               zarr_version=3)
    else:
        root = zarr.open_group(args.root, mode="r")
    found = {}
    attrs = {}

    def walk(g, prefix):
        for name, a in g.arrays():
            found[key(prefix + name)] = a[...]
            attrs[prefix + name] = dict(a.attrs)
        for name, sub in g.groups():
            walk(sub, prefix + name + "/")

    walk(root, "")
    np.savez(args.out, **found)
    with open(args.out + ".attrs.json", "w") as f:
        json.dump(attrs, f, sort_keys=True, default=str)
    print(f"read {len(found)} arrays with zarr {zarr.__version__}: "
          + ", ".join(sorted(k.replace('__', '/') for k in found)))
    if not found:
        fail("no arrays found")


def compare(args) -> None:
    want = np.load(args.want)
    got = np.load(args.got)
    expect = (set(key(p) for p in args.expect.split(",") if p) if args.expect is not None
              else set(want.files))
    if not (expect <= set(got.files) if args.subset else set(got.files) == expect):
        fail(f"arrays: got {sorted(got.files)}, expected {sorted(expect)}")
    for k in sorted(expect & set(got.files)):
        if k not in want.files:
            fail(f"{k}: not in {args.want}")
        elif same(want[k], got[k]):
            ok(f"{k.replace('__', '/')} {got[k].dtype} {list(got[k].shape)}")
        else:
            fail(f"{k.replace('__', '/')}: values differ ({want[k].dtype} vs {got[k].dtype})")


def write(args) -> None:
    import numcodecs
    import zarr

    m = args.mount
    exp = {}
    attrs = {}
    root = zarr.open_group(m, mode="a")

    a = root.create_dataset("w_gzip", shape=(50, 30), chunks=(8, 7), dtype="<i4",
                            compressor=numcodecs.GZip(3), fill_value=-5)
    a[:] = np.arange(1500, dtype="<i4").reshape(50, 30)
    a[49, 29] = 12345
    exp["w_gzip"] = a[...]

    grp = root.require_group("w_grp")
    grp.attrs["made_by"] = "zarr 2"
    b = grp.create_dataset("zstd_be", shape=(21,), chunks=(4,), dtype=">f8",
                           compressor=numcodecs.Zstd(2), fill_value=float("nan"))
    b[3:17] = np.linspace(0, 1, 14)
    exp["w_grp/zstd_be"] = b[...]

    c = zarr.open_array(m + "/w_fortran", mode="w", shape=(9, 10), chunks=(2, 3),
                        dtype="<u2", order="F", dimension_separator="/",
                        compressor=numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE))
    c[2:7, 1:9] = np.arange(40, dtype="<u2").reshape(5, 8)
    c.attrs["note"] = "written by zarr 2"
    c.attrs["_ARRAY_DIMENSIONS"] = ["y", "x"]
    exp["w_fortran"] = c[...]
    attrs["w_fortran"] = {"note": "written by zarr 2"}

    d = root.create_dataset("w_plain", shape=(7, 5), chunks=(3, 3), dtype="|u1",
                            compressor=None, fill_value=9)
    d[1:6, 1:4] = 200
    d.resize(9, 5)
    d[8, :] = 1
    exp["w_plain"] = d[...]

    # Shrink, then grow: zarr 2 writes the smaller .zarray, then deletes the chunks
    # outside it; their old bytes must not come back with the grow (issue 20, item 5).
    g = root.create_dataset("w_shrink", shape=(12, 12), chunks=(4, 4), dtype="<i2",
                            compressor=None, fill_value=0)
    g[:] = 5
    g.resize(4, 4)
    g.resize(12, 12)
    shrunk = np.zeros((12, 12), "<i2")
    shrunk[:4, :4] = 5
    if not same(g[...], shrunk):
        fail("w_shrink: shrink then grow brought old chunks back")
    exp["w_shrink"] = g[...]

    # Deleting arrays and groups, as zarr 2 does it (a recursive removal of the
    # directory whose listing was taken first), and overwrite=True (item 4).
    h = root.create_dataset("w_del", shape=(8, 8), chunks=(4, 4), dtype="u1", compressor=None)
    h[:] = 1
    h.attrs["a"] = 1
    del root["w_del"]
    if "w_del" in root or os.path.exists(os.path.join(m, "w_del")):
        fail("w_del: still there after del")
    sub = root.create_group("w_delgrp")
    sub.attrs["x"] = 1
    sub.create_dataset("a", shape=(4,), chunks=(2,), dtype="u1")[:] = 3
    del root["w_delgrp"]
    if "w_delgrp" in root or os.path.exists(os.path.join(m, "w_delgrp")):
        fail("w_delgrp: still there after del")
    o = root.create_dataset("w_over", shape=(8, 8), chunks=(4, 4), dtype="u1", compressor=None)
    o[:] = 2
    o.attrs["old"] = True
    o = root.create_dataset("w_over", shape=(6,), chunks=(3,), dtype="<f4", overwrite=True,
                            compressor=None, fill_value=0)
    o[:] = 1.5
    if dict(o.attrs):
        fail(f"w_over: attributes of the overwritten array survived: {dict(o.attrs)}")
    exp["w_over"] = o[...]

    # zlib and bz2, the compressors zarr 2 users pick besides Blosc: stored under
    # their numcodecs.* v3 names, which zarr-python 3 reads (issue 20, item 6).
    for name, comp in [("w_zlib", numcodecs.Zlib(4)), ("w_bz2", numcodecs.BZ2(9))]:
        z = root.create_dataset(name, shape=(10, 9), chunks=(4, 4), dtype="<u4", compressor=comp)
        z[:] = np.arange(90, dtype="<u4").reshape(10, 9)
        exp[name] = z[...]

    # A 1-D array in Fortran order keeps its order (issue 20, item 7).
    f1 = zarr.open_array(m + "/w_f1d", mode="w", shape=(10,), chunks=(4,), dtype="<i4", order="F")
    f1[:] = np.arange(10, dtype="<i4")
    if zarr.open_array(m + "/w_f1d", mode="r").order != "F":
        fail("w_f1d: order F of a 1-D array reads back as C")
    exp["w_f1d"] = f1[...]

    # numpy's fixed-length bytes (xarray writes a variable of short byte strings so):
    # zarr-python 3's null_terminated_bytes, its fill value base64 in both; read back
    # through the .zarray the view makes of it. Before, the view refused it (EINVAL).
    sb = root.create_dataset("w_bytes", shape=(5,), chunks=(2,), dtype="|S4", fill_value=b"ab",
                             compressor=numcodecs.Zlib(1))
    sb[:3] = np.array([b"x", b"abcd", b""], dtype="|S4")
    want_bytes = np.array([b"x", b"abcd", b"", b"ab", b"ab"], dtype="|S4")
    back = zarr.open_array(m + "/w_bytes", mode="r")
    if back.dtype != np.dtype("|S4") or back.fill_value != b"ab" or not same(back[...], want_bytes):
        fail(f"w_bytes: read back as {back.dtype} fill {back.fill_value!r}: {back[...]!r}")
    exp["w_bytes"] = want_bytes

    # An array that was there before: partial overwrite and attributes.
    if "inner_gzip" in root:
        e = root["inner_gzip"]
        e[0:5, 0:5] = -7
        e.attrs["touched"] = True
        exp["inner_gzip"] = e[...]
        attrs["inner_gzip"] = {"touched": True}

    np.savez(args.out, **{key(k): v for k, v in exp.items()})
    with open(args.out + ".attrs.json", "w") as f:
        json.dump(attrs, f)
    for k, v in exp.items():
        ok(f"wrote {k} {v.dtype} {list(v.shape)}")


def check(args) -> None:
    import tensorstore as ts
    import zarr

    want = np.load(args.want)
    attrs = json.load(open(args.want + ".attrs.json"))
    for k in want.files:
        path = k.replace("__", "/")
        full = os.path.join(args.store, path)
        try:
            meta = json.load(open(os.path.join(full, "zarr.json")))
            if meta["codecs"][0]["name"] != "sharding_indexed":
                fail(f"{path}: not stored sharded: {meta['codecs']}")
                continue
            z = zarr.open_array(full, mode="r")
            if any(c["name"].startswith("numcodecs.")
                   for c in meta["codecs"][0]["configuration"]["codecs"]):
                # tensorstore does not know the numcodecs.* codecs (shardfs info says so),
                # nor zarr-python 3's null_terminated_bytes.
                t = z[...]
            else:
                t = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": full}},
                            open=True).result().read().result()
            if not same(want[k], z[...]):
                fail(f"{path}: zarr-python 3 reads other values")
            elif not same(want[k], t):
                fail(f"{path}: tensorstore reads other values")
            else:
                ok(f"{path} sharded {meta['chunk_grid']['configuration']['chunk_shape']}: "
                   "zarr-python 3 and tensorstore read the written values")
            for a, v in attrs.get(path, {}).items():
                if z.attrs.get(a) != v:
                    fail(f"{path}: attribute {a} is {z.attrs.get(a)!r}, not {v!r}")
            if path == "w_fortran" and meta.get("dimension_names") != ["y", "x"]:
                fail(f"{path}: dimension_names {meta.get('dimension_names')}")
        except Exception as e:  # noqa: BLE001 - report, then go on
            fail(f"{path}: {type(e).__name__}: {e}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("read")
    r.add_argument("--root", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--draft", action="store_true")
    c = sub.add_parser("compare")
    c.add_argument("--want", required=True)
    c.add_argument("--got", required=True)
    c.add_argument("--expect")
    c.add_argument("--subset", action="store_true")
    w = sub.add_parser("write")
    w.add_argument("--mount", required=True)
    w.add_argument("--out", required=True)
    k = sub.add_parser("check")
    k.add_argument("--store", required=True)
    k.add_argument("--want", required=True)
    args = p.parse_args()
    {"read": read, "compare": compare, "write": write, "check": check}[args.cmd](args)
    print(f"v2_interop: {len(PASSED)} passed, {len(FAILED)} failed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
