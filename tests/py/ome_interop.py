#!/usr/bin/env python3
"""OME-Zarr through shardfs's v2 view: 0.5 images (Zarr v3, sharded) for 0.4 readers
(ome-zarr-py 0.10 with zarr 2), and 0.4 images written by them stored as 0.5.

Each subcommand runs under the Python that has the library it needs (.venv: zarr 3 and
ome-zarr-models; .venv-zarr2: zarr 2.18 and ome-zarr 0.10); values travel as .npz.

    make  --store DIR --out F.npz
          zarr-python 3 writes a sharded OME-Zarr 0.5 image at DIR: levels 0 and 1
          (uint16, c/y/x, shards (1,128,128), chunks (1,64,64)), omero channels, and a
          labels group with one label image (two levels, image-label). The metadata is
          validated with ome-zarr-models; the pixels go to F.
    read  --mount DIR --want F.npz
          ome-zarr-py 0.10 (zarr 2) opens DIR (a v2 mount of such a store): it must
          find the image and its label, every level equal to F, with the right scales.
    write --mount DIR --out F.npz
          ome-zarr-py 0.10 (zarr 2) writes an OME-Zarr 0.4 image with labels into DIR
          (an empty writable v2 mount); the pixels go to F.
    check --store DIR --want F.npz
          zarr-python 3 reads DIR (the store written through the mount) as OME-Zarr
          0.5: ome-zarr-models validates the image and the label image, and every
          level equals F.
    make-plate --store DIR --out F.npz
          zarr-python 3 writes a sharded OME-Zarr 0.5 plate (high-content screening):
          row A, columns 1 and 2, one field per well; validated with ome-zarr-models.
    read-plate --mount DIR --want F.npz
          ome-zarr-py 0.10 (zarr 2) opens DIR (a v2 mount of the plate): it must find
          the plate and show the wells side by side, equal to F.

Prints one line per check and "ome_interop: N passed, M failed"; exits 1 on any
failure.
"""

from __future__ import annotations

import argparse
import sys
import warnings

import numpy as np

warnings.filterwarnings("ignore")

PASSED: list[str] = []
FAILED: list[str] = []

AXES = [
    {"name": "c", "type": "channel"},
    {"name": "y", "type": "space", "unit": "micrometer"},
    {"name": "x", "type": "space", "unit": "micrometer"},
]
SCALES = [[1.0, 0.5, 0.5], [1.0, 1.0, 1.0]]


def check(what: str, good: bool, detail: object = "") -> None:
    (PASSED if good else FAILED).append(what)
    print(f"{'OK' if good else 'FAIL'} {what}{'' if good else f': {detail}'}")


def multiscales(name: str) -> list[dict]:
    return [
        {
            "name": name,
            "axes": AXES,
            "datasets": [
                {"path": str(i), "coordinateTransformations": [{"type": "scale", "scale": s}]}
                for i, s in enumerate(SCALES)
            ],
            "type": "mean",
        }
    ]


def pixels() -> dict[str, np.ndarray]:
    y, x = np.mgrid[0:256, 0:256]
    level0 = np.stack([(y * 256 + x) % 65521, (x * 7 + y * 3) % 4099]).astype("uint16")
    level1 = level0[:, ::2, ::2].copy()
    cells = ((y // 32) * 8 + x // 32 + 1).astype("uint32")[None]
    return {
        "0": level0,
        "1": level1,
        "labels/cells/0": cells,
        "labels/cells/1": cells[:, ::2, ::2].copy(),
    }


def make(args) -> None:
    import zarr

    data = pixels()
    root = zarr.open_group(args.store, mode="w", zarr_format=3)
    root.attrs["ome"] = {
        "version": "0.5",
        "multiscales": multiscales("image"),
        "omero": {
            "channels": [
                {"label": "A", "color": "FF0000", "active": True,
                 "window": {"start": 0, "end": 65535, "min": 0, "max": 65535}},
                {"label": "B", "color": "00FF00", "active": True,
                 "window": {"start": 0, "end": 4098, "min": 0, "max": 65535}},
            ]
        },
    }
    root.attrs["acquired_by"] = "shardfs tests"
    labels = root.create_group("labels")
    labels.attrs["ome"] = {"version": "0.5", "labels": ["cells"]}
    cells = labels.create_group("cells")
    cells.attrs["ome"] = {
        "version": "0.5",
        "multiscales": multiscales("cells"),
        "image-label": {
            "colors": [{"label-value": 1, "rgba": [255, 0, 0, 255]}],
            "source": {"image": "../../"},
        },
    }
    for path, arr in data.items():
        z = root.create_array(
            path,
            shape=arr.shape,
            dtype=arr.dtype,
            chunks=(1, 64, 64),
            shards=(1, 128, 128),
            dimension_names=["c", "y", "x"],
        )
        z[...] = arr
    np.savez(args.out, **{k.replace("/", "__"): v for k, v in data.items()})
    validate_05(args.store)


def validate_05(store: str) -> None:
    import zarr
    from ome_zarr_models.v05.image import Image
    from ome_zarr_models.v05.image_label import ImageLabel
    from ome_zarr_models.v05.labels import Labels

    root = zarr.open_group(store, mode="r")
    for what, model, path in [
        ("image", Image, ""),
        ("labels group", Labels, "labels"),
        ("label image", ImageLabel, "labels/cells"),
    ]:
        try:
            model.from_zarr(root[path] if path else root)
            check(f"ome-zarr-models validates the 0.5 {what}", True)
        except Exception as e:  # noqa: BLE001 - the validator's message is the detail
            check(f"ome-zarr-models validates the 0.5 {what}", False, e)


def read(args) -> None:
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Label, Multiscales, Reader

    want = np.load(args.want)
    location = parse_url(args.mount)
    check("ome-zarr 0.10 finds an OME-Zarr store", location is not None)
    if location is None:
        return
    check("it is read as OME-Zarr 0.4", location.fmt.version == "0.4", location.fmt.version)
    nodes = list(Reader(location)())
    images = [n for n in nodes if n.load(Multiscales) and not n.load(Label)]
    labels = [n for n in nodes if n.load(Label)]
    check("one image", len(images) == 1, [str(n) for n in nodes])
    check("one label image", len(labels) == 1, [str(n) for n in nodes])
    for prefix, found in [("", images), ("labels__cells__", labels)]:
        if not found:
            continue
        node = found[0]
        levels = node.data
        check(f"{prefix or 'image '}has 2 levels", len(levels) == 2, len(levels))
        for i, level in enumerate(levels):
            got = np.asarray(level.compute())
            exp = want[f"{prefix}{i}"]
            check(
                f"{prefix}{i} pixels equal the source",
                got.dtype == exp.dtype and np.array_equal(got, exp),
                (got.dtype, got.shape),
            )
        scales = [t[0]["scale"] for t in node.metadata["coordinateTransformations"]]
        check(f"{prefix or 'image '}scales", scales == SCALES, scales)
        axes = node.metadata["axes"]
        check(f"{prefix or 'image '}axes", [a["name"] for a in axes] == ["c", "y", "x"], axes)
    if images:
        channels = images[0].metadata.get("channel_names")
        check("omero channel names", channels == ["A", "B"], channels)


def write(args) -> None:
    import zarr
    from ome_zarr.io import parse_url
    from ome_zarr.scale import Scaler
    from ome_zarr.writer import write_image, write_labels

    data = pixels()
    store = parse_url(args.mount, mode="w").store
    root = zarr.group(store=store)
    scaler = Scaler(max_layer=1, method="nearest")
    write_image(
        image=data["0"],
        group=root,
        axes="cyx",
        scaler=scaler,
        coordinate_transformations=[[{"type": "scale", "scale": s}] for s in SCALES],
        storage_options={"chunks": (1, 64, 64)},
    )
    root.attrs["acquired_by"] = "shardfs tests"
    write_labels(
        labels=data["labels/cells/0"],
        group=root,
        name="cells",
        axes="cyx",
        scaler=scaler,
        coordinate_transformations=[[{"type": "scale", "scale": s}] for s in SCALES],
        storage_options={"chunks": (1, 64, 64)},
        label_metadata={"colors": [{"label-value": 1, "rgba": [255, 0, 0, 255]}]},
    )
    # What a 0.4 reader sees right away, through the same mount.
    from ome_zarr.reader import Multiscales, Reader

    nodes = list(Reader(parse_url(args.mount))())
    check(
        "the written image reads back through the mount",
        any(n.load(Multiscales) for n in nodes),
        [str(n) for n in nodes],
    )
    # The levels the writer made, by its own scaler.
    data["1"] = scaler.nearest(data["0"])[1]
    data["labels/cells/1"] = scaler.nearest(data["labels/cells/0"])[1]
    np.savez(args.out, **{k.replace("/", "__"): v for k, v in data.items()})


def check_store(args) -> None:
    import zarr

    want = np.load(args.want)
    root = zarr.open_group(args.store, mode="r")
    ome = root.attrs.asdict().get("ome", {})
    check("the stored image is OME-Zarr 0.5", ome.get("version") == "0.5", root.attrs.asdict())
    check("the other attributes are kept", root.attrs.get("acquired_by") == "shardfs tests")
    check(
        "no 0.4 keys are left at the top level",
        "multiscales" not in root.attrs and "version" not in ome.get("multiscales", [{}])[0],
        root.attrs.asdict(),
    )
    labels = root["labels"].attrs.asdict().get("ome", {})
    check("labels group lists cells", labels.get("labels") == ["cells"], labels)
    validate_05(args.store)
    for name in want.files:
        got = root[name.replace("__", "/")][...]
        exp = want[name]
        check(f"{name} pixels equal what was written", np.array_equal(got, exp), got.shape)


def make_plate(args) -> None:
    import zarr
    from ome_zarr_models.v05.hcs import HCS

    root = zarr.open_group(args.store, mode="w", zarr_format=3)
    root.attrs["ome"] = {
        "version": "0.5",
        "plate": {
            "name": "plate",
            "rows": [{"name": "A"}],
            "columns": [{"name": "1"}, {"name": "2"}],
            "wells": [
                {"path": "A/1", "rowIndex": 0, "columnIndex": 0},
                {"path": "A/2", "rowIndex": 0, "columnIndex": 1},
            ],
            "field_count": 1,
        },
    }
    fields = {}
    for col in ["1", "2"]:
        well = root.create_group(f"A/{col}")
        well.attrs["ome"] = {"version": "0.5", "well": {"images": [{"path": "0"}]}}
        image = well.create_group("0")
        image.attrs["ome"] = {
            "version": "0.5",
            "multiscales": [
                {
                    "axes": AXES,
                    "datasets": [
                        {
                            "path": "0",
                            "coordinateTransformations": [
                                {"type": "scale", "scale": [1.0, 0.5, 0.5]}
                            ],
                        }
                    ],
                }
            ],
        }
        pixels = (np.arange(64 * 64, dtype="uint16").reshape(1, 64, 64) + int(col) * 1000)
        z = image.create_array(
            "0",
            shape=pixels.shape,
            dtype=pixels.dtype,
            chunks=(1, 32, 32),
            shards=(1, 64, 64),
            dimension_names=["c", "y", "x"],
        )
        z[...] = pixels
        fields[col] = pixels
    np.savez(args.out, plate=np.concatenate([fields["1"], fields["2"]], axis=2))
    try:
        HCS.from_zarr(zarr.open_group(args.store, mode="r"))
        check("ome-zarr-models validates the 0.5 plate", True)
    except Exception as e:  # noqa: BLE001 - the validator's message is the detail
        check("ome-zarr-models validates the 0.5 plate", False, e)


def read_plate(args) -> None:
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Plate, Reader

    want = np.load(args.want)["plate"]
    location = parse_url(args.mount)
    check("ome-zarr 0.10 finds the plate store", location is not None)
    if location is None:
        return
    nodes = [n for n in Reader(location)() if n.load(Plate)]
    check("one plate", len(nodes) == 1, nodes)
    if not nodes:
        return
    plate = nodes[0]
    wells = plate.load(Plate).well_paths
    check("both wells", sorted(wells) == ["A/1", "A/2"], wells)
    got = np.asarray(plate.data[0].compute())
    check("the wells side by side equal the source", np.array_equal(got, want), got.shape)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("make")
    p.add_argument("--store", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("read")
    p.add_argument("--mount", required=True)
    p.add_argument("--want", required=True)
    p = sub.add_parser("write")
    p.add_argument("--mount", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("check")
    p.add_argument("--store", required=True)
    p.add_argument("--want", required=True)
    p = sub.add_parser("make-plate")
    p.add_argument("--store", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("read-plate")
    p.add_argument("--mount", required=True)
    p.add_argument("--want", required=True)
    args = ap.parse_args()
    {
        "make": make,
        "read": read,
        "write": write,
        "check": check_store,
        "make-plate": make_plate,
        "read-plate": read_plate,
    }[args.cmd](args)
    print(f"ome_interop: {len(PASSED)} passed, {len(FAILED)} failed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
