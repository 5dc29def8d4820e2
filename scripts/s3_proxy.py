#!/usr/bin/env python3
"""A TCP proxy in front of an S3 endpoint that adds latency to every request and, on
demand, fails the way networks and endpoints fail (issue 34).

Used by the tests (tests/s3.rs) and the benchmark scripts/bench_s3_latency.py: shared,
so it stays in scripts/ (the tests' own helpers are in tests/py/).

    s3_proxy.py --to HOST:PORT [--delay-ms D] [--fault-file PATH] [--port 0]

Listens on 127.0.0.1 (prints `ready http://127.0.0.1:PORT` once it does) and forwards
each connection to HOST:PORT. Stops on SIGTERM or SIGINT.

Latency: each request on a connection (the first bytes the client sends after the
server answered, or after connecting) waits D ms before it goes on, so a request costs D
more, whatever its size, as a request to a far endpoint does. Connections stay open as
long as both sides keep them (keep-alive is what real clients use), and any number of
them may be in flight at once, as on a real network.

Faults: while the file PATH exists, its first word says what every new request meets
(a request already forwarded is answered as usual):
    stall   taken and never answered (the connection is closed once the fault ends)
    reset   the connection is reset (TCP RST) before it is forwarded
    503     answered `503 Service Unavailable` (S3's SlowDown), connection closed
    down    nothing listens on the port: connections are refused; open ones are reset
            at their next request
The file is read again every 20 ms and at each request, so a test switches faults by
writing it and ends them by removing it. Used by `tests/s3.rs` and
`scripts/bench_s3_latency.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import struct
import sys

ANSWER_503 = (
    b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
    b"<Message>Please reduce your request rate (a fault made by the test)</Message></Error>"
)
POLL = 0.02


class Faults:
    """The fault the file names now (None: healthy)."""

    def __init__(self, path: str | None):
        self.path = path

    def now(self) -> str | None:
        if not self.path:
            return None
        try:
            with open(self.path) as f:
                words = f.read().split()
        except FileNotFoundError:
            return None
        return words[0] if words else "503"


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST, not a FIN."""
    sock = writer.get_extra_info("socket")
    try:
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    writer.transport.abort()


async def meet_fault(fault: str, faults: Faults, cwriter: asyncio.StreamWriter) -> None:
    """Fail the client's connection as `fault` says."""
    if fault == "stall":
        while faults.now() == "stall":
            await asyncio.sleep(POLL)
        reset(cwriter)
    elif fault == "503":
        cwriter.write(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\n"
            + f"Content-Length: {len(ANSWER_503)}\r\n".encode()
            + b"Connection: close\r\n\r\n" + ANSWER_503
        )
        try:
            await cwriter.drain()
        except ConnectionError:
            pass
        cwriter.close()
    else:  # reset, down, anything else: the connection is reset
        reset(cwriter)


def quick_ack(reader: asyncio.StreamReader) -> None:
    """Acknowledge what the endpoint sends at once. s3s-fs writes an answer's headers and
    its body apart without TCP_NODELAY: Nagle holds a small body back until the headers
    are acknowledged, and a delayed ACK takes 40 ms, so every small GET took 40 ms more
    than a HEAD, with or without the proxy (the kernel leaves quick-ACK mode by itself,
    so it is set again after each read)."""
    sock = reader._transport.get_extra_info("socket") if reader._transport else None  # noqa: SLF001
    if sock is not None and hasattr(socket, "TCP_QUICKACK"):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        except OSError:
            pass


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, turn: dict,
               delay: float, upstream: bool, faults: Faults,
               cwriter: asyncio.StreamWriter) -> None:
    """Copy reader to writer. Upstream (client to server), the first bytes of each new
    request meet the fault of the moment, then wait `delay`; downstream, any answer marks
    the next client bytes a new request."""
    try:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                break
            if not upstream:
                quick_ack(reader)
            if upstream:
                if turn["answered"]:
                    turn["answered"] = False
                    fault = faults.now()
                    if fault:
                        turn["failed"] = True
                        await meet_fault(fault, faults, cwriter)
                        break
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


async def serve(target: tuple[str, int], port: int, delay: float, faults: Faults) -> None:
    async def handle(creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        if faults.now() == "down":  # accepted in the moment the fault began
            reset(cwriter)
            return
        try:
            sreader, swriter = await asyncio.open_connection(*target)
        except OSError:
            reset(cwriter)
            return
        quick_ack(sreader)
        turn = {"answered": True, "failed": False}
        try:
            await asyncio.gather(
                pipe(creader, swriter, turn, delay, True, faults, cwriter),
                pipe(sreader, cwriter, turn, delay, False, faults, cwriter),
            )
        except asyncio.CancelledError:  # stopping: connections still open go with it
            pass

    async def listen(at: int) -> asyncio.base_events.Server:
        return await asyncio.start_server(handle, "127.0.0.1", at, backlog=1024,
                                          reuse_address=True)

    server = await listen(port)
    bound = server.sockets[0].getsockname()[1]
    print(f"ready http://127.0.0.1:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    while not stop.is_set():
        down = faults.now() == "down"
        if down and server is not None:
            server.close()  # no wait_closed: on 3.12 it waits for open connections
            server = None
        elif not down and server is None:
            while server is None and not stop.is_set():
                try:
                    server = await listen(bound)
                except OSError:  # the port is still held for a moment
                    await asyncio.sleep(POLL)
        try:
            await asyncio.wait_for(stop.wait(), POLL)
        except asyncio.TimeoutError:
            pass
    if server is not None:
        server.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--to", required=True, help="HOST:PORT of the endpoint")
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--fault-file", help="while it exists, its first word is the fault")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    host, _, port = args.to.rpartition(":")
    asyncio.run(serve((host, int(port)), args.port, args.delay_ms / 1000,
                      Faults(args.fault_file)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
