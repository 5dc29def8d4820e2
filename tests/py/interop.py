#!/usr/bin/env python3
"""Check a shardfs mount against its sharded source store with zarr-python and tensorstore.

    .venv/bin/python tests/py/interop.py --store STORE --mount MOUNTPOINT [--json]

For every array node under STORE (a directory whose zarr.json has
node_type == "array"):

* meta:        MOUNT/<path>/zarr.json must equal STORE's with, for a sharded
               array, chunk_grid.configuration.chunk_shape replaced by the
               innermost chunk shape and codecs by the innermost codec chain
               (no sharding_indexed left); a non-sharded array's zarr.json
               must be byte-identical.  zarr-python must report the mounted
               array unsharded (.shards is None) with .chunks == the
               innermost chunk shape.
* zarr:        zarr-python 3 reads the whole array from STORE and from MOUNT;
               the results must be equal (NaN-aware for floats).
* tensorstore: the same with tensorstore's zarr3 driver.

Group zarr.json files must be byte-identical in the mount, and the mount must
hold the same array/group nodes as the store.  Everything is opened read-only.

One line per check: "OK <check> <path> ..." or "FAIL <check> <path>: reason",
then "interop: N passed, M failed".  Exit status 0 only if nothing failed and
at least one array was compared.  With --json a JSON report is printed on
stdout and the lines go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
import warnings
from pathlib import Path

import numpy as np
import tensorstore as ts
import zarr

warnings.filterwarnings("ignore", category=UserWarning, module=r"zarr\..*")


def find_nodes(root: Path) -> dict[str, dict]:
    """{relative path ('' = root): parsed zarr.json} for all v3 nodes under root."""
    nodes = {}
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        if "zarr.json" not in files:
            continue
        rel = os.path.relpath(dirpath, root)
        rel = "" if rel == "." else rel.replace(os.sep, "/")
        try:
            meta = json.loads(Path(dirpath, "zarr.json").read_bytes())
        except (OSError, ValueError):
            continue
        if not isinstance(meta, dict) or meta.get("zarr_format") != 3:
            continue
        nodes[rel] = meta
        if meta.get("node_type") == "array":
            dirs[:] = []  # chunk directories below an array hold no nodes
    return nodes


def split_sharding(meta: dict):
    """-> (number of sharding levels, innermost chunk shape, innermost codecs)."""
    shape = list(meta["chunk_grid"]["configuration"]["chunk_shape"])
    codecs = meta["codecs"]
    levels = 0
    while len(codecs) == 1 and codecs[0]["name"] == "sharding_indexed":
        conf = codecs[0]["configuration"]
        shape, codecs = list(conf["chunk_shape"]), conf["codecs"]
        levels += 1
    return levels, shape, codecs


def expected_view_metadata(meta: dict) -> dict:
    levels, shape, codecs = split_sharding(meta)
    if not levels:
        return meta
    out = json.loads(json.dumps(meta))
    out["chunk_grid"]["configuration"]["chunk_shape"] = shape
    out["codecs"] = codecs
    return out


def has_sharding(obj) -> bool:
    if isinstance(obj, dict):
        return obj.get("name") == "sharding_indexed" or any(has_sharding(v) for v in obj.values())
    if isinstance(obj, list):
        return any(has_sharding(v) for v in obj)
    return False


def same_data(a: np.ndarray, b: np.ndarray) -> str | None:
    """None if equal, else a reason."""
    if a.shape != b.shape:
        return f"shape {b.shape} != {a.shape}"
    if a.dtype != b.dtype:
        return f"dtype {b.dtype} != {a.dtype}"
    nan = a.dtype.kind in "fc"
    if not np.array_equal(a, b, equal_nan=nan):
        neq = ~((a == b) | (np.isnan(a) & np.isnan(b))) if nan else a != b
        where = np.argwhere(neq)
        first = tuple(int(i) for i in where[0]) if where.size else ()
        return f"{int(neq.sum())} elements differ, first at {first}"
    return None


def zarr_read(root: Path, path: str):
    store = zarr.storage.LocalStore(root, read_only=True)
    arr = zarr.open_array(store=store, path=path, mode="r")
    return arr, np.asarray(arr[...])


def ts_read(root: Path, path: str) -> np.ndarray:
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root / path) if path else str(root)}}
    arr = ts.open(spec, read=True).result()
    return np.asarray(arr.read().result())


class Report:
    def __init__(self, json_mode: bool):
        self.results = []
        self.out = sys.stderr if json_mode else sys.stdout

    def add(self, ok: bool, check: str, path: str, detail: str):
        self.results.append({"ok": ok, "check": check, "path": path, "detail": detail})
        shown = path or "/"
        line = f"OK {check} {shown} {detail}" if ok else f"FAIL {check} {shown}: {detail}"
        print(line.rstrip(), file=self.out, flush=True)

    def run(self, check: str, path: str, fn):
        try:
            err, detail = fn()
        except Exception as e:  # report every library failure as a FAIL line
            tb = traceback.format_exception_only(type(e), e)[-1].strip()
            self.add(False, check, path, f"{tb}")
            return
        self.add(err is None, check, path, detail if err is None else err)


def check_meta(store: Path, mount: Path, path: str, meta: dict):
    raw_direct = (store / path / "zarr.json").read_bytes()
    raw_mount = (mount / path / "zarr.json").read_bytes()
    mmeta = json.loads(raw_mount)
    levels, inner_shape, _ = split_sharding(meta)
    if not levels:
        if raw_mount != raw_direct:
            return "non-sharded zarr.json is not byte-identical", ""
        detail = "passthrough (byte-identical)"
    else:
        if has_sharding(mmeta):
            return "mounted zarr.json still contains a sharding_indexed codec", ""
        want = expected_view_metadata(meta)
        if mmeta != want:
            diff = sorted(k for k in set(want) | set(mmeta) if want.get(k) != mmeta.get(k))
            return f"mounted zarr.json differs from the expected unsharded metadata in {diff}", ""
        detail = f"unsharded chunk_shape={inner_shape} levels={levels}"
    m = zarr.open_array(store=zarr.storage.LocalStore(mount, read_only=True), path=path, mode="r")
    if m.shards is not None:
        return f"zarr reports mounted array as sharded (shards={m.shards})", ""
    if list(m.chunks) != inner_shape:
        return f"zarr reports mounted chunks={m.chunks}, expected {tuple(inner_shape)}", ""
    if levels:
        d = zarr.open_array(store=zarr.storage.LocalStore(store, read_only=True), path=path, mode="r")
        first_inner = list(meta["codecs"][0]["configuration"]["chunk_shape"])
        if d.shards is None or list(d.shards) != meta["chunk_grid"]["configuration"]["chunk_shape"]:
            return f"zarr reports direct shards={d.shards}", ""
        if list(d.chunks) != first_inner:
            return f"zarr reports direct chunks={d.chunks}, expected {tuple(first_inner)}", ""
    return None, detail


def check_zarr(store: Path, mount: Path, path: str):
    _, direct = zarr_read(store, path)
    _, mounted = zarr_read(mount, path)
    err = same_data(direct, mounted)
    return err, f"shape={direct.shape} dtype={direct.dtype}"


def check_ts(store: Path, mount: Path, path: str):
    direct = ts_read(store, path)
    mounted = ts_read(mount, path)
    err = same_data(direct, mounted)
    return err, f"shape={direct.shape} dtype={direct.dtype}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True, type=Path, help="sharded source store (read directly)")
    ap.add_argument("--mount", required=True, type=Path, help="shardfs mountpoint (unsharded view)")
    ap.add_argument("--json", action="store_true", help="print a JSON report on stdout")
    args = ap.parse_args(argv)
    store, mount = args.store.resolve(), args.mount.resolve()
    rep = Report(args.json)

    nodes = find_nodes(store)
    arrays = [p for p, m in nodes.items() if m.get("node_type") == "array"]
    groups = [p for p, m in nodes.items() if m.get("node_type") == "group"]

    def tree():
        mnodes = find_nodes(mount)
        want = {p: m.get("node_type") for p, m in nodes.items()}
        got = {p: m.get("node_type") for p, m in mnodes.items()}
        if want != got:
            missing = sorted(set(want) - set(got))
            extra = sorted(set(got) - set(want))
            changed = sorted(p for p in set(want) & set(got) if want[p] != got[p])
            return f"node mismatch: missing={missing} extra={extra} changed={changed}", ""
        return None, f"{len(arrays)} arrays, {len(groups)} groups"

    if not arrays:
        rep.add(False, "tree", "", f"no array nodes under {store}")
    else:
        rep.run("tree", "", tree)

    for path in groups:
        def group_meta(path=path):
            same = (store / path / "zarr.json").read_bytes() == (mount / path / "zarr.json").read_bytes()
            return (None if same else "group zarr.json is not byte-identical"), "group passthrough"
        rep.run("meta", path, group_meta)

    compared = 0
    for path in sorted(arrays):
        rep.run("meta", path, lambda path=path: check_meta(store, mount, path, nodes[path]))
        rep.run("zarr", path, lambda path=path: check_zarr(store, mount, path))
        rep.run("tensorstore", path, lambda path=path: check_ts(store, mount, path))
        compared += 1

    passed = sum(r["ok"] for r in rep.results)
    failed = len(rep.results) - passed
    if args.json:
        json.dump({"store": str(store), "mount": str(mount), "arrays": compared,
                   "passed": passed, "failed": failed, "results": rep.results},
                  sys.stdout, indent=1)
        print()
    print(f"interop: {passed} passed, {failed} failed", file=rep.out, flush=True)
    return 0 if failed == 0 and compared > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
