"""A reader beside a writer in one mount: how often a read returns bytes never written.

One thread rewrites a file in place, over and over (open with O_TRUNC, one write of
4 KiB of one byte value, close; no fsync), while this thread opens the file and reads it
with one os.read. On a plain directory a read returns the empty file or one version.
Through FUSE (no writeback cache), a read can return a page of zeros: the kernel fills
a page whose read came back short (the file was just truncated) with zeros, and keeps
the size it had when an attribute changed meanwhile. docs/SEMANTICS.md ("A reader beside
a writer in the same mount") quotes what this prints.

    python3 tests/py/torn_read.py DIR [SECONDS] [--array]

DIR: a plain directory, a shardfs mount, or `examples/fuse_floor --keep-bytes
[--drop-cache]` mounted over an empty directory (a FUSE file system that does nothing
else). `--array` (shardfs): make a Zarr v3 array `a` through the mount and rewrite its
chunk `a/c/0`; otherwise the file is `torn_read.bin` at DIR's top. A measurement, not a
test: it prints the counts and exits 0.
"""

import json
import os
import sys
import threading
import time

N = 4096


def make_array(mnt):
    arr = os.path.join(mnt, "a")
    os.makedirs(os.path.join(arr, "c"), exist_ok=True)
    meta = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [N * 64],
        "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [N]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0,
        "codecs": [{"name": "bytes"}],
        "attributes": {},
    }
    with open(os.path.join(arr, "zarr.json"), "w") as f:
        json.dump(meta, f)
    return os.path.join(arr, "c", "0")


def main():
    args = [a for a in sys.argv[1:] if a != "--array"]
    if not args:
        sys.exit(__doc__)
    secs = float(args[1]) if len(args) > 1 else 10.0
    if "--array" in sys.argv:
        path = make_array(args[0])
    else:
        path = os.path.join(args[0], "torn_read.bin")
    with open(path, "wb") as f:
        f.write(bytes([1]) * N)
    stop = threading.Event()
    writes = [0]

    def writer():
        while not stop.is_set():
            writes[0] += 1
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
            os.write(fd, bytes([writes[0] % 250 + 1]) * N)
            os.close(fd)

    t = threading.Thread(target=writer)
    t.start()
    reads = empty = torn = zeros = 0
    end = time.monotonic() + secs
    try:
        while time.monotonic() < end:
            fd = os.open(path, os.O_RDONLY)
            b = os.read(fd, 2 * N)
            os.close(fd)
            reads += 1
            if not b:
                empty += 1
            elif b.count(b[0]) != len(b) or b[0] == 0:
                torn += 1
                zeros += b.count(0) == len(b)
    finally:
        stop.set()
        t.join()
    os.unlink(path)
    print(
        f"{path}: {reads} reads beside {writes[0]} rewrites: {empty} empty, "
        f"{torn} never written ({zeros} of them all zeros)"
    )


if __name__ == "__main__":
    main()
