"""Child processes of the soak: each in its own process group, all tracked, all ended on exit."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time


class Child:
    """A process started by the soak, with stdout/stderr in files and a pidfd to wait on."""

    def __init__(self, registry: "Registry", name: str, argv: list[str], log_dir: str,
                 stdin_file: str | None = None, env: dict | None = None):
        self.registry = registry
        self.name = name
        self.argv = argv
        self.out_path = os.path.join(log_dir, f"{name}.out")
        self.err_path = os.path.join(log_dir, f"{name}.err")
        self.signals_sent: list[int] = []
        self.started = time.monotonic()
        out = open(self.out_path, "wb")
        err = open(self.err_path, "wb")
        try:
            self.p = subprocess.Popen(argv, stdout=out, stderr=err,
                                      stdin=subprocess.PIPE if stdin_file else subprocess.DEVNULL,
                                      start_new_session=True, close_fds=True, env=env)
        finally:
            out.close()
            err.close()
        self.pid = self.p.pid
        try:
            self.pidfd = os.pidfd_open(self.pid)
        except OSError:
            self.pidfd = None
        registry.add(self)
        self.feeder = None
        if stdin_file:
            self.feeder = threading.Thread(target=self._feed, args=(stdin_file,), daemon=True)
            self.feeder.start()

    def _feed(self, path: str) -> None:
        """Pipe a file into the child's stdin (a real stream: no seeking, no size)."""
        try:
            with open(path, "rb") as f:
                while True:
                    b = f.read(256 * 1024)
                    if not b:
                        break
                    self.p.stdin.write(b)
        except (BrokenPipeError, OSError, ValueError):
            pass
        finally:
            try:
                self.p.stdin.close()
            except (BrokenPipeError, OSError, ValueError):
                pass

    # -- state --
    def poll(self) -> int | None:
        rc = self.p.poll()
        if rc is not None:
            self._closefd()
        return rc

    @property
    def returncode(self) -> int | None:
        return self.p.returncode

    def running(self) -> bool:
        return self.poll() is None

    def killed_by_us(self) -> bool:
        return self.returncode is not None and self.returncode < 0 and -self.returncode in self.signals_sent

    def signal(self, sig: int) -> None:
        if self.poll() is not None:
            return
        self.signals_sent.append(sig)
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            os.kill(self.pid, sig)

    def wait(self, timeout: float | None) -> int | None:
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self._closefd()
        return rc

    def kill_and_reap(self) -> int:
        self.signal(signal.SIGKILL)
        rc = self.p.wait()
        self._closefd()
        return rc

    def _closefd(self) -> None:
        if self.pidfd is not None:
            try:
                os.close(self.pidfd)
            except OSError:
                pass
            self.pidfd = None
        if self.feeder is not None:
            self.feeder.join(timeout=5)

    def stdout(self) -> str:
        return _read(self.out_path)

    def stderr(self) -> str:
        return _read(self.err_path)


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def wait_any(children: list[Child], timeout: float) -> None:
    """Return when one of the running children exits, or after `timeout` seconds."""
    fds = [c.pidfd for c in children if c.pidfd is not None and c.p.returncode is None]
    if not fds:
        if timeout > 0 and any(c.p.returncode is None for c in children):
            # no pidfd support: fall back to a short wait on one child
            for c in children:
                if c.p.returncode is None:
                    c.wait(timeout)
                    return
        return
    try:
        select.select(fds, [], [], max(0.0, timeout))
    except (OSError, ValueError):
        pass


class Registry:
    """Every child ever started; `reap_all` ends the process groups of those still running."""

    def __init__(self):
        self.children: list[Child] = []
        self.lock = threading.Lock()

    def add(self, c: Child) -> None:
        with self.lock:
            self.children.append(c)

    def live(self) -> list[Child]:
        return [c for c in self.children if c.poll() is None]

    def reap_all(self, sig: int = signal.SIGKILL) -> None:
        for c in list(self.children):
            if c.p.returncode is None:
                try:
                    os.killpg(c.pid, sig)
                except OSError:
                    pass
        for c in list(self.children):
            if c.p.returncode is None:
                try:
                    c.p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            c._closefd()
        with self.lock:
            self.children = [c for c in self.children if c.p.returncode is None]

    def forget_finished(self) -> None:
        with self.lock:
            self.children = [c for c in self.children if c.p.returncode is None]


def processes_mentioning(text: str, exclude: set[int]) -> list[tuple[int, str]]:
    """Processes (pid, cmdline) whose command line or cwd mention `text` (e.g. a round's temp dir)."""
    found = []
    me = os.getpid()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        pid = int(d)
        if pid == me or pid in exclude:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                cwd = ""
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z":
            continue
        if text in cmd or cwd.startswith(text):
            found.append((pid, cmd.strip()))
    return found
