#!/usr/bin/env python3
"""A TCP proxy that adds a round trip's latency to every HTTP request (issue 34).

    latency_proxy.py --to HOST:PORT --delay-ms D [--port 0]

Listens on 127.0.0.1 (prints `ready http://127.0.0.1:PORT` once it does) and forwards
each connection to HOST:PORT. Each request on a connection (the first bytes the client
sends after the server answered, or after connecting) waits D ms before it goes on: a
request costs D more, whatever its size, as a request to a far endpoint does. Connections
stay open as long as both sides keep them (keep-alive is what real clients use), and
any number of them may be in flight at once, as on a real network.

Used by `scripts/bench_s3_latency.py`; stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
               turn: dict, delay: float, upstream: bool) -> None:
    """Copy reader to writer. Upstream (client to server), the first bytes of each new
    request wait `delay`; downstream, any answer marks the next client bytes a new
    request."""
    try:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                break
            if upstream:
                if turn["answered"]:
                    turn["answered"] = False
                    if delay > 0:
                        await asyncio.sleep(delay)
            else:
                turn["answered"] = True
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        try:
            writer.close()
        except Exception:  # noqa: BLE001 - the other side went first
            pass


async def serve(target: tuple[str, int], port: int, delay: float) -> None:
    async def handle(creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        try:
            sreader, swriter = await asyncio.open_connection(*target)
        except OSError:
            cwriter.close()
            return
        turn = {"answered": True}
        try:
            await asyncio.gather(
                pipe(creader, swriter, turn, delay, upstream=True),
                pipe(sreader, cwriter, turn, delay, upstream=False),
            )
        except asyncio.CancelledError:  # stopping: connections still open go with it
            pass

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
    bound = server.sockets[0].getsockname()[1]
    print(f"ready http://127.0.0.1:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--to", required=True, help="HOST:PORT of the endpoint")
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    host, _, port = args.to.rpartition(":")
    asyncio.run(serve((host, int(port)), args.port, args.delay_ms / 1000))
    return 0


if __name__ == "__main__":
    sys.exit(main())
