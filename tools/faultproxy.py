#!/usr/bin/env python3
"""faultproxy: a fault-injecting TCP proxy for end-to-end tests.

Python 3.11+, standard library only. Started as a subprocess by tests:

    python3 tools/faultproxy.py --listen 127.0.0.1:0 --target HOST:PORT \\
        --ready-file PATH [options]

It listens, writes "HOST:PORT\\n" (the address actually bound) atomically to
--ready-file (temporary file, then rename) once it accepts connections, and
forwards every accepted connection to --target in both directions until it is
killed. SIGTERM or SIGINT make it drop every connection and exit 0 at once, in
every state (listening, forwarding, blocked on a peer that does not read, in the
middle of a cut or a delay); a second signal, or a shutdown that takes longer
than a second, ends the process at once (os._exit). The proxy writes at most a
few lines to stderr, so a parent that never reads a stderr pipe cannot block it.

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
import logging
import os
import random
import signal
import socket
import struct
import sys
import termios
import threading
import time

READ_SIZE = 256 * 1024
STOP_GRACE = 1.0   # seconds a signalled proxy may spend dropping connections before os._exit
STDERR_BUDGET = 4096  # bytes of diagnostics at most: a pipe nobody reads (64 KiB) never fills
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


_stderr_used = 0


def warn(text: str) -> None:
    """One diagnostic line on stderr, within STDERR_BUDGET bytes for the whole run.

    A parent that pipes our stderr and reads it only after we exit must never see
    us block in write(): that is how SIGTERM used to leave the proxy hanging (the
    asyncio logger reporting failed sends on dropped connections filled the pipe,
    and the loop, stuck in write(), never ran the signal handler)."""
    global _stderr_used
    data = (text.rstrip("\n") + "\n").encode(errors="replace")
    if _stderr_used + len(data) > STDERR_BUDGET:
        return
    _stderr_used += len(data)
    try:
        os.write(2, data)
    except OSError:
        pass


class Stopper:
    """SIGTERM/SIGINT handling that works in every state of the proxy.

    The Python-level handler (signal.signal, installed before the loop starts)
    asks the loop to stop and arms a watchdog thread: if the graceful stop has
    not finished within STOP_GRACE seconds (a wedged loop, a blocked write, a
    task that swallows cancellation), the process exits 0 with os._exit. A second
    signal exits at once. Temporary files registered here are removed first."""

    def __init__(self):
        self.loop: asyncio.AbstractEventLoop | None = None
        self.event: asyncio.Event | None = None
        self.signalled = False
        self.temp_files: set[str] = set()

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.handle)

    def attach(self, loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
        self.loop, self.event = loop, event
        # Wake the loop's selector whichever thread the kernel delivers a signal
        # to, so the handler above runs at once even when no socket is ready.
        rsock, wsock = socket.socketpair()
        rsock.setblocking(False)
        wsock.setblocking(False)
        self._wakeup = (rsock, wsock)
        signal.set_wakeup_fd(wsock.fileno(), warn_on_full_buffer=False)

        def drain() -> None:
            try:
                while rsock.recv(4096):
                    pass
            except OSError:
                pass
        loop.add_reader(rsock.fileno(), drain)
        if self.signalled:  # a signal came before the loop ran
            loop.call_soon(event.set)

    def handle(self, signum, frame) -> None:
        if self.signalled:
            self.hard_exit()
        self.signalled = True
        threading.Thread(target=self._watchdog, name="stop-watchdog", daemon=True).start()
        loop, event = self.loop, self.event
        if loop is None or event is None:
            return  # attach() will stop the loop as soon as it starts
        try:
            loop.call_soon_threadsafe(event.set)
        except RuntimeError:  # loop already closed: we are on the way out anyway
            self.hard_exit()

    def _watchdog(self) -> None:
        time.sleep(STOP_GRACE)
        self.hard_exit()

    def hard_exit(self) -> None:
        for path in list(self.temp_files):
            try:
                os.unlink(path)
            except OSError:
                pass
        os._exit(0)


STOPPER = Stopper()


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
        self.conns: set[Connection] = set()
        self.stopping = False

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
            warn(f"faultproxy: cannot write log: {e}")

    async def handle(self, reader, writer) -> None:
        self.count += 1
        faulted = self.count == 1 or self.args.every
        conn = Connection(self, self.count, reader, writer, faulted)
        if self.stopping:  # accepted in the last moment before the listener closed
            Connection.abort(writer)
            return
        task = asyncio.current_task()
        self.tasks.add(task)
        self.conns.add(conn)
        try:
            await conn.run()
        except asyncio.CancelledError:
            pass
        finally:
            self.tasks.discard(task)
            self.conns.discard(conn)

    async def main(self) -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        # Failed sends on dropped connections make asyncio log (unbounded) to stderr;
        # nothing of that is useful here and it could block on a full pipe.
        logging.getLogger("asyncio").setLevel(logging.CRITICAL + 1)
        loop.set_exception_handler(lambda _loop, _context: None)
        STOPPER.attach(loop, stop)
        host, port = self.args.listen
        server = await asyncio.start_server(self.handle, host, port, limit=READ_SIZE, reuse_address=True)
        bound = server.sockets[0].getsockname()
        ready = f"{bound[0]}:{bound[1]}\n"
        tmp = f"{self.args.ready_file}.tmp.{os.getpid()}"
        STOPPER.temp_files.add(tmp)
        try:
            with open(tmp, "w") as f:
                f.write(ready)
            os.replace(tmp, self.args.ready_file)
        finally:
            STOPPER.temp_files.discard(tmp)
        await stop.wait()
        # Drop everything now, without waiting on any peer: close the listener,
        # reset both sides of every connection, then cancel the tasks.
        self.stopping = True
        server.close()
        for c in list(self.conns):
            Connection.abort(c.c_writer)
            Connection.abort(c.s_writer)
        for t in list(self.tasks):
            t.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=STOP_GRACE / 2)
        return 0


def main(argv: list[str] | None = None) -> int:
    STOPPER.install()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return asyncio.run(Proxy(args).main())


if __name__ == "__main__":
    code = main()
    # Skip interpreter finalization (garbage-collected transports, warnings):
    # nothing is left to flush but stdio, and it must not delay the exit.
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(code)
