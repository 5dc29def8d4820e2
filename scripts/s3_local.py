#!/usr/bin/env python3
"""A local S3 endpoint for shardfs's tests, and the few bucket chores they need.

Used by the tests (tests/s3.rs) and the benchmarks scripts/bench_s3.py and
scripts/s3_soak.py: shared, so it stays in scripts/ (the tests' own helpers are in tests/py/).

    serve  [--bucket NAME ...] [--outage-file PATH] [--threaded] [--request-log FILE]
        moto's S3 server on 127.0.0.1 (a free port), serving ONE REQUEST AT A TIME:
        moto's default threaded server checks If-Match without a lock, so two racing
        conditional PUTs could both succeed, which real S3 never allows. Creates the
        buckets, prints "ready http://127.0.0.1:PORT" and serves until killed. While
        the file PATH exists, every request is answered 503 (an outage, for tests; the
        bucket's objects are kept).
        --threaded: a thread per request instead (for scripts/bench_s3.py), ONLY for
        single-writer use: two writers racing conditional PUTs to one key could both
        win there. Readers, and one writer at a time, are served correctly.
        --request-log FILE: append a line per request to FILE, tab-separated: method,
        path (with its query), Range header ("-" if none), status, bytes of the
        response body (Content-Length, or counted).
    upload   --endpoint URL --to BUCKET/PREFIX DIR     every file of DIR, as objects
    download --endpoint URL --from BUCKET/PREFIX DIR   every object below PREFIX, as files
    keys     --endpoint URL --from BUCKET/PREFIX       the keys below PREFIX, one a line

Credentials are moto's dummies (any key is accepted).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading


def client(endpoint: str):
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="test",
        aws_secret_access_key="test",
        region_name="us-east-1",
    )


def serve(args) -> None:
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    app = DomainDispatcherApplication(create_backend_app)
    if args.outage_file:
        app = with_outage(app, args.outage_file)
    if args.request_log:
        app = with_request_log(app, args.request_log)
    server = make_server("127.0.0.1", 0, app, threaded=args.threaded)
    endpoint = f"http://127.0.0.1:{server.server_port}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    s3 = client(endpoint)
    for bucket in args.bucket or []:
        s3.create_bucket(Bucket=bucket)
    print(f"ready {endpoint}", flush=True)
    thread.join()


def with_outage(app, path: str):
    """`app`, answering 503 to every request while `path` exists."""

    def wrapped(environ, start_response):
        if not os.path.exists(path):
            return app(environ, start_response)
        start_response("503 Service Unavailable", [("Content-Type", "application/xml")])
        return [
            b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>ServiceUnavailable"
            b"</Code><Message>an outage made by the test</Message></Error>"
        ]

    return wrapped


def with_request_log(app, path: str):
    """`app`, appending method, path, Range, status and body bytes of each request to
    the file `path` (one line each, tab-separated)."""
    lock = threading.Lock()
    log = open(path, "a", buffering=1)

    def wrapped(environ, start_response):
        seen = {}

        def start(status, headers, exc_info=None):
            seen["status"] = status.split(" ", 1)[0]
            for k, v in headers:
                if k.lower() == "content-length":
                    seen["len"] = int(v)
            return start_response(status, headers, exc_info)

        body = app(environ, start)
        chunks = list(body)
        if hasattr(body, "close"):
            body.close()
        n = seen.get("len")
        if n is None:
            n = sum(len(c) for c in chunks)
        if environ["REQUEST_METHOD"] == "HEAD":
            n = 0
        path_q = environ.get("PATH_INFO", "")
        if environ.get("QUERY_STRING"):
            path_q += "?" + environ["QUERY_STRING"]
        line = "\t".join((environ["REQUEST_METHOD"], path_q, environ.get("HTTP_RANGE", "-"),
                          seen.get("status", "?"), str(n)))
        with lock:
            log.write(line + "\n")
        return chunks

    return wrapped


def split(target: str) -> tuple[str, str]:
    bucket, _, prefix = target.partition("/")
    return bucket, prefix.strip("/")


def upload(args) -> None:
    s3 = client(args.endpoint)
    bucket, prefix = split(args.to)
    n = 0
    for dirpath, _, files in os.walk(args.dir):
        for f in files:
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, args.dir)
            key = f"{prefix}/{rel}" if prefix else rel
            with open(path, "rb") as fh:
                s3.put_object(Bucket=bucket, Key=key, Body=fh.read())
            n += 1
    print(f"uploaded {n} objects")


def objects(endpoint: str, target: str):
    s3 = client(endpoint)
    bucket, prefix = split(target)
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=f"{prefix}/" if prefix else ""
    )
    for page in pages:
        for o in page.get("Contents", []):
            yield s3, bucket, o["Key"], o["Key"][len(prefix) + 1 if prefix else 0 :]


def download(args) -> None:
    n = 0
    for s3, bucket, key, rel in objects(args.endpoint, args.source):
        path = os.path.join(args.dir, rel)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        n += 1
    print(f"downloaded {n} objects")


def keys(args) -> None:
    for _, _, _, rel in objects(args.endpoint, args.source):
        print(rel)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("serve")
    p.add_argument("--bucket", action="append")
    p.add_argument("--outage-file")
    p.add_argument("--threaded", action="store_true")
    p.add_argument("--request-log")
    p = sub.add_parser("upload")
    p.add_argument("--endpoint", required=True)
    p.add_argument("--to", required=True)
    p.add_argument("dir")
    p = sub.add_parser("download")
    p.add_argument("--endpoint", required=True)
    p.add_argument("--from", dest="source", required=True)
    p.add_argument("dir")
    p = sub.add_parser("keys")
    p.add_argument("--endpoint", required=True)
    p.add_argument("--from", dest="source", required=True)
    args = ap.parse_args()
    {"serve": serve, "upload": upload, "download": download, "keys": keys}[args.cmd](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
