#!/usr/bin/env python3
"""Generate the shardfs test fixtures under tests/fixtures/.

Run by hand, by no test or benchmark: the tests read what it writes (tests/fixtures/).

Run with the repo venv (see scripts/setup-venv):

    .venv/bin/python scripts/make_fixtures.py

The whole tests/fixtures/ directory is deleted and regenerated.  Every
sharded array gets an *unsharded twin* written by the same library into
``<store>.twin/`` at the same array path, with chunk_shape = the innermost
chunk shape and codecs = the innermost codec chain; the twin is exactly what
the shardfs view of the sharded store must look like.  The script checks that
claim with an independent shard reader (scripts/fixture_check.py) and writes the
golden values to tests/fixtures/MANIFEST.json.

Everything is generated twice (into two temporary directories) and compared
file by file, so a non-deterministic writer/codec is detected and recorded
(``bytes_identical: false``) instead of silently producing flaky goldens.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import math
import os
import shutil
import struct
import sys
import tempfile
import types
import warnings
from pathlib import Path

import numcodecs.gzip
import numpy as np
import tensorstore as ts
import zarr
from zarr.codecs import (
    BloscCodec,
    BytesCodec,
    Crc32cCodec,
    GzipCodec,
    ShardingCodec,
    TransposeCodec,
    ZstdCodec,
)

sys.dont_write_bytecode = True  # importing fixture_check.py leaves no scripts/__pycache__

from fixture_check import (  # noqa: E402  (scripts/fixture_check.py, beside this script)
    TS_WRITER, ZARR_WRITER, analyse, check_groups, crc32c, decode_index, split_codecs,
)

# zarr warns that nested sharding disables partial reads; irrelevant here.
warnings.filterwarnings("ignore", category=UserWarning, module=r"zarr\..*")

# numcodecs' GZip (used by zarr-python's gzip codec) writes the current time
# into the gzip header (MTIME), so two writes in different seconds differ.
# Pin MTIME to 0 so fixtures are reproducible and sharded/twin bytes agree
# (the manifest says so: fixture_check.GZIP_NOTE).
numcodecs.gzip._gzip = types.SimpleNamespace(
    GzipFile=functools.partial(gzip.GzipFile, mtime=0))

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
NO_EMPTY = {"write_empty_chunks": False}

# --------------------------------------------------------------------------
# Deterministic data.
# --------------------------------------------------------------------------


def pattern(shape, dtype, seed: int) -> np.ndarray:
    """Deterministic data with no value equal to the fill value 0."""
    n = math.prod(shape)
    base = np.arange(n, dtype=np.int64) * 7 + seed * 131
    dt = np.dtype(dtype)
    if dt.kind == "f":
        vals = (base % 1000).astype(dt) * dt.type(0.25) + dt.type(1)
    elif dt.kind == "u":
        top = min(np.iinfo(dt).max, 60000)
        vals = (base % top + 1).astype(dt)
    else:
        top = min(np.iinfo(dt).max, 30000)
        vals = ((base % top + 1) * np.where(base % 3 == 0, -1, 1)).astype(dt)
    return vals.reshape(shape)


def region_shape(sel, shape):
    return tuple(len(range(*s.indices(d))) for s, d in zip(sel, shape))


# A write plan is a list of (selection, seed or "zero" or "nan").
SPARSE_2D = [
    (np.s_[0:5, 0:4], 1),      # shard (0,0), several inner chunks partly
    (np.s_[12:16, 0:3], "zero"),  # written but equal to fill -> must stay absent
    (np.s_[9:18, 12:13], 2),   # edge column shards (1,2),(2,2)
    (np.s_[17:18, 2:5], 3),    # edge row shard (2,0)
]
SHAPE_2D = (18, 13)
SHARD_2D = (8, 6)
INNER_2D = (4, 3)


def plan_data(plan, shape, dtype, fill):
    for sel, seed in plan:
        rs = region_shape(sel, shape)
        if seed == "zero":
            val = np.full(rs, fill, dtype=dtype)
        elif seed == "nan":
            val = pattern(rs, dtype, 5)
            val.flat[::3] = np.nan
        else:
            val = pattern(rs, dtype, seed)
        yield sel, val


# --------------------------------------------------------------------------
# Writers.
# --------------------------------------------------------------------------


class Builder:
    """Writes one fixture store and its twin, and remembers what it wrote."""

    def __init__(self, out: Path, store: str, writer: str, twin: bool = True,
                 root_attrs: dict | None = None):
        self.out = out
        self.store = store
        self.writer = writer
        self.twin = f"{store}.twin" if twin else None
        self.arrays: list[dict] = []
        attrs = root_attrs if root_attrs is not None else {"fixture": store}
        for s in self.stores():
            zarr.open_group(zarr.storage.LocalStore(out / s), mode="w", attributes=attrs)

    def stores(self):
        return [self.store] + ([self.twin] if self.twin else [])

    def group(self, path: str, attrs: dict):
        for s in self.stores():
            zarr.open_group(zarr.storage.LocalStore(self.out / s), path=path,
                            mode="w", attributes=attrs)

    def record(self, path: str, sharded: bool, notes: str = "", **extra):
        self.arrays.append({"array": path, "sharded": sharded, "notes": notes, **extra})


def zp_write(arr, plan, shape, dtype, fill):
    for sel, val in plan_data(plan, shape, dtype, fill):
        arr[sel] = val


def zp_sharded(b: Builder, path: str, *, shape, dtype, shard_shape, codecs, twin_chunks,
               twin_codecs, plan, fill_value=0, attributes=None, dimension_names=None,
               chunk_key_encoding=None, notes=""):
    """zarr.create with an explicit sharding codec chain, plus its twin."""
    common = dict(shape=shape, dtype=dtype, fill_value=fill_value, zarr_format=3,
                  attributes=attributes or {}, dimension_names=dimension_names,
                  config=NO_EMPTY)
    if chunk_key_encoding is not None:
        common["chunk_key_encoding"] = chunk_key_encoding
    a = zarr.create(store=zarr.storage.LocalStore(b.out / b.store), path=path,
                    chunks=shard_shape, codecs=codecs, **common)
    zp_write(a, plan, shape, dtype, fill_value)
    if b.twin:
        t = zarr.create(store=zarr.storage.LocalStore(b.out / b.twin), path=path,
                        chunks=twin_chunks, codecs=twin_codecs, **common)
        zp_write(t, plan, shape, dtype, fill_value)
    b.record(path, True, notes)


def zp_plain(b: Builder, path: str, *, shape, dtype, chunks, plan, fill_value=0,
             attributes=None, dimension_names=None, notes=""):
    for s in b.stores():
        a = zarr.create_array(zarr.storage.LocalStore(b.out / s), name=path, shape=shape,
                              dtype=dtype, chunks=chunks, fill_value=fill_value,
                              attributes=attributes or {}, dimension_names=dimension_names,
                              config=NO_EMPTY)
        zp_write(a, plan, shape, dtype, fill_value)
    b.record(path, False, notes)


def ts_create(path: Path, meta: dict):
    return ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)},
                    "metadata": meta}, create=True, delete_existing=True).result()


def ts_sharded(b: Builder, path: str, *, shape, dtype, shard_shape, codecs, twin_chunks,
               twin_codecs, plan, fill_value=0, attributes=None, chunk_key_encoding=None,
               notes=""):
    base = {"shape": list(shape), "data_type": dtype, "fill_value": fill_value,
            "chunk_key_encoding": chunk_key_encoding or {"name": "default"},
            "attributes": attributes or {}}
    variants = [(b.store, shard_shape, codecs)]
    if b.twin:
        variants.append((b.twin, twin_chunks, twin_codecs))
    for s, chunks, cods in variants:
        meta = dict(base, chunk_grid={"name": "regular",
                                      "configuration": {"chunk_shape": list(chunks)}},
                    codecs=cods)
        arr = ts_create(b.out / s / path, meta)
        for sel, val in plan_data(plan, shape, dtype, fill_value):
            arr[sel].write(val).result()
    b.record(path, True, notes)


# ---- the fixture catalogue ------------------------------------------------


def build_zarr_basic(out: Path) -> Builder:
    b = Builder(out, "zarr_basic", ZARR_WRITER, root_attrs={"fixture": "zarr_basic",
                                                             "about": "index variants"})
    # zarr's own defaults for the index (bytes little + crc32c, at end),
    # created through the high-level create_array(shards=...) API.
    attrs = {"description": "sparse uint16, edge shards"}
    for s, chunks, shards in ((b.store, INNER_2D, SHARD_2D), (b.twin, INNER_2D, None)):
        a = zarr.create_array(zarr.storage.LocalStore(out / s), name="u16_default_sparse",
                              shape=SHAPE_2D, dtype="uint16", chunks=chunks, shards=shards,
                              compressors=None, fill_value=0, attributes=attrs,
                              dimension_names=["y", "x"], config=NO_EMPTY)
        zp_write(a, SPARSE_2D, SHAPE_2D, "uint16", 0)
    b.record("u16_default_sparse", True,
             "zarr.create_array(chunks=inner, shards=shard, compressors=None); index "
             "is zarr's default (bytes little + crc32c, end). Some inner chunks are "
             "empty (incl. a region written with the fill value), several shards are "
             "missing, edge shards hold inner chunks partly and wholly outside the array.")

    variants = [
        ("index_start", dict(index_location="start"), "index at start, bytes little + crc32c"),
        ("index_nocrc", dict(index_codecs=[BytesCodec()]), "index codecs: bytes little only (no crc32c)"),
        ("index_bigendian", dict(index_codecs=[BytesCodec(endian="big"), Crc32cCodec()]),
         "index codecs: bytes big + crc32c (zarr-python accepts big-endian index)"),
        ("index_bigendian_start_nocrc",
         dict(index_codecs=[BytesCodec(endian="big")], index_location="start"),
         "index at start, bytes big, no crc32c"),
    ]
    for seed, (name, kw, note) in enumerate(variants, start=10):
        plan = [(sel, seed + i if isinstance(v, int) else v) for i, (sel, v) in enumerate(SPARSE_2D)]
        zp_sharded(b, name, shape=SHAPE_2D, dtype="uint16", shard_shape=SHARD_2D,
                   codecs=[ShardingCodec(chunk_shape=INNER_2D, codecs=[BytesCodec()], **kw)],
                   twin_chunks=INNER_2D, twin_codecs=[BytesCodec()], plan=plan,
                   attributes={"variant": name}, notes=note)
    return b


def build_zarr_codecs(out: Path) -> Builder:
    b = Builder(out, "zarr_codecs", ZARR_WRITER)
    cases = [
        ("inner_gzip", "int32", [BytesCodec(), GzipCodec(level=5)], "inner codecs bytes little + gzip(5)"),
        ("inner_zstd", "uint16", [BytesCodec(), ZstdCodec(level=3, checksum=True)],
         "inner codecs bytes little + zstd(3, checksum)"),
        ("inner_blosc", "float64", [BytesCodec(), BloscCodec(cname="lz4", clevel=5, shuffle="shuffle", typesize=8)],
         "inner codecs bytes little + blosc(lz4, shuffle)"),
        ("data_bigendian", "int16", [BytesCodec(endian="big")], "inner codec bytes big-endian (data)"),
        ("inner_transpose", "int32", [TransposeCodec(order=(1, 0)), BytesCodec(), GzipCodec(level=1)],
         "inner chain transpose(order=[1,0]) + bytes little + gzip(1); non-square inner chunk"),
    ]
    for seed, (name, dtype, inner, note) in enumerate(cases, start=20):
        plan = [(sel, seed + i if isinstance(v, int) else v) for i, (sel, v) in enumerate(SPARSE_2D)]
        zp_sharded(b, name, shape=SHAPE_2D, dtype=dtype, shard_shape=SHARD_2D,
                   codecs=[ShardingCodec(chunk_shape=INNER_2D, codecs=inner)],
                   twin_chunks=INNER_2D, twin_codecs=inner, plan=plan,
                   attributes={"codec": name}, dimension_names=["row", "col"], notes=note)
    return b


NESTED_SHAPE = (9, 8, 11)
NESTED_PLAN = [
    (np.s_[0:3, 0:5, 0:6], 30),
    (np.s_[8:9, 0:8, 8:11], 31),   # edge shard, wholly-outside inner chunks exist
    (np.s_[4:6, 4:6, 4:6], "zero"),
]


def build_zarr_nested(out: Path) -> Builder:
    b = Builder(out, "zarr_nested", ZARR_WRITER)
    innermost = [BytesCodec(), GzipCodec(level=5)]
    mid = ShardingCodec(chunk_shape=(2, 2, 2), codecs=innermost,
                        index_codecs=[BytesCodec()], index_location="start")
    zp_sharded(b, "nested_3d", shape=NESTED_SHAPE, dtype="uint8", shard_shape=(8, 8, 8),
               codecs=[ShardingCodec(chunk_shape=(4, 4, 4), codecs=[mid])],
               twin_chunks=(2, 2, 2), twin_codecs=innermost, plan=NESTED_PLAN,
               attributes={"nested": True}, dimension_names=["z", "y", "x"],
               notes="nested sharding: outer shard 8x8x8 (index end, crc32c) of 4x4x4 "
                     "sub-shards (index start, no crc32c) of 2x2x2 chunks (bytes+gzip). "
                     "shard_index lists the outermost level only. NB: zarr-python "
                     "3.1.x reports .chunks == (4,4,4) (first level) for this array.")
    return b


KEYS_SHAPE = (9, 8)
KEYS_PLAN = [(np.s_[0:3, 0:3], 40), (np.s_[8:9, 4:8], 41), (np.s_[4:6, 0:2], "zero")]


def build_zarr_keys(out: Path) -> Builder:
    b = Builder(out, "zarr_keys", ZARR_WRITER)
    cases = [
        ("default_dot", {"name": "default", "separator": "."}),
        ("v2_dot", {"name": "v2", "separator": "."}),
        ("v2_slash", {"name": "v2", "separator": "/"}),
    ]
    for name, cke in cases:
        zp_sharded(b, name, shape=KEYS_SHAPE, dtype="uint8", shard_shape=(4, 4),
                   codecs=[ShardingCodec(chunk_shape=(2, 2), codecs=[BytesCodec()])],
                   twin_chunks=(2, 2), twin_codecs=[BytesCodec()], plan=KEYS_PLAN,
                   chunk_key_encoding=cke, attributes={"cke": name},
                   notes=f"chunk_key_encoding {cke['name']} separator {cke['separator']!r}")
    return b


def build_zarr_mixed(out: Path) -> Builder:
    b = Builder(out, "zarr_mixed", ZARR_WRITER,
                root_attrs={"fixture": "zarr_mixed", "nested": {"a": [1, 2, 3], "b": None}})
    zp_plain(b, "plain_u8", shape=(10, 7), dtype="uint8", chunks=(4, 4),
             plan=[(np.s_[0:5, 0:7], 50), (np.s_[9:10, 0:2], 51)],
             attributes={"kind": "not sharded", "units": "counts"},
             dimension_names=["a", "b"],
             notes="NOT sharded (zarr default codecs bytes+zstd): must pass through "
                   "byte for byte, metadata unchanged.")
    b.group("grp", {"level": 1, "title": "group"})
    b.group("grp/sub", {"level": 2, "title": "subgroup"})
    zp_sharded(b, "grp/sub/f32_nan", shape=(11, 9), dtype="float32", shard_shape=(4, 6),
               codecs=[ShardingCodec(chunk_shape=(2, 3), codecs=[BytesCodec(), ZstdCodec(level=1)])],
               twin_chunks=(2, 3), twin_codecs=[BytesCodec(), ZstdCodec(level=1)],
               plan=[(np.s_[0:3, 0:4], "nan"), (np.s_[8:11, 6:9], 52),
                     (np.s_[4:8, 0:3], "zero")],
               fill_value=float("nan"), attributes={"units": "m", "scale": 0.5},
               dimension_names=["lat", None],
               notes="sharded float32 with fill_value NaN (some data values are NaN, a "
                     "region written with NaN must stay absent) in nested group grp/sub.")
    zp_plain(b, "grp/plain_i2", shape=(5,), dtype="int16", chunks=(2,),
             plan=[((slice(1, 4),), 53)], attributes={},
             notes="NOT sharded 1-D array inside a group.")
    return b


TS_INDEX = [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]


def ts_bytes():
    return {"name": "bytes", "configuration": {"endian": "little"}}


def build_tensorstore(out: Path) -> Builder:
    b = Builder(out, "tensorstore", TS_WRITER)
    inner = [ts_bytes(), {"name": "zstd", "configuration": {"level": 3}}]
    ts_sharded(b, "crc_end_zstd", shape=SHAPE_2D, dtype="uint16", shard_shape=SHARD_2D,
               codecs=[{"name": "sharding_indexed", "configuration": {
                   "chunk_shape": list(INNER_2D), "codecs": inner,
                   "index_codecs": TS_INDEX, "index_location": "end"}}],
               twin_chunks=INNER_2D, twin_codecs=inner, plan=SPARSE_2D,
               attributes={"writer": "tensorstore"},
               notes="tensorstore zarr3: index end + crc32c, bytes+zstd inner, sparse.")
    inner = [ts_bytes(), {"name": "gzip", "configuration": {"level": 6}}]
    plan = [(sel, 60 + i if isinstance(v, int) else v) for i, (sel, v) in enumerate(SPARSE_2D)]
    ts_sharded(b, "start_gzip", shape=SHAPE_2D, dtype="int32", shard_shape=SHARD_2D,
               codecs=[{"name": "sharding_indexed", "configuration": {
                   "chunk_shape": list(INNER_2D), "codecs": inner,
                   "index_codecs": TS_INDEX, "index_location": "start"}}],
               twin_chunks=INNER_2D, twin_codecs=inner, plan=plan,
               notes="tensorstore zarr3: index start + crc32c, bytes+gzip inner, sparse.")
    inner = [ts_bytes()]
    ts_sharded(b, "nocrc_default_location", shape=(7, 10), dtype="uint8", shard_shape=(4, 4),
               codecs=[{"name": "sharding_indexed", "configuration": {
                   "chunk_shape": [2, 2], "codecs": inner,
                   "index_codecs": [ts_bytes()]}}],
               twin_chunks=(2, 2), twin_codecs=inner,
               plan=[(np.s_[0:3, 0:3], 61), (np.s_[6:7, 7:10], 62)],
               notes="tensorstore omits index_location from zarr.json when it is the "
                     "default 'end'; index without crc32c.")
    inner = [ts_bytes(), {"name": "crc32c"}]
    ts_sharded(b, "scalar", shape=(), dtype="int32", shard_shape=(),
               codecs=[{"name": "sharding_indexed", "configuration": {
                   "chunk_shape": [], "codecs": inner, "index_codecs": TS_INDEX}}],
               twin_chunks=(), twin_codecs=inner, plan=[((), 63)],
               notes="0-d sharded array, written with tensorstore because zarr-python "
                     "3.1.6 can create but not write 0-d sharded arrays (IndexError in "
                     "ShardingCodec._encode_partial_single); zarr-python reads it fine. "
                     "Inner chain bytes + crc32c.")
    inner = [ts_bytes(), {"name": "gzip", "configuration": {"level": 1}}]
    ts_sharded(b, "nested_3d", shape=NESTED_SHAPE, dtype="uint8", shard_shape=(8, 8, 8),
               codecs=[{"name": "sharding_indexed", "configuration": {
                   "chunk_shape": [4, 4, 4], "index_codecs": TS_INDEX,
                   "codecs": [{"name": "sharding_indexed", "configuration": {
                       "chunk_shape": [2, 2, 2], "codecs": inner,
                       "index_codecs": TS_INDEX, "index_location": "start"}}]}}],
               twin_chunks=(2, 2, 2), twin_codecs=inner, plan=NESTED_PLAN,
               notes="tensorstore nested sharding (8^3 shards of 4^3 sub-shards of 2^3 chunks).")
    return b


def build_corrupt(out: Path) -> tuple[Builder, dict]:
    b = Builder(out, "corrupt", ZARR_WRITER, twin=False)
    a = zarr.create_array(zarr.storage.LocalStore(out / "corrupt"), name="u8", shape=(8, 8),
                          dtype="uint8", chunks=(2, 2), shards=(4, 4), compressors=None,
                          fill_value=0, config=NO_EMPTY)
    a[:] = pattern((8, 8), "uint8", 70)
    d = out / "corrupt" / "u8"
    meta = json.loads((d / "zarr.json").read_bytes())
    lvl = split_codecs(meta)[0][0]
    size = 16 * 4 + 4
    # A: flip one bit of the first index entry, crc32c no longer matches.
    p = d / "c" / "0" / "0"
    buf = bytearray(p.read_bytes())
    buf[len(buf) - size] ^= 0x01
    p.write_bytes(bytes(buf))
    # B: truncate below the index size.
    p = d / "c" / "0" / "1"
    p.write_bytes(p.read_bytes()[:size - 8])
    # C: last entry's nbytes points past EOF, crc32c recomputed (valid).
    p = d / "c" / "1" / "0"
    buf = bytearray(p.read_bytes())
    entries = decode_index(bytes(buf), lvl)
    entries[3][1] = len(buf) + 100
    payload = struct.pack("<8Q", *[v for e in entries for v in e])
    buf[len(buf) - size:] = payload + crc32c(payload).to_bytes(4, "little")
    p.write_bytes(bytes(buf))
    corrupt = {"c/0/0": "checksum", "c/0/1": "truncated", "c/1/0": "out_of_bounds"}
    b.record("u8", True,
             "Deliberately corrupt. c/0/0: one bit flipped in the crc32c-protected "
             "index (checksum mismatch). c/0/1: truncated to 60 bytes < index size 68. "
             "c/1/0: index entry 3 (chunk c/3/1) has offset+nbytes beyond EOF but a "
             "valid crc32c; its other entries are fine. c/1/1: intact. "
             "chunk_keys lists the keys as written before corruption; ok_chunk_keys "
             "those of the intact shard, whose bytes equal the stored inner chunks.")
    return b, {"corrupt": corrupt, "bad_entries": {"c/1/0": {"entry": 3, "chunk_key": "c/3/1"}}}


BUILDERS = [build_zarr_basic, build_zarr_codecs, build_zarr_nested, build_zarr_keys,
            build_zarr_mixed, build_tensorstore]


def generate(out: Path):
    out.mkdir(parents=True)
    builders = [f(out) for f in BUILDERS]
    corrupt_b, corrupt_info = build_corrupt(out)
    prune_empty_dirs(out)
    return builders, corrupt_b, corrupt_info


def prune_empty_dirs(root: Path) -> None:
    """Drop empty directories (tensorstore leaves some behind after deleting a
    chunk that became all-fill); git could not keep them anyway."""
    for dirpath, _dirs, _files in os.walk(root, topdown=False):
        if Path(dirpath) != root and not os.listdir(dirpath):
            os.rmdir(dirpath)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=FIXTURES, help="fixtures dir (deleted and regenerated)")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="shardfs-fixtures-") as tmp:
        gen1, gen2 = Path(tmp) / "a", Path(tmp) / "b"
        builders, corrupt_b, corrupt_info = generate(gen1)
        generate(gen2)
        manifest = []
        for b in builders:
            for rec in b.arrays:
                manifest.append(analyse(gen1, gen2, b, rec))
        for rec in corrupt_b.arrays:
            manifest.append(analyse(gen1, gen2, corrupt_b, rec, corrupt_info))
        for b in builders:
            if b.twin:
                check_groups(gen1 / b.store, gen1 / b.twin)

        (gen1 / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
        # Chunk files are binary even when they contain no NUL byte: never let
        # git convert line endings in them.
        (gen1 / ".gitattributes").write_text("* -text\n")
        if args.out.exists():
            shutil.rmtree(args.out)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(gen1, args.out)

    total = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    nfiles = sum(1 for p in args.out.rglob("*") if p.is_file())
    for e in manifest:
        flag = "sharded" if e["sharded"] else "plain  "
        print(f"{e['store']:>12}/{e['array']:<28} {flag} chunks={len(e['chunk_keys']):3d} "
              f"shards={len(e['shard_keys']):2d} identical={e['bytes_identical']}")
    print(f"make_fixtures: {len(manifest)} arrays, {nfiles} files, {total} bytes in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
