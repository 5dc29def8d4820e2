"""The seed's blosc containers, made by their own producers and read back through a mount.

Used by the tests (tests/containers.rs) and the benchmark scripts/bench_containers.py
(which imports it): shared, so it stays in scripts/ (the tests' own helpers are in tests/py/).

    make_containers.py make STORE EXPECTED   bcolz rootdirs and bloscpack files into STORE;
                                             what bcolz and bloscpack read back, as .npy
                                             files, into EXPECTED (name: path in STORE)
    make_containers.py read MOUNT EXPECTED   read every container through the mount with
                                             zarr (3 or 2.18, whichever is installed), and
                                             with xarray + dask; compare with EXPECTED
    make_containers.py copied STORE EXPECTED NAME...   the containers NAME, copied into a
                                             writable mount of STORE: sharded, same values
    make_containers.py big STORE MIB         one float64 carray of MIB MiB (the benchmark)

Run `make` in the venv of scripts/requirements.txt (bcolz-zipline, bloscpack), `read` in
either venv. tests/containers.rs drives it.
"""

import collections
import collections.abc
import json
import os
import sys

# bloscpack 0.16 (and bcolz's helpers) import these from `collections`, which Python
# 3.10 moved to `collections.abc`: aliased here, in the test set-up, not in the product.
for _name in ("MutableMapping", "Mapping", "Iterable", "Callable", "Sequence",
              "MutableSequence", "Hashable", "Set", "MutableSet"):
    if not hasattr(collections, _name):
        setattr(collections, _name, getattr(collections.abc, _name))

import numpy as np  # noqa: E402

CHECKSUMS = ["None", "adler32", "crc32", "md5", "sha1", "sha224", "sha256", "sha384", "sha512"]
CNAMES = ["blosclz", "lz4", "zlib", "zstd"]


def save(expected, name, arr):
    path = os.path.join(expected, name.replace("/", "__") + ".npy")
    np.save(path, np.asarray(arr))


def make(store, expected):
    import bcolz
    import bloscpack as bp

    os.makedirs(store, exist_ok=True)
    os.makedirs(expected, exist_ok=True)
    rng = np.random.default_rng(36)
    made = []

    def carray(name, data, chunklen, cname, shuffle, clevel=5, dflt=None, attrs=None):
        kw = {} if dflt is None else {"dflt": dflt}
        c = bcolz.carray(data, rootdir=os.path.join(store, name), mode="w", chunklen=chunklen,
                         cparams=bcolz.cparams(clevel=clevel, cname=cname, shuffle=shuffle), **kw)
        for k, v in (attrs or {}).items():
            c.attrs[k] = v
        c.flush()
        back = bcolz.open(os.path.join(store, name), mode="r")
        save(expected, name, back[:])
        made.append(name)

    # 1-D and 2-D, each compressor, each shuffle; whole and short last chunks.
    carray("c_blosclz_1d", np.arange(10_000, dtype="f8"), 1000, "blosclz", 1,
           attrs={"units": "m", "n": 3})
    carray("c_lz4_1d_short", rng.integers(-1000, 1000, 10_007).astype("i4"), 1000, "lz4", 1)
    carray("c_zlib_2d", rng.random((1003, 4)).astype("f4"), 100, "zlib", 2, clevel=7)
    carray("c_zstd_2d", rng.integers(0, 1 << 40, (500, 3)), 64, "zstd", 0, dflt=-1)
    carray("c_bool", rng.random(777) > 0.5, 100, "lz4", 1)
    carray("c_u16_one_chunk", np.arange(50, dtype="u2"), 64, "zstd", 1)

    t = bcolz.ctable([np.arange(333, dtype="i8"), np.linspace(0, 1, 333), rng.random(333) > 0.3],
                     names=["x", "y", "flag"], rootdir=os.path.join(store, "t_table"), mode="w",
                     chunklen=50, cparams=bcolz.cparams(cname="zlib"))
    t.attrs["title"] = "a table"
    t.flush()
    back = bcolz.open(os.path.join(store, "t_table"), mode="r")
    for col in back.names:
        save(expected, "t_table/" + col, back[col][:])
    made.append("t_table")

    def pack(name, arr, chunk_size, cname, checksum, offsets=True, shuffle=True):
        path = os.path.join(store, name)
        bp.pack_ndarray_to_file(arr, path, chunk_size=chunk_size,
                                blosc_args=bp.BloscArgs(typesize=arr.dtype.itemsize, clevel=6,
                                                        shuffle=shuffle, cname=cname),
                                bloscpack_args=bp.BloscpackArgs(offsets=offsets,
                                                                checksum=checksum))
        back = bp.unpack_ndarray_from_file(path)
        row = arr.dtype.itemsize * (int(np.prod(arr.shape[1:])) if arr.flags.c_contiguous
                                    else int(np.prod(arr.shape[:-1])))
        if arr.ndim > 1 and chunk_size % row != 0:
            # Chunks off whole rows: shown 1-D, in the stored order.
            back = back.ravel(order="C" if arr.flags.c_contiguous else "F")
        save(expected, name, back)
        made.append(name)

    # Every checksum, with and without offsets; each compressor.
    for i, ck in enumerate(CHECKSUMS):
        arr = rng.random((257, 6))
        pack(f"p_{ck}.blp", arr, 8 * 6 * 40, CNAMES[i % 4], ck, offsets=(i % 2 == 0))
    pack("p_exact.blp", np.arange(4096, dtype="i4"), 4 * 1024, "lz4", "crc32")
    pack("p_fortran.blp", np.asfortranarray(rng.random((30, 41))), 8 * 30 * 8, "zstd", "md5")
    pack("p_off_rows.blp", rng.integers(0, 255, (100, 7)).astype("u1"), 500, "zlib", "sha1")
    pack("p_nooffsets.blp", rng.integers(0, 9, (999,)).astype("i2"), 256, "blosclz", "adler32",
         offsets=False)
    # No metadata: bytes.
    raw = bytes(rng.integers(0, 256, 5000, dtype="u1"))
    bp.pack_bytes_to_file(raw, os.path.join(store, "p_bytes.blp"), chunk_size=1024)
    save(expected, "p_bytes.blp", np.frombuffer(bp.unpack_bytes_from_file(
        os.path.join(store, "p_bytes.blp"))[0], dtype="u1"))
    made.append("p_bytes.blp")
    # Neither metadata nor offsets: the frames are walked.
    raw = bytes(rng.integers(0, 4, 3000, dtype="u1"))
    path = os.path.join(store, "p_bare.blp")
    bp.pack_bytes_to_file(raw, path, chunk_size=700,
                          bloscpack_args=bp.BloscpackArgs(offsets=False, checksum="sha384"))
    save(expected, "p_bare.blp", np.frombuffer(bp.unpack_bytes_from_file(path)[0], dtype="u1"))
    made.append("p_bare.blp")
    print(json.dumps(made))


def names(expected):
    return sorted(f[:-4].replace("__", "/") for f in os.listdir(expected) if f.endswith(".npy"))


def read(mount, expected):
    import zarr

    major = int(zarr.__version__.split(".")[0])
    bad = []
    n = 0
    for name in names(expected):
        want = np.load(os.path.join(expected, name.replace("/", "__") + ".npy"))
        path = os.path.join(mount, name)
        z = zarr.open_array(path, mode="r")
        got = z[...]
        n += 1
        if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, want):
            bad.append(f"zarr {zarr.__version__}: {name}: {got.dtype}{got.shape} vs "
                       f"{want.dtype}{want.shape}")
        import dask.array as da
        d = da.from_zarr(path).compute()
        if not np.array_equal(d, want):
            bad.append(f"dask: {name}")
    # xarray: the ctable as a dataset (its group), every array through the root group.
    import xarray as xr
    kw = {"consolidated": False}
    if major >= 3:
        kw["zarr_format"] = 3
    ds = xr.open_zarr(os.path.join(mount, "t_table"), **kw)
    for col in ds.data_vars:
        want = np.load(os.path.join(expected, f"t_table__{col}.npy"))
        if not np.array_equal(ds[col].values, want):
            bad.append(f"xarray: t_table/{col}")
    root = xr.open_zarr(mount, **kw)
    for name in names(expected):
        if "/" in name:
            continue
        want = np.load(os.path.join(expected, name + ".npy"))
        if name not in root or not np.array_equal(root[name].values, want):
            bad.append(f"xarray: {name}")
    for b in bad:
        print("MISMATCH", b)
    print(f"read {n} arrays with zarr {zarr.__version__}, dask and xarray: "
          f"{len(bad)} mismatches")
    sys.exit(1 if bad else 0)


def copied(store, expected, names):
    """The containers copied (cp -r) into a writable mount: sharded v3 arrays now."""
    import zarr

    ok = 0
    for name in names:
        want = np.load(os.path.join(expected, name + ".npy"))
        z = zarr.open_array(os.path.join(store, name), mode="r")
        doc = json.load(open(os.path.join(store, name, "zarr.json")))
        sharded = doc["codecs"][0]["name"] == "sharding_indexed"
        if sharded and np.array_equal(z[...], want):
            ok += 1
        else:
            print(f"MISMATCH {name}: sharded {sharded}, shape {z.shape}")
    print(f"sharded and equal: {ok}")
    sys.exit(0 if ok == len(names) else 1)


def big(store, mib):
    import bcolz

    n = mib * (1 << 20) // 8
    data = np.linspace(0, 1, n) + (np.arange(n) % 17)
    bcolz.carray(data, rootdir=os.path.join(store, "big"), mode="w",
                 cparams=bcolz.cparams(clevel=5, cname="lz4", shuffle=1)).flush()


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "make":
        make(sys.argv[2], sys.argv[3])
    elif cmd == "read":
        read(sys.argv[2], sys.argv[3])
    elif cmd == "copied":
        copied(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif cmd == "big":
        big(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit(__doc__)
