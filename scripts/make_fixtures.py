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
claim with an independent shard reader (below) and writes the golden values
to tests/fixtures/MANIFEST.json.

Everything is generated twice (into two temporary directories) and compared
file by file, so a non-deterministic writer/codec is detected and recorded
(``bytes_identical: false``) instead of silently producing flaky goldens.
"""

from __future__ import annotations

import argparse
import filecmp
import functools
import gzip
import importlib.metadata
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

import google_crc32c
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

# zarr warns that nested sharding disables partial reads; irrelevant here.
warnings.filterwarnings("ignore", category=UserWarning, module=r"zarr\..*")

# numcodecs' GZip (used by zarr-python's gzip codec) writes the current time
# into the gzip header (MTIME), so two writes in different seconds differ.
# Pin MTIME to 0 so fixtures are reproducible and sharded/twin bytes agree.
numcodecs.gzip._gzip = types.SimpleNamespace(
    GzipFile=functools.partial(gzip.GzipFile, mtime=0))
GZIP_NOTE = ("zarr-python/numcodecs gzip embeds the write time in the gzip header; "
             "make_fixtures pins MTIME=0 so bytes are reproducible.")

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
ZARR_WRITER = f"zarr-python {zarr.__version__}"
TS_WRITER = f"tensorstore {importlib.metadata.version('tensorstore')}"
NO_EMPTY = {"write_empty_chunks": False}
EMPTY_ENTRY = 2**64 - 1

# --------------------------------------------------------------------------
# Independent (non-zarr) reader: crc32c, chunk keys, shard index decoding.
# --------------------------------------------------------------------------


def _crc32c_table() -> list[int]:
    poly = 0x82F63B78  # Castagnoli, reflected
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def chunk_key(cke: dict, coords) -> str:
    """Chunk key for grid coords under a chunk_key_encoding JSON object."""
    name = cke["name"]
    conf = cke.get("configuration") or {}
    if name == "default":
        sep = conf.get("separator", "/")
        return sep.join(["c", *map(str, coords)])
    if name == "v2":
        sep = conf.get("separator", ".")
        return sep.join(map(str, coords)) if len(coords) else "0"
    raise ValueError(f"unknown chunk_key_encoding {name!r}")


def cke_summary(cke: dict) -> dict:
    conf = cke.get("configuration") or {}
    default_sep = "/" if cke["name"] == "default" else "."
    return {"name": cke["name"], "separator": conf.get("separator", default_sep)}


class CorruptShard(Exception):
    def __init__(self, kind: str, msg: str):
        super().__init__(f"{kind}: {msg}")
        self.kind = kind


def sharding_level(cfg: dict) -> dict:
    """Parse one sharding_indexed configuration into what the reader needs."""
    index_codecs = cfg.get("index_codecs")
    if not index_codecs:
        raise ValueError("sharding_indexed without index_codecs")
    first = index_codecs[0]
    if first["name"] != "bytes":
        raise ValueError(f"unsupported index codec {first['name']!r}")
    endian = (first.get("configuration") or {}).get("endian", "little")
    rest = [c["name"] for c in index_codecs[1:]]
    if rest not in ([], ["crc32c"]):
        raise ValueError(f"unsupported index codec chain {rest!r}")
    return {
        "chunk_shape": list(cfg["chunk_shape"]),
        "codecs": cfg["codecs"],
        "index_location": cfg.get("index_location", "end"),
        "index_crc32c": rest == ["crc32c"],
        "index_endian": endian,
    }


def split_codecs(meta: dict) -> tuple[list[dict], list[int], list[dict]]:
    """-> (sharding levels outer->inner, innermost chunk shape, innermost codecs).

    Sharding is recognised only as the sole codec of a chain (that is what
    shardfs unshards); anything else is treated as the innermost chain.
    """
    levels = []
    shape = list(meta["chunk_grid"]["configuration"]["chunk_shape"])
    codecs = meta["codecs"]
    while len(codecs) == 1 and codecs[0]["name"] == "sharding_indexed":
        lvl = sharding_level(codecs[0]["configuration"])
        if any(s % c for s, c in zip(shape, lvl["chunk_shape"])):
            raise ValueError(f"shard shape {shape} not a multiple of {lvl['chunk_shape']}")
        lvl["shard_shape"] = shape
        levels.append(lvl)
        shape, codecs = lvl["chunk_shape"], lvl["codecs"]
    return levels, shape, codecs


def unsharded_metadata(meta: dict) -> dict:
    """The zarr.json the shardfs view must present (key order preserved)."""
    levels, inner_shape, inner_codecs = split_codecs(meta)
    if not levels:
        return meta
    out = json.loads(json.dumps(meta))
    out["chunk_grid"]["configuration"]["chunk_shape"] = inner_shape
    out["codecs"] = inner_codecs
    return out


def decode_index(buf: bytes, lvl: dict) -> list[list[int]]:
    """Decode a shard index -> [[offset, nbytes], ...] in row-major order."""
    cps = [s // c for s, c in zip(lvl["shard_shape"], lvl["chunk_shape"])]
    n = math.prod(cps)
    size = 16 * n + (4 if lvl["index_crc32c"] else 0)
    if len(buf) < size:
        raise CorruptShard("truncated", f"{len(buf)} bytes < index size {size}")
    region = buf[:size] if lvl["index_location"] == "start" else buf[len(buf) - size:]
    if lvl["index_crc32c"]:
        payload, stored = region[:-4], int.from_bytes(region[-4:], "little")
        actual = crc32c(payload)
        assert actual == google_crc32c.value(payload), "pure-python crc32c is wrong"
        if actual != stored:
            raise CorruptShard("checksum", f"crc32c {actual:#010x} != stored {stored:#010x}")
    else:
        payload = region
    fmt = ("<" if lvl["index_endian"] == "little" else ">") + f"{2 * n}Q"
    vals = struct.unpack(fmt, payload)
    return [[vals[2 * i], vals[2 * i + 1]] for i in range(n)]


def check_entries(buf: bytes, entries: list[list[int]]) -> None:
    for i, (off, nb) in enumerate(entries):
        if off == EMPTY_ENTRY and nb == EMPTY_ENTRY:
            continue
        if off + nb > len(buf):
            raise CorruptShard("out_of_bounds", f"entry {i}: {off}+{nb} > {len(buf)}")


def iter_grid(grid):
    return np.ndindex(*grid) if grid else iter([()])


def read_sharded(array_dir: Path, meta: dict):
    """-> (levels, innermost shape, innermost codecs, {inner coords: bytes},
    {shard key: outermost index}, [shard keys])."""
    levels, inner_shape, inner_codecs = split_codecs(meta)
    cke = meta["chunk_key_encoding"]
    shape = meta["shape"]
    outer = levels[0]["shard_shape"]
    chunks: dict[tuple, bytes] = {}
    index: dict[str, list] = {}

    def descend(buf: bytes, depth: int, base: tuple):
        lvl = levels[depth]
        entries = decode_index(buf, lvl)
        check_entries(buf, entries)
        cps = [s // c for s, c in zip(lvl["shard_shape"], lvl["chunk_shape"])]
        for i, pos in enumerate(iter_grid(cps)):
            off, nb = entries[i]
            if off == EMPTY_ENTRY and nb == EMPTY_ENTRY:
                continue
            coords = tuple(b * c + p for b, c, p in zip(base, cps, pos))
            data = buf[off:off + nb]
            if depth + 1 < len(levels):
                descend(data, depth + 1, coords)
            else:
                chunks[coords] = data
        return entries

    grid = [math.ceil(s / c) for s, c in zip(shape, outer)]
    for coords in iter_grid(grid):
        key = chunk_key(cke, coords)
        p = array_dir / key
        if p.is_file():
            index[key] = descend(p.read_bytes(), 0, tuple(coords))
    return levels, inner_shape, inner_codecs, chunks, index


def list_chunk_files(array_dir: Path) -> dict[str, bytes]:
    out = {}
    for dirpath, _dirs, files in os.walk(array_dir):
        for f in files:
            rel = os.path.relpath(os.path.join(dirpath, f), array_dir)
            if rel == "zarr.json":
                continue
            out[rel.replace(os.sep, "/")] = Path(dirpath, f).read_bytes()
    return out


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


# --------------------------------------------------------------------------
# Analysis: check twins, build the manifest.
# --------------------------------------------------------------------------


def dirs_identical(a: Path, b: Path) -> bool:
    cmp = filecmp.dircmp(a, b)
    if cmp.left_only or cmp.right_only or cmp.funny_files:
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
    if mismatch or errors:
        return False
    return all(dirs_identical(a / d, b / d) for d in cmp.common_dirs)


def analyse(out: Path, out2: Path, b: Builder, rec: dict, corrupt_info=None) -> dict:
    path = rec["array"]
    adir = out / b.store / path
    meta = json.loads((adir / "zarr.json").read_bytes())
    cke = meta["chunk_key_encoding"]
    notes = [rec["notes"]] if rec["notes"] else []
    deterministic = dirs_identical(adir, out2 / b.store / path)
    if b.twin:
        deterministic &= dirs_identical(out / b.twin / path, out2 / b.twin / path)
    if b.writer == ZARR_WRITER and '"gzip"' in json.dumps(meta["codecs"]):
        notes.append(GZIP_NOTE)
    if not deterministic:
        notes.append("NOT deterministic: two generations produced different bytes.")

    entry = {
        "store": b.store, "array": path, "twin": b.twin, "writer": b.writer,
        "sharded": rec["sharded"], "shape": meta["shape"], "dtype": meta["data_type"],
        "fill_value": meta["fill_value"],
    }
    files = list_chunk_files(adir)
    if not rec["sharded"]:
        chunk_shape = meta["chunk_grid"]["configuration"]["chunk_shape"]
        if b.twin:
            assert dirs_identical(adir, out / b.twin / path), f"{b.store}/{path}: passthrough twin differs"
        entry.update({
            "inner_chunk_shape": chunk_shape, "shard_shape": None, "index_location": None,
            "index_crc32c": None, "index_endian": None,
            "chunk_key_encoding": cke_summary(cke), "nested": False,
            "levels": [], "bytes_identical": deterministic,
            "chunk_keys": sorted(files), "shard_keys": [], "shard_index": {},
        })
        entry["notes"] = " ".join(notes)
        return entry

    levels, inner_shape, inner_codecs = split_codecs(meta)
    assert levels, f"{b.store}/{path} expected sharded"
    outer = levels[0]
    grid = [math.ceil(s / c) for s, c in zip(meta["shape"], inner_shape)]

    if corrupt_info:
        chunks, index, shard_keys = {}, {}, sorted(files)
        for key in shard_keys:
            buf = files[key]
            try:
                entries = decode_index(buf, outer)
                index[key] = entries
                check_entries(buf, entries)
                status = "ok"
            except CorruptShard as e:
                status = e.kind
            assert status == corrupt_info["corrupt"].get(key, "ok"), (key, status)
            if status == "ok":
                coords = [int(x) for x in key.split("/")[1:]]
                cps = [s // c for s, c in zip(outer["shard_shape"], outer["chunk_shape"])]
                for i, pos in enumerate(iter_grid(cps)):
                    off, nb = entries[i]
                    if off != EMPTY_ENTRY:
                        cc = tuple(c * n + p for c, n, p in zip(coords, cps, pos))
                        chunks[cc] = buf[off:off + nb]
        ok_keys = sorted(chunk_key(cke, c) for c in chunks)
        all_keys = sorted(chunk_key(cke, c) for c in iter_grid(grid))
    else:
        _, _, _, chunks, index = read_sharded(adir, meta)
        shard_keys = sorted(index)
        assert shard_keys == sorted(files), f"{b.store}/{path}: stray files {sorted(files)}"

    outside = [c for c in chunks if any(x >= g for x, g in zip(c, grid))]
    assert not outside, f"{b.store}/{path}: non-empty inner chunks outside the grid: {outside}"
    keyed = {chunk_key(cke, c): data for c, data in chunks.items()}

    identical = deterministic
    if b.twin:
        tdir = out / b.twin / path
        tmeta = json.loads((tdir / "zarr.json").read_bytes())
        expect = unsharded_metadata(meta)
        assert tmeta == expect, (f"{b.store}/{path}: twin metadata differs from rewrite:\n"
                                 f"{json.dumps(tmeta)}\n{json.dumps(expect)}")
        tfiles = list_chunk_files(tdir)
        assert set(tfiles) == set(keyed), (
            f"{b.store}/{path}: chunk key sets differ: only sharded "
            f"{sorted(set(keyed) - set(tfiles))}, only twin {sorted(set(tfiles) - set(keyed))}")
        differing = sorted(k for k in keyed if keyed[k] != tfiles[k])
        if differing:
            identical = False
            notes.append(f"inner chunk bytes differ from twin for {len(differing)} keys "
                         f"(e.g. {differing[:3]}).")
        # Reading the twin with zarr must give the same data as the sharded array.
        za = zarr.open_array(store=zarr.storage.LocalStore(out / b.store, read_only=True), path=path)
        zt = zarr.open_array(store=zarr.storage.LocalStore(out / b.twin, read_only=True), path=path)
        assert np.array_equal(za[...], zt[...], equal_nan=za.dtype.kind == "f"), f"{b.store}/{path}: data differs"
    elif not corrupt_info:
        identical = False

    entry.update({
        "inner_chunk_shape": inner_shape,
        "shard_shape": outer["shard_shape"],
        "index_location": outer["index_location"],
        "index_crc32c": outer["index_crc32c"],
        "index_endian": outer["index_endian"],
        "chunk_key_encoding": cke_summary(cke),
        "nested": len(levels) > 1,
        "levels": [{k: lvl[k] for k in ("shard_shape", "chunk_shape", "index_location",
                                         "index_crc32c", "index_endian")} for lvl in levels],
        "inner_codecs": inner_codecs,
        "bytes_identical": identical if not corrupt_info else False,
        "chunk_keys": sorted(keyed) if not corrupt_info else all_keys,
        "shard_keys": shard_keys,
        "shard_index": {k: index[k] for k in sorted(index)},
    })
    if corrupt_info:
        entry.update(corrupt_info)
        entry["ok_chunk_keys"] = ok_keys
    entry["notes"] = " ".join(notes)
    return entry


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


def check_groups(store: Path, twin: Path) -> None:
    """Group zarr.json files must be byte-identical in store and twin."""
    for dirpath, _dirs, files in os.walk(store):
        if "zarr.json" not in files:
            continue
        p = Path(dirpath, "zarr.json")
        meta = json.loads(p.read_bytes())
        if meta.get("node_type") == "group":
            t = twin / p.relative_to(store)
            assert t.read_bytes() == p.read_bytes(), f"group metadata differs: {t}"


if __name__ == "__main__":
    sys.exit(main())
