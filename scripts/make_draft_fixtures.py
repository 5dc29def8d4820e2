#!/usr/bin/env python3
"""Generate tests/fixtures-draft/: stores of the 2022 draft sharding layout.

Run by hand, by no test or benchmark: the tests read what it writes (tests/fixtures-draft/,
tests/v2.rs).

zarr-python 2.13–2.18 wrote Zarr v3 "draft" stores (``meta/root/...``,
``data/root/...``) sharded by the draft *sharding storage transformer* when
``ZARR_V3_EXPERIMENTAL_API=1`` and ``ZARR_V3_SHARDING=1`` were set. This script
writes such stores with the real writer, in the zarr-python 2.18 venv:

    scripts/setup-venv zarr2
    .venv-zarr2/bin/python scripts/make_draft_fixtures.py

The directory is deleted and regenerated. The arrays cover: no compressor,
gzip, zstd, blosc; C and F memory layout; little- and big-endian, float with
NaN fill, uint8; separators ``/`` and ``.``; edge shards; sparse arrays (chunks
and whole shards never written); nested and implicit groups; attributes.

Ground truth in tests is zarr-python 2.18 reading these stores directly.
"""

from __future__ import annotations

import functools
import gzip
import os
import shutil
import types
from pathlib import Path

os.environ["ZARR_V3_EXPERIMENTAL_API"] = "1"
os.environ["ZARR_V3_SHARDING"] = "1"

import numcodecs  # noqa: E402
import numcodecs.gzip  # noqa: E402
import numpy as np  # noqa: E402
import zarr  # noqa: E402
from zarr._storage.v3 import DirectoryStoreV3  # noqa: E402
from zarr._storage.v3_storage_transformers import ShardingStorageTransformer  # noqa: E402

# gzip headers carry the write time; pin it so that the fixtures are reproducible.
numcodecs.gzip._gzip = types.SimpleNamespace(GzipFile=functools.partial(gzip.GzipFile, mtime=0))

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "fixtures-draft"


def sharded(cps):
    return [ShardingStorageTransformer("indexed", chunks_per_shard=cps)]


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    store = DirectoryStoreV3(str(OUT / "draft"))
    root = zarr.group(store=store, path="/", zarr_version=3)
    root.attrs["fixture"] = "draft"
    grp = zarr.group(store=store, path="grp", zarr_version=3)
    grp.attrs["hello"] = "world"

    # Plain uint16, no compressor, fill 7, one shard never written.
    vol = zarr.create(shape=(10, 7), chunks=(2, 3), dtype="<u2", store=store, path="grp/vol",
                      zarr_version=3, storage_transformers=sharded((2, 2)), compressor=None,
                      fill_value=7)
    vol[:6] = np.arange(42, dtype="<u2").reshape(6, 7)
    vol.attrs["unit"] = "m"

    # gzip, '.' separator, an implicit parent group, edge shards in both dimensions.
    gz = zarr.create(shape=(13, 11), chunks=(3, 4), dtype="<i4", store=store,
                     path="grp/sub/gz", zarr_version=3, storage_transformers=sharded((2, 2)),
                     compressor=numcodecs.GZip(5), fill_value=-1, dimension_separator=".")
    gz[:] = (np.arange(13 * 11, dtype="<i4") * 7 - 300).reshape(13, 11)

    # zstd, big-endian float64, F order, NaN fill, sparse (single chunks written).
    zs = zarr.create(shape=(9, 8), chunks=(2, 2), dtype=">f8", store=store, path="zs",
                     zarr_version=3, storage_transformers=sharded((2, 3)), order="F",
                     compressor=numcodecs.Zstd(3), fill_value=float("nan"))
    zs[0:2, 0:2] = [[1.5, -2.0], [3.25, 4.0]]
    zs[8, 7] = 42.0
    zs[4:6, 2:4] = np.arange(4, dtype=">f8").reshape(2, 2) / 3

    # blosc lz4 byte-shuffle uint16.
    bl = zarr.create(shape=(20,), chunks=(3,), dtype="<u2", store=store, path="bl",
                     zarr_version=3, storage_transformers=sharded((4,)),
                     compressor=numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE), fill_value=0)
    bl[:] = np.arange(20, dtype="<u2") * 1000

    # uint8, 3-d, blosc zstd bit-shuffle.
    u8 = zarr.create(shape=(4, 5, 6), chunks=(2, 2, 3), dtype="|u1", store=store, path="u8",
                     zarr_version=3, storage_transformers=sharded((2, 2, 1)),
                     compressor=numcodecs.Blosc("zstd", 3, numcodecs.Blosc.BITSHUFFLE),
                     fill_value=255)
    u8[1:, :, 2:] = (np.arange(3 * 5 * 4) % 200).astype("u1").reshape(3, 5, 4)

    n = sum(1 for _ in OUT.rglob("*") if _.is_file())
    print(f"wrote {n} files under {OUT.relative_to(REPO)} with zarr {zarr.__version__}")


if __name__ == "__main__":
    main()
