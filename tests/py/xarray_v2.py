#!/usr/bin/env python3
"""xarray on zarr 2 against shardfs's v2 view, with xarray on zarr 3 as the truth (issue 38).

Each subcommand runs under the Python that has the zarr it needs (.venv: zarr 3.1,
.venv-zarr2: zarr 2.18; both have xarray, dask and pandas). Values travel between
them as pickles of {variable: (dims, dtype, values, attrs)}: npz cannot hold object
(string) arrays without pickling anyway, and a pickle keeps datetime64 and NaT as they are.

    write STORE                 (zarr 3) xarray writes the dataset of dataset_v3() to a
                                plain directory STORE as Zarr v3: sharded and unsharded
                                variables, CF time, bool, int with all-zero chunks (not
                                stored), int64 coordinates, strings, explicit _FillValue
                                (NaN, and an int one for packed floats), an all-fill
                                variable with no chunk stored.
    expect STORE OUT.pkl        (zarr 3) xarray reads STORE directly: the ground truth.
    read-v2 MOUNT WANT.pkl      (zarr 2) xarray opens the v2 view at MOUNT with
                                consolidated True, None and False, and compares every
                                variable (dims, dtype, values, attributes) with WANT.
    write-v2 MOUNT/G OUT.pkl    (zarr 2) xarray to_zarr(mode="w") of dataset_v2() into
                                group G of a writable v2 view, read back through the view;
                                OUT: what was written. (Not the mount's root: mode "w"
                                removes the target directory first, and a mount point
                                cannot be removed: EBUSY.)
    check-v3 STORE/G WANT.pkl   (zarr 3) xarray reads group G of the store directly
                                (unmounted): every variable of WANT, every array sharded
                                v3, no v2 metadata file stored.
    dask-regions N MOUNT/G [MOUNT2/G]
                                (zarr 2) the standard region pattern: a template written
                                with compute=False, then N processes each to_zarr one
                                disjoint region (dask arrays), split between the mounts.
    read-v3 ROOT WANT.pkl       (zarr 3) xarray opens ROOT (the store, or a v3 view) with
                                consolidated True and None (its default), compares.
    write-v3 MOUNT/G OUT.pkl    (zarr 3) xarray writes a dataset, with its consolidated
                                metadata, through a writable v3 view; OUT: the truth.
    append-v2 MOUNT             (zarr 2) xarray appends two time steps along `time`
                                through a writable v2 view of what `write` made.
    check-append STORE WANT.pkl (zarr 3) xarray's default open of STORE (zarr 3 prefers
                                the consolidated metadata xarray kept in zarr.json)
                                sees the appended steps, with the values appended.
    regions-check N ROOT/G      (either) the N regions read back (a v2 mount under zarr 2,
                                the store under zarr 3) hold their values.

Prints "OK ..." or "FAIL ..." per check, then "xarray_v2: N passed, M failed"; exits 1
on any failure.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import warnings

import numpy as np

FAILED: list[str] = []
PASSED: list[str] = []


def ok(msg: str) -> None:
    PASSED.append(msg)
    print(f"OK {msg}", flush=True)


def fail(msg: str) -> None:
    FAILED.append(msg)
    print(f"FAIL {msg}", flush=True)


def finish() -> None:
    print(f"xarray_v2: {len(PASSED)} passed, {len(FAILED)} failed", flush=True)
    sys.exit(1 if FAILED else 0)


def zarr_major() -> int:
    import zarr

    return int(zarr.__version__.split(".")[0])


# --- the datasets ---------------------------------------------------------------------

T, Y, X = 6, 8, 10


def dataset_v3():
    """What xarray on zarr 3 writes to the store: one of each kind of variable that issue
    38 found changed in the v2 view, with the encodings that make xarray choose each v3
    fill value and `_FillValue` attribute. Seeded, so every run writes the same bytes."""
    import pandas as pd
    import xarray as xr

    rng = np.random.default_rng(38)
    time = pd.date_range("2020-01-01", periods=T, freq="6h", unit="ns")  # as xarray decodes
    temp = rng.normal(280, 10, (T, Y, X)).astype("float32")
    temp[0, 0, :3] = np.nan  # masked values: xarray keeps NaN as its _FillValue
    temp[3, 5, 5] = np.nan
    # Whole chunks of zeros (chunks (2, 4, 5)): zarr 3 does not store a chunk equal to
    # the fill value, so the v2 view has chunks missing that zarr 2 must read as 0.
    count = rng.integers(1, 100, (T, Y, X)).astype("int32")
    count[0:2, 0:4, 0:5] = 0
    count[4:6, 4:8, :] = 0
    count[3, 1, 1] = 0  # and a single zero in a stored chunk
    mask = rng.random((Y, X)) > 0.3  # False values: zarr 3's fill value for bool
    mask[0:4, 0:5] = False  # one whole chunk False: not stored
    precip = rng.gamma(2.0, 1.0, (T, Y, X))  # float64, unsharded
    precip[1, 2, 3] = np.nan
    names = np.array([f"station-{i}" + "é" * (i % 3) for i in range(X)], dtype=object)
    names[4] = ""  # an empty string: the v3 string fill value
    codes = np.array([f"c{i:02d}" for i in range(Y)], dtype="<U3")
    sst = rng.normal(15, 3, (T, Y, X))
    sst[:, 0, 0] = np.nan
    # Packed to int16 (scale 0.01, -9999 the fill): whole hundredths, which unpack exactly.
    level = rng.integers(-300, 500, (T, Y, X)) * 0.01
    # A whole chunk of 0.0, stored as int16 0 = zarr 3's fill value: not stored. zarr 3 reads
    # it as 0.0 (0 is not the -9999 _FillValue); a v2 view whose fill_value says -9999
    # must not let zarr 2 read that missing chunk as -9999, which xarray would mask.
    level[4:6, 0:4, 0:5] = 0.0
    level[2, :, 7] = np.nan
    empty = np.full((T, Y, X), np.nan, dtype="float32")  # every chunk the fill: none stored

    ds = xr.Dataset(
        {
            "temp": (("time", "y", "x"), temp, {"units": "K", "long_name": "temperature"}),
            "precip": (("time", "y", "x"), precip, {"units": "mm"}),
            "count": (("time", "y", "x"), count),
            "mask": (("y", "x"), mask),
            "name": (("x",), names),
            "code": (("y",), codes),
            "sst": (("time", "y", "x"), sst, {"units": "degC"}),
            "level": (("time", "y", "x"), level, {"units": "m"}),
            "empty": (("time", "y", "x"), empty),
        },
        coords={
            "time": time,
            "y": np.arange(Y, dtype="int64") * 100,
            "x": np.arange(X, dtype="int64") - 3,  # a 0 among them
        },
        attrs={"title": "shardfs issue 38", "source": "xarray_v2.py"},
    )
    encoding = {
        "temp": {"chunks": (2, 4, 5), "shards": (4, 8, 10)},
        "count": {"chunks": (2, 4, 5), "shards": (2, 8, 10)},
        "mask": {"chunks": (4, 5), "shards": (8, 10)},
        "precip": {"chunks": (2, 4, 5)},  # unsharded
        "name": {"chunks": (5,)},
        "code": {"chunks": (4,)},
        "sst": {"chunks": (2, 4, 5), "shards": (6, 8, 10), "_FillValue": np.nan},
        "level": {"chunks": (2, 4, 5), "shards": (2, 8, 10), "dtype": "int16",
                  "scale_factor": 0.01, "_FillValue": -9999},
        "empty": {"chunks": (2, 4, 5), "shards": (2, 8, 10), "_FillValue": np.nan},
        "time": {"units": "hours since 2020-01-01", "dtype": "int64", "chunks": (T,)},
        "y": {"chunks": (Y,)},
        "x": {"chunks": (X,)},
    }
    return ds, encoding


def dataset_v2():
    """What xarray on zarr 2 writes through a writable v2 view: the kinds of variable for
    which zarr 2's `.zarray` carries xarray's meaning (fill_value null for ints and bool,
    NaN for floats, -1 for a packed int), and object strings (`|O` + the vlen-utf8 filter).
    Fixed-width `<U` strings are written separately (see write_v2)."""
    import pandas as pd
    import xarray as xr

    rng = np.random.default_rng(3682)
    n, m = 12, 6
    wind = rng.normal(5, 2, (n, m)).astype("float32")
    wind[0, :2] = np.nan
    depth = rng.integers(400, 600, (n, m)) * 0.1  # packed: whole tenths unpack exactly
    depth[5, 5] = np.nan
    count = rng.integers(0, 4, (n, m)).astype("int32")
    count[:4, :3] = 0  # a whole chunk of zeros: zarr 2 writes it anyway (fill null)
    ok_ = rng.random((n, m)) > 0.5
    ok_[4:8, :] = False
    label = np.array([f"obs {i}" + "ü" * (i % 2) for i in range(n)], dtype=object)
    label[3] = ""
    ds = xr.Dataset(
        {
            "wind": (("n", "m"), wind, {"units": "m/s"}),
            "depth": (("n", "m"), depth, {"units": "m"}),
            "count": (("n", "m"), count),
            "ok": (("n", "m"), ok_),
            "label": (("n",), label),
        },
        coords={
            "n": np.arange(n, dtype="int64"),
            "m": np.arange(m, dtype="int64") * 10,
            "time": ("n", pd.date_range("2021-03-01", periods=n, freq="D", unit="ns")),
        },
        attrs={"made_by": "xarray + zarr 2"},
    )
    encoding = {
        "wind": {"chunks": (4, 3), "_FillValue": np.nan},
        "depth": {"chunks": (4, 3), "dtype": "int32", "scale_factor": 0.1, "_FillValue": -1},
        "count": {"chunks": (4, 3)},
        "ok": {"chunks": (4, 3)},
        "label": {"chunks": (4,)},
        "time": {"units": "days since 2021-01-01", "dtype": "int32", "chunks": (n,)},
    }
    return ds, encoding


def dataset_v2_fixed_strings():
    """xarray's default string type: numpy `<U` (zarr 2 `.zarray` dtype `<U5`; zarr 3
    `fixed_length_utf32`). Written by a second to_zarr (mode "a"), so that a view that
    refuses it loses only this check."""
    import xarray as xr

    return xr.Dataset({"tag": (("n",), np.array([f"t{i:03d}"[:5] for i in range(12)], dtype="<U5"))})


def dataset_v2_fixed_bytes():
    """Short byte strings: numpy `S` (zarr 2 `.zarray` dtype `|S3`; zarr 3
    `null_terminated_bytes`). Written by a to_zarr of its own (mode "a"), as above."""
    import xarray as xr

    codes = np.array([b"a", b"bc", b"def"] * 4, dtype="S3")
    return xr.Dataset({"code": (("n",), codes)})


# --- comparing ------------------------------------------------------------------------


def snapshot(ds) -> dict:
    """{name: (dims, dtype, values, attrs)} of every variable (coordinates too), as xarray
    decoded them."""
    out = {}
    for name, var in ds.variables.items():
        values = np.asarray(var.values)
        # zarr 3 reads a v3 `string` array as numpy's StringDType, zarr 2 reads `|O` as
        # object: both are strings of any length, compared as Python str.
        if values.dtype.kind == "T":
            values = values.astype(object)
        out[str(name)] = (tuple(var.dims), str(values.dtype), values, dict(var.attrs))
    return out


def isnull(a: np.ndarray) -> np.ndarray:
    import pandas as pd

    return np.asarray(pd.isnull(a), dtype=bool)


def value_diffs(want: np.ndarray, got: np.ndarray) -> str | None:
    """None when equal (NaN equals NaN, NaT equals NaT), else where and how they differ."""
    if want.shape != got.shape:
        return f"shape {want.shape} expected, got {got.shape}"
    nw, ng = isnull(want), isnull(got)
    try:
        eq = np.asarray(want == got, dtype=bool)
    except Exception:  # noqa: BLE001 - incomparable dtypes differ everywhere
        eq = np.zeros(want.shape, dtype=bool)
    same = (nw & ng) | (~nw & ~ng & eq)
    if bool(same.all()):
        return None
    bad = np.argwhere(~same) if want.ndim else [()]
    shown = ", ".join(
        f"[{','.join(map(str, i))}] {want[tuple(i)]!r} expected, got {got[tuple(i)]!r}" for i in bad[:4]
    )
    return f"{len(bad)} of {want.size} values differ: {shown}"


def attrs_equal(a: dict, b: dict) -> bool:
    if set(a) != set(b):
        return False
    for k in a:
        x, y = np.asarray(a[k]), np.asarray(b[k])
        if x.shape != y.shape or value_diffs(x, y) is not None:
            return False
    return True


def compare(label: str, want: dict, got: dict) -> None:
    """Every variable of `want` in `got` with its dims, dtype, values and attributes; no
    variable more. One line per variable; a failing one says exactly what differs."""
    for name in sorted(set(got) - set(want)):
        fail(f"{label} {name}: a variable xarray does not read from the truth")
    for name in sorted(want):
        if name not in got:
            fail(f"{label} {name}: missing (expected {want[name][1]} {want[name][0]})")
            continue
        (wd, wt, wv, wa), (gd, gt, gv, ga) = want[name], got[name]
        problems = []
        if wd != gd:
            problems.append(f"dims {wd} expected, got {gd}")
        if wt != gt:
            problems.append(f"dtype {wt} expected, got {gt}")
        d = value_diffs(wv, gv)
        if d:
            problems.append(d)
        if not attrs_equal(wa, ga):
            problems.append(f"attrs {wa} expected, got {ga}")
        if problems:
            fail(f"{label} {name}: " + "; ".join(problems))
        else:
            ok(f"{label} {name} ({gt} {gd})")


def open_read(root: str, consolidated, label: str):
    """xarray opens `root` (open_zarr: dask-backed, the way such users open stores) and
    loads it. Warnings are reported: xarray's fallback from consolidated=None when a store
    has no consolidated metadata is the "much slower" path that issue 38 names."""
    import xarray as xr

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ds = xr.open_zarr(root, consolidated=consolidated).load()
        except Exception as e:  # noqa: BLE001 - report it as the check's failure
            fail(f"{label}: open_zarr raised {type(e).__name__}: {str(e)[:300]}")
            return None
    for w in caught:
        text = str(w.message)
        if "consolidated" in text.lower() and issubclass(w.category, RuntimeWarning):
            fail(f"{label}: fell back from consolidated metadata: {text[:200]}")
        elif not issubclass(w.category, (DeprecationWarning, FutureWarning)):
            print(f"NOTE {label}: {w.category.__name__}: {text[:200]}")
    return ds


# --- subcommands ----------------------------------------------------------------------


def write(store: str) -> None:
    assert zarr_major() == 3, "write runs under zarr 3 (.venv)"
    ds, encoding = dataset_v3()
    # consolidated left at xarray's default: with zarr 3 that puts consolidated metadata
    # into the root zarr.json, as users' stores have it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(store, mode="w-", zarr_format=3, encoding=encoding)
    ok(f"wrote {store}: {', '.join(sorted(ds.variables))}")


V3_FILL = "__v3_fill_values__"  # a key of the truth pickle that is no variable


def expect(store: str, out: str) -> None:
    assert zarr_major() == 3, "expect runs under zarr 3 (.venv)"
    ds = open_read(store, None, "zarr 3 direct")
    if ds is None:
        finish()
    truth = snapshot(ds)
    # The truth is itself what was written: xarray on zarr 3 reads its own dataset back.
    compare("zarr 3 round trip", snapshot(dataset_v3()[0]), truth)
    # Each array's v3 fill value, for read-v2's check of the chunks the store lacks.
    truth[V3_FILL] = {}
    for name in truth:
        path = os.path.join(store, name, "zarr.json")
        if os.path.isfile(path):
            with open(path) as f:
                truth[V3_FILL][name] = json.load(f)["fill_value"]
    with open(out, "wb") as f:
        pickle.dump(truth, f)


def chunks_open(mount: str, v3_fill: dict) -> None:
    """zarr 2 reads a chunk that is not there as the `.zarray` fill_value, and with
    fill_value null as uninitialised memory (np.empty): a value test can pass by luck
    there (fresh memory is often zero). So, directly: every chunk of the grid of an array
    shown with fill_value null, or with another fill value than the store's `v3_fill`
    (xarray's `_FillValue` moved there), must open and read (the view makes up the
    chunks the store does not have)."""
    import itertools

    for name in sorted(os.listdir(mount)):
        path = os.path.join(mount, name, ".zarray")
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            meta = json.load(f)
        if meta["fill_value"] is not None and meta["fill_value"] == v3_fill.get(name):
            continue
        sep = meta.get("dimension_separator") or "."
        grid = [range(-(-n // c)) for n, c in zip(meta["shape"], meta["chunks"])]
        missing = []
        for idx in itertools.product(*grid):
            key = sep.join(map(str, idx)) if idx else "0"
            try:
                with open(os.path.join(mount, name, key), "rb") as f:
                    f.read()
            except OSError as e:
                missing.append(f"{key} ({e.strerror})")
        if missing:
            fail(f"{name} (fill_value {meta['fill_value']!r}): {len(missing)} chunk(s) do not "
                 f"open, zarr 2 reads them as the fill value or uninitialised memory: "
                 f"{', '.join(missing[:4])}")
        else:
            ok(f"{name} (fill_value {meta['fill_value']!r}): every chunk opens")


def read_v2(mount: str, want_path: str) -> None:
    assert zarr_major() == 2, "read-v2 runs under zarr 2 (.venv-zarr2)"
    with open(want_path, "rb") as f:
        want = pickle.load(f)
    chunks_open(mount, want.pop(V3_FILL, {}))
    for consolidated in (True, None, False):
        label = f"consolidated={consolidated}"
        ds = open_read(mount, consolidated, label)
        if ds is not None:
            compare(label, want, snapshot(ds))


def write_v2(mount: str, out: str) -> None:
    """xarray on zarr 2 writes dataset_v2() through the view at `mount`, and the same to a
    plain directory beside `out`: what xarray on zarr 2 reads from the plain directory is
    the truth for the view's read-back, and (saved to `out`) for zarr 3 on the store."""
    assert zarr_major() == 2, "write-v2 runs under zarr 2 (.venv-zarr2)"
    import tempfile

    ds, encoding = dataset_v2()
    # Four to_zarr calls, the later three appending (mode "a"): the dataset, its object
    # strings, `<U` strings, then `|S` bytes, so that a view refusing one kind of string
    # loses only that variable's checks, not the rest of the dataset.
    steps = [
        ("the dataset", ds.drop_vars("label"), "w",
         {k: v for k, v in encoding.items() if k != "label"}),
        ("object strings (label)", ds[["label"]].drop_vars("time"), "a",
         {"label": encoding["label"]}),
        ("<U5 strings (tag)", dataset_v2_fixed_strings(), "a", {}),
        ("|S3 bytes (code)", dataset_v2_fixed_bytes(), "a", {}),
    ]
    with tempfile.TemporaryDirectory() as plain:
        for _, part, mode, enc in steps:
            part.to_zarr(plain, mode=mode, encoding=enc)
        ref = open_read(plain, True, "plain directory")
        truth = snapshot(ref)
    with open(out, "wb") as f:
        pickle.dump(truth, f)
    for what, part, mode, enc in steps:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                part.to_zarr(mount, mode=mode, encoding=enc)
                ok(f"to_zarr (mode {mode}) of {what} through the view")
            except Exception as e:  # noqa: BLE001
                fail(f"to_zarr (mode {mode}) of {what} through the view raised "
                     f"{type(e).__name__}: {str(e)[:300]}")
    # An attribute set with zarr 2 directly, without consolidating again: a `.zmetadata`
    # kept as xarray wrote it would now be stale, one made from the hierarchy is not.
    import zarr

    try:
        zarr.open_group(mount, mode="a")["wind"].attrs["note"] = "set after to_zarr"
        ok("attribute set on wind after to_zarr (no re-consolidation)")
    except Exception as e:  # noqa: BLE001
        fail(f"setting an attribute on wind raised {type(e).__name__}: {str(e)[:300]}")
    dims, dtype, values, attrs = truth["wind"]
    truth["wind"] = (dims, dtype, values, {**attrs, "note": "set after to_zarr"})
    with open(out, "wb") as f:
        pickle.dump(truth, f)
    # Read-your-writes, the three ways xarray opens a store.
    for consolidated in (True, None, False):
        label = f"read back consolidated={consolidated}"
        got = open_read(mount, consolidated, label)
        if got is not None:
            compare(label, truth, snapshot(got))


def check_v3(store: str, want_path: str) -> None:
    """The store as zarr 3 sees it after xarray on zarr 2 wrote through the view: no v2
    file kept (.zmetadata included), every array sharded v3, every value as written."""
    assert zarr_major() == 3, "check-v3 runs under zarr 3 (.venv)"
    import zarr

    with open(want_path, "rb") as f:
        want = pickle.load(f)
    top = os.path.dirname(os.path.abspath(store))  # the whole store, not just the group
    kept = [os.path.relpath(os.path.join(d, n), top) for d, _, files in os.walk(top)
            for n in files if n in (".zarray", ".zattrs", ".zgroup", ".zmetadata")]
    if kept:
        fail(f"v2 metadata stored in the store: {sorted(kept)}")
    else:
        ok("no .zarray/.zattrs/.zgroup/.zmetadata in the store")
    for name in sorted(want):
        path = os.path.join(store, name, "zarr.json")
        try:
            with open(path) as f:
                meta = json.load(f)
        except OSError as e:
            fail(f"{name}: no zarr.json ({e})")
            continue
        codecs = [c["name"] for c in meta.get("codecs", [])]
        if "sharding_indexed" in codecs:
            ok(f"{name}: sharded v3 ({meta['data_type']}, fill_value {meta['fill_value']!r})")
        else:
            fail(f"{name}: not sharded: codecs {codecs}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            zarr.open_group(store, mode="r")
        except Exception as e:  # noqa: BLE001
            fail(f"zarr 3 open_group raised {type(e).__name__}: {str(e)[:300]}")
    for w in caught:
        if ".zmetadata" in str(w.message):
            fail(f"zarr 3 warns: {w.message}")
    got = open_read(store, False, "zarr 3 direct")
    if got is not None:
        compare("zarr 3 direct", want, snapshot(got))


# --- dask region writes ---------------------------------------------------------------

ROWS, COLS, CHUNK = 8, 12, (4, 6)  # each region: 2 x 2 chunks; shards hold several regions


def region_values(nregions: int):
    """The whole dataset the regions make up, a function of position only, so any process
    (and the check) computes the same values."""
    t = np.arange(nregions * ROWS)[:, None]
    x = np.arange(COLS)[None, :]
    a = (t * 100 + x + 0.5).astype("float32")
    a[(t + x) % 7 == 0] = np.nan
    b = (t * 1000 + x).astype("int32")
    return a, b


def region_dataset(nregions: int, lazy: bool):
    import dask.array as da
    import xarray as xr

    a, b = region_values(nregions)
    if lazy:
        a, b = da.from_array(a, chunks=CHUNK), da.from_array(b, chunks=CHUNK)
    return xr.Dataset(
        {"a": (("t", "x"), a), "b": (("t", "x"), b)},
        coords={"t": np.arange(nregions * ROWS, dtype="int64"),
                "x": np.arange(COLS, dtype="int64")},
    )


def region_worker(job):
    """One process: its region of the dataset, as dask arrays, to_zarr with region= (the
    coordinate `x` has no dimension in the region and is dropped, as xarray requires)."""
    i, nregions, mount = job
    ds = region_dataset(nregions, lazy=True)
    rows = slice(i * ROWS, (i + 1) * ROWS)
    part = ds.isel(t=rows).drop_vars("x")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        part.to_zarr(mount, region={"t": rows})
    return i


def dask_regions(nregions: int, mounts: list[str]) -> None:
    assert zarr_major() == 2, "dask-regions runs under zarr 2 (.venv-zarr2)"
    import multiprocessing

    ds = region_dataset(nregions, lazy=True)
    encoding = {"a": {"chunks": CHUNK, "_FillValue": np.nan}, "b": {"chunks": CHUNK}}
    # The template: metadata and coordinates now, no data chunk (compute=False).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(mounts[0], mode="w", compute=False, encoding=encoding)
    ok(f"template through {mounts[0]}")
    jobs = [(i, nregions, mounts[i % len(mounts)]) for i in range(nregions)]
    # spawn: a fresh interpreter per process, nothing of this one's open files shared.
    with multiprocessing.get_context("spawn").Pool(min(nregions, 8)) as pool:
        try:
            done = pool.map(region_worker, jobs)
            ok(f"{len(done)} region writes from {min(nregions, 8)} processes through "
               f"{len(mounts)} mount(s)")
        except Exception as e:  # noqa: BLE001
            fail(f"a region write raised {type(e).__name__}: {str(e)[:300]}")


def regions_check(nregions: int, root: str) -> None:
    """Every region of every variable as written, under whichever zarr is installed. A
    failure names the regions (processes) that lost values."""
    ds = open_read(root, None if zarr_major() == 2 else False, f"regions {root}")
    if ds is None:
        return
    want = region_dataset(nregions, lazy=False)
    for name in ("a", "b"):
        if name not in ds:
            fail(f"{name}: missing")
            continue
        w, g = want[name].values, ds[name].values
        if g.shape != w.shape:
            fail(f"{name}: shape {w.shape} expected, got {g.shape}")
            continue
        for i in range(nregions):
            rows = slice(i * ROWS, (i + 1) * ROWS)
            d = value_diffs(w[rows], g[rows])
            if d:
                fail(f"{name} region {i} (rows {rows.start}-{rows.stop - 1}): {d}")
        if str(g.dtype) != str(w.dtype):
            fail(f"{name}: dtype {w.dtype} expected, got {g.dtype}")
        else:
            ok(f"{name}: {nregions} regions checked ({g.dtype})")


def append_v2(mount: str) -> None:
    """xarray on zarr 2 appends, through the writable view at `mount`, the first two time
    steps again (times moved past the end) to every variable along `time` of what
    `write` made (xarray on zarr 3, which keeps its consolidated metadata inline in the
    root `zarr.json`)."""
    assert zarr_major() == 2, "append-v2 runs under zarr 2 (.venv-zarr2)"
    import xarray as xr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = xr.open_zarr(mount, consolidated=False)
        timed = [v for v in ds.data_vars if "time" in ds[v].dims]
        new = ds[timed].isel(time=slice(0, 2)).load()
        step = ds.time.values[1] - ds.time.values[0]
        new = new.assign_coords(time=new.time + (ds.time.values[-1] - ds.time.values[0] + step))
        for v in new.variables.values():
            v.encoding = {}
        try:
            new.to_zarr(mount, mode="a", append_dim="time")
            ok(f"appended 2 time steps to {len(timed)} variables through the view")
        except Exception as e:  # noqa: BLE001
            fail(f"to_zarr(mode='a', append_dim='time') raised {type(e).__name__}: {str(e)[:300]}")


def check_append(store: str, want_path: str) -> None:
    """zarr 3 with its defaults (xarray's `open_zarr`, which prefers the consolidated
    metadata it wrote) sees the append `append-v2` made through the v2 view: the time
    steps, and the appended values equal to the first two steps (`want_path`: `expect`'s
    truth of the store before the append)."""
    assert zarr_major() == 3, "check-append runs under zarr 3 (.venv)"
    import xarray as xr

    with open(want_path, "rb") as f:
        want = pickle.load(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = xr.open_zarr(store)
    n = len(want["time"][2])
    if ds.sizes.get("time") != n + 2:
        fail(f"zarr 3's default open sees {ds.sizes.get('time')} time steps, {n + 2} expected "
             "(consolidated metadata that no longer describes the store?)")
        return
    ok(f"zarr 3's default open sees {n + 2} time steps")
    for name, entry in want.items():
        if name == V3_FILL:
            continue
        dims, _, values, _ = entry
        if "time" not in dims or name == "time":
            continue
        got = ds[name].isel(time=slice(n, n + 2)).values
        d = value_diffs(np.take(values, [0, 1], axis=dims.index("time")), got)
        if d:
            fail(f"{name}: appended steps differ: {d}")
        else:
            ok(f"{name}: appended steps as written")


def read_v3(root: str, want_path: str) -> None:
    """xarray on zarr 3 opens `root` (the store, or a v3 view of it) with consolidated
    True and None (its default: the consolidated metadata kept in `zarr.json`) and
    compares every variable with WANT."""
    assert zarr_major() == 3, "read-v3 runs under zarr 3 (.venv)"
    with open(want_path, "rb") as f:
        want = pickle.load(f)
    want.pop(V3_FILL, None)
    for consolidated in (True, None):
        label = f"zarr 3 consolidated={consolidated} on {os.path.basename(root)}"
        got = open_read(root, consolidated, label)
        if got is not None:
            compare(label, want, snapshot(got))


def write_v3(root: str, out: str) -> None:
    """xarray on zarr 3 writes a dataset to `root` (a group of a writable v3 view) as
    Zarr v3 with its consolidated metadata; OUT: what xarray reads of it from a plain
    directory (the truth for `read-v3` of the store)."""
    assert zarr_major() == 3, "write-v3 runs under zarr 3 (.venv)"
    import tempfile

    ds = dataset_v3()[0]
    ds = ds[[v for v in ds.data_vars if ds[v].dtype.kind in "fiub"]]
    for v in ds.variables.values():
        v.encoding = {}
    with tempfile.TemporaryDirectory() as plain, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(plain, zarr_format=3)
        truth = snapshot(open_read(plain, None, "plain directory"))
        try:
            ds.to_zarr(root, zarr_format=3)
            ok(f"to_zarr through the v3 view ({len(ds.data_vars)} variables)")
        except Exception as e:  # noqa: BLE001
            fail(f"to_zarr through the v3 view raised {type(e).__name__}: {str(e)[:300]}")
    with open(out, "wb") as f:
        pickle.dump(truth, f)


def main() -> None:
    argv = sys.argv[1:]
    if not argv:
        sys.exit(__doc__)
    cmd, rest = argv[0], argv[1:]
    if cmd == "write" and len(rest) == 1:
        write(rest[0])
    elif cmd == "expect" and len(rest) == 2:
        expect(*rest)
    elif cmd == "read-v2" and len(rest) == 2:
        read_v2(*rest)
    elif cmd == "write-v2" and len(rest) == 2:
        write_v2(*rest)
    elif cmd == "check-v3" and len(rest) == 2:
        check_v3(*rest)
    elif cmd == "read-v3" and len(rest) == 2:
        read_v3(*rest)
    elif cmd == "write-v3" and len(rest) == 2:
        write_v3(*rest)
    elif cmd == "append-v2" and len(rest) == 1:
        append_v2(rest[0])
    elif cmd == "check-append" and len(rest) == 2:
        check_append(*rest)
    elif cmd == "dask-regions" and len(rest) in (2, 3):
        dask_regions(int(rest[0]), rest[1:])
    elif cmd == "regions-check" and len(rest) == 2:
        regions_check(int(rest[0]), rest[1])
    else:
        sys.exit(__doc__)
    finish()


if __name__ == "__main__":
    main()
