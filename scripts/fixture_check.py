"""The independent reader that checks each fixture against its twin, for
scripts/make_fixtures.py (imported from the scripts directory; not run on its own).

A shard reader of its own, using neither zarr nor tensorstore (crc32c, chunk keys,
sharding levels, shard index decoding and checks), and the analysis built on it: for
every array make_fixtures.py wrote, check that two generations wrote the same bytes,
that the twin holds exactly the inner chunks the shards hold (and the metadata the
shardfs view must present), that zarr-python reads the same data from both, and make
the array's entry of tests/fixtures/MANIFEST.json.
"""

from __future__ import annotations

import filecmp
import importlib.metadata
import json
import math
import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING

import google_crc32c
import numpy as np
import zarr

if TYPE_CHECKING:
    from make_fixtures import Builder

# The writers the manifest names (a Builder's `writer`).
ZARR_WRITER = f"zarr-python {zarr.__version__}"
TS_WRITER = f"tensorstore {importlib.metadata.version('tensorstore')}"
# The manifest's note on gzip written by zarr-python (make_fixtures.py pins its MTIME).
GZIP_NOTE = ("zarr-python/numcodecs gzip embeds the write time in the gzip header; "
             "make_fixtures pins MTIME=0 so bytes are reproducible.")
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

