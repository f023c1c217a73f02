#!/usr/bin/env python3
"""faultproxy: a fault-injecting TCP proxy for end-to-end tests.

Python 3.11+, standard library only. Started as a subprocess by tests:

    python3 tools/faultproxy.py --listen 127.0.0.1:0 --target HOST:PORT \\
        --ready-file PATH [options]

It listens, writes "HOST:PORT\\n" (the address actually bound) atomically to
--ready-file (temporary file, then rename) once it accepts connections, and
forwards every accepted connection to --target in both directions until it is
killed. SIGTERM or SIGINT make it drop every connection and exit 0 at once.

Faults (applied to the FIRST accepted connection only, unless --every):

  --cut-after N        after exactly N bytes have been forwarded client->server,
                       cut the connection: the client side is reset (SO_LINGER 0,
                       so the client sees ECONNRESET), the server side is closed
                       after those N bytes were handed to the kernel (so the
                       server receives exactly N bytes, then EOF; see
                       --server-close). N = 0 cuts right after the upstream
                       connection is made.
  --cut-random SEED --cut-min A --cut-max B
                       like --cut-after with N drawn uniformly from [A, B] by
                       random.Random(SEED) (one draw per faulted connection, in
                       accept order).
  --corrupt-at N       xor 0x01 into the client->server byte at offset N
                       (0-based, from the start of the connection's stream).
  --delay-ms MS        deliver every forwarded segment MS milliseconds after it
                       was read, in both directions, order preserved (latency,
                       not bandwidth; in-flight bytes per direction are bounded
                       by --max-inflight).
  --every              apply the faults to every connection.
  --log PATH           append one line per finished connection:
                       conn=K peer=IP:PORT c2s=BYTES s2c=BYTES fault=... end=... secs=...
                       fault is "none" or a comma list of what fired:
                       cut@N, corrupt@N, delay=MSms; "cut-unreached@N" when the
                       client sent fewer than N bytes.

Memory is bounded: at most 256 KiB is read at a time and writes wait for
drain() before the next read (backpressure); with --delay-ms, at most
--max-inflight bytes per direction are queued.
"""
from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import random
import signal
import socket
import struct
import sys
import termios
import time

READ_SIZE = 256 * 1024
SIOCOUTQ = termios.TIOCOUTQ  # unacknowledged bytes in a TCP socket's send queue (Linux)


def parse_addr(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="fault-injecting TCP proxy for end-to-end tests")
    p.add_argument("--listen", type=parse_addr, default=("127.0.0.1", 0), help="HOST:PORT (default 127.0.0.1:0)")
    p.add_argument("--target", type=parse_addr, required=True, help="HOST:PORT to forward to")
    p.add_argument("--ready-file", required=True, help="written atomically with 'HOST:PORT\\n' once listening")
    p.add_argument("--cut-after", type=int, metavar="BYTES")
    p.add_argument("--cut-random", type=int, metavar="SEED")
    p.add_argument("--cut-min", type=int, metavar="A")
    p.add_argument("--cut-max", type=int, metavar="B")
    p.add_argument("--corrupt-at", type=int, metavar="BYTES")
    p.add_argument("--delay-ms", type=float, default=0.0, metavar="MS")
    p.add_argument("--every", action="store_true", help="fault every connection, not only the first")
    p.add_argument("--log", metavar="PATH", help="append one line per connection")
    p.add_argument("--server-close", choices=("fin", "rst"), default="fin",
                   help="how a cut closes the server side: 'fin' (default; the server reads exactly the "
                        "cut bytes, then EOF) or 'rst' (reset once the server's kernel acknowledged them)")
    p.add_argument("--max-inflight", type=int, default=16 * 1024 * 1024, metavar="BYTES",
                   help="with --delay-ms, the most bytes queued per direction (default 16 MiB)")
    a = p.parse_args(argv)
    if a.cut_after is not None and a.cut_random is not None:
        p.error("--cut-after and --cut-random are exclusive")
    if a.cut_random is not None:
        if a.cut_min is None or a.cut_max is None:
            p.error("--cut-random needs --cut-min and --cut-max")
        if a.cut_min < 0 or a.cut_max < a.cut_min:
            p.error("need 0 <= --cut-min <= --cut-max")
    elif a.cut_min is not None or a.cut_max is not None:
        p.error("--cut-min/--cut-max need --cut-random")
    for name in ("cut_after", "corrupt_at"):
        v = getattr(a, name)
        if v is not None and v < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0")
    if a.delay_ms < 0:
        p.error("--delay-ms must be >= 0")
    if a.max_inflight < READ_SIZE:
        p.error(f"--max-inflight must be >= {READ_SIZE}")
    return a


class Cut(Exception):
    """Raised inside the client->server pump when the cut point is reached."""


class Connection:
    def __init__(self, proxy: "Proxy", cid: int, reader, writer, faulted: bool):
        self.proxy = proxy
        self.cid = cid
        self.c_reader = reader
        self.c_writer = writer
        self.s_reader = None
        self.s_writer = None
        self.c2s = 0
        self.s2c = 0
        self.faults: list[str] = []
        self.end = "open"
        self.start = time.monotonic()
        a = proxy.args
        self.cut_at = None
        self.corrupt_at = None
        self.delay = 0.0
        if faulted:
            if a.cut_after is not None:
                self.cut_at = a.cut_after
            elif a.cut_random is not None:
                self.cut_at = proxy.rng.randint(a.cut_min, a.cut_max)
            self.corrupt_at = a.corrupt_at
            self.delay = a.delay_ms / 1000.0
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"

    # -- fault logic, applied at the moment bytes are forwarded client->server --
    async def forward_c2s(self, data: bytes) -> None:
        start = self.c2s
        cut = self.cut_at is not None and start + len(data) >= self.cut_at
        if cut:
            data = data[: self.cut_at - start]
        if self.corrupt_at is not None and start <= self.corrupt_at < start + len(data):
            buf = bytearray(data)
            buf[self.corrupt_at - start] ^= 0x01
            data = bytes(buf)
            self.faults.append(f"corrupt@{self.corrupt_at}")
        if cut:
            if data:
                self.s_writer.write(data)
                self.c2s += len(data)
            raise Cut()
        self.s_writer.write(data)
        self.c2s += len(data)
        await self.s_writer.drain()

    async def forward_s2c(self, data: bytes) -> None:
        self.c_writer.write(data)
        self.s2c += len(data)
        await self.c_writer.drain()

    # -- pumps --
    async def pump(self, reader, forward, writer) -> None:
        """Copy reader -> writer until EOF, then half-close the writer."""
        if self.delay <= 0:
            while True:
                data = await reader.read(READ_SIZE)
                if not data:
                    break
                await forward(data)
            await self.half_close(writer)
            return
        # Latency emulation: a producer stamps each segment with its due time,
        # a consumer delivers them in order once due. In-flight bytes are bounded.
        queue: asyncio.Queue = asyncio.Queue()
        inflight = 0
        room = asyncio.Condition()
        limit = self.proxy.args.max_inflight

        async def produce():
            nonlocal inflight
            while True:
                data = await reader.read(READ_SIZE)
                due = time.monotonic() + self.delay
                if not data:
                    queue.put_nowait((due, None))
                    return
                async with room:
                    await room.wait_for(lambda: inflight + len(data) <= limit)
                    inflight += len(data)
                queue.put_nowait((due, data))

        async def consume():
            nonlocal inflight
            while True:
                due, data = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if data is None:
                    await self.half_close(writer)
                    return
                try:
                    await forward(data)
                finally:
                    async with room:
                        inflight -= len(data)
                        room.notify_all()

        tasks = {asyncio.create_task(produce()), asyncio.create_task(consume())}
        try:
            # returns when one fails, or when both finished cleanly
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in done:
                if not t.cancelled() and t.exception() is not None:
                    raise t.exception()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def half_close(self, writer) -> None:
        await writer.drain()
        if writer.can_write_eof() and not writer.transport.is_closing():
            writer.write_eof()

    # -- closing --
    @staticmethod
    def abort(writer) -> None:
        if writer is None:
            return
        try:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        writer.transport.abort()

    async def close_server_after_cut(self) -> None:
        w = self.s_writer
        try:
            async with asyncio.timeout(10):
                # hand every byte up to the cut to the kernel
                while w.transport.get_write_buffer_size() > 0 and not w.transport.is_closing():
                    await asyncio.sleep(0.001)
                if self.proxy.args.server_close == "rst":
                    sock = w.get_extra_info("socket")
                    # wait for the server's kernel to acknowledge them, then reset
                    while sock is not None:
                        buf = fcntl.ioctl(sock.fileno(), SIOCOUTQ, b"\0\0\0\0")
                        if struct.unpack("i", buf)[0] == 0:
                            break
                        await asyncio.sleep(0.001)
                    self.abort(w)
                    return
        except (TimeoutError, OSError):
            self.abort(w)
            return
        w.transport.close()  # FIN after everything written

    async def run(self) -> None:
        try:
            try:
                self.s_reader, self.s_writer = await asyncio.open_connection(
                    *self.proxy.args.target, limit=READ_SIZE)
            except OSError as e:
                self.end = f"connect-failed:{e.__class__.__name__}"
                self.abort(self.c_writer)
                return
            if self.cut_at == 0:
                raise Cut()
            up = asyncio.create_task(self.pump(self.c_reader, self.forward_c2s, self.s_writer))
            down = asyncio.create_task(self.pump(self.s_reader, self.forward_s2c, self.c_writer))
            pending = {up, down}
            try:
                while pending:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for t in done:
                        exc = t.exception()
                        if exc is not None:
                            raise exc
            finally:
                for t in pending:
                    t.cancel()
                if pending:
                    await asyncio.gather(*pending, return_exceptions=True)
            self.end = "closed"
            for w in (self.s_writer, self.c_writer):
                w.transport.close()
        except Cut:
            self.faults.append(f"cut@{self.c2s}")
            self.end = "cut"
            await self.close_server_after_cut()
            self.abort(self.c_writer)
        except (ConnectionError, OSError) as e:
            self.end = f"error:{e.__class__.__name__}"
            self.abort(self.s_writer)
            self.abort(self.c_writer)
        except asyncio.CancelledError:
            self.end = "terminated"
            self.abort(self.s_writer)
            self.abort(self.c_writer)
            raise
        except Exception as e:  # never let one connection take the proxy down
            self.end = f"error:{e.__class__.__name__}"
            self.abort(self.s_writer)
            self.abort(self.c_writer)
        finally:
            if self.cut_at is not None and self.end != "cut":
                self.faults.append(f"cut-unreached@{self.cut_at}")
            if self.delay > 0:
                self.faults.append(f"delay={self.proxy.args.delay_ms:g}ms")
            self.proxy.log(self)


class Proxy:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.rng = random.Random(args.cut_random) if args.cut_random is not None else None
        self.count = 0
        self.tasks: set[asyncio.Task] = set()

    def log(self, c: Connection) -> None:
        if not self.args.log:
            return
        line = (f"conn={c.cid} peer={c.peer} c2s={c.c2s} s2c={c.s2c} "
                f"fault={','.join(c.faults) or 'none'} end={c.end} "
                f"secs={time.monotonic() - c.start:.3f}\n")
        try:
            with open(self.args.log, "a") as f:
                f.write(line)
        except OSError as e:
            print(f"faultproxy: cannot write log: {e}", file=sys.stderr)

    async def handle(self, reader, writer) -> None:
        self.count += 1
        faulted = self.count == 1 or self.args.every
        conn = Connection(self, self.count, reader, writer, faulted)
        task = asyncio.current_task()
        self.tasks.add(task)
        try:
            await conn.run()
        except asyncio.CancelledError:
            pass
        finally:
            self.tasks.discard(task)

    async def main(self) -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        host, port = self.args.listen
        server = await asyncio.start_server(self.handle, host, port, limit=READ_SIZE, reuse_address=True)
        bound = server.sockets[0].getsockname()
        ready = f"{bound[0]}:{bound[1]}\n"
        tmp = f"{self.args.ready_file}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(ready)
        os.replace(tmp, self.args.ready_file)
        await stop.wait()
        server.close()
        for t in list(self.tasks):
            t.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=2)
        return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return asyncio.run(Proxy(args).main())


if __name__ == "__main__":
    sys.exit(main())
