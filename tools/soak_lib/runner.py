"""One soak round: relay + accounts, a fault phase (proxy cuts and stalls, kill -9 of relay and agents,
the relay's disk filled), a clean re-run of the same agent commands, and the invariants checked along
the way."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field

from . import layout
from .procs import Child, Registry, processes_mentioning, wait_any
from .workload import Job, Plan, Source, materialize

MiB = 1024 * 1024
SYNC_BATCH = 8 * MiB           # the relay's default --sync-bytes
DIRECT_IO_SLACK = 4 * MiB      # staging files may hold an aligned, not yet durable tail
STRIPE = 16 * MiB              # SPEC §6.7: the stripe of a blob below 4 GiB
CRASH_RE = re.compile(r"precondition|Fatal error", re.IGNORECASE)
CRASH_CODES = (132, 134, 139)  # 128 + SIGILL / SIGABRT / SIGSEGV (as a shell reports them)
# send exits 3 when nothing went up and every failure has one of these codes (README: exit status).
RELAY_REFUSED_CODES = {"RELAY_UNREACHABLE", "UNAUTHENTICATED", "UNSUPPORTED_VERSION", "TLS_UNTRUSTED",
                       "TLS_NAME_MISMATCH", "TLS_HANDSHAKE"}
OK_STATUSES = ("stored", "deduplicated")
STORAGE_FULL_RE = re.compile(r"STORAGE_ERROR|storage is full", re.IGNORECASE)
TMPFS_SLACK = 1 * MiB          # the catalog's growth and a tmpfs's own blocks, on top of the relay's reserve
WATCH_HELD_UP = 9.0            # watch --help: a file that does not fit waits 10 s first; a file that fits, made once
                               # one waits, is stored sooner than that unless the queue waits with it
WATCH_STOP_GRACE = 10.0        # watch --help: "Stops on SIGINT or SIGTERM", exit 0
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAULTPROXY = os.path.join(HERE, "faultproxy.py")


@dataclass
class Finding:
    invariant: str
    seed: int
    round: int
    evidence: str


@dataclass
class Stats:
    rounds: int = 0
    files: int = 0
    bytes: int = 0
    accounts: int = 0
    agents: int = 0
    cuts: int = 0
    kills: int = 0
    deadline_kills: int = 0
    relay_restarts: int = 0
    skipped: int = 0               # paths the agents said they skipped, as they should
    failed_alone: int = 0          # paths that failed alone, as they should (no key possible, missing)
    watch_runs: int = 0
    tmpfs_rounds: int = 0
    disk_fills: int = 0
    refused_full: int = 0          # items the clean re-run could not store as the relay's disk was full
    findings: list[Finding] = field(default_factory=list)


@dataclass
class Ctx:
    relay_bin: str
    agent_bin: str
    root: str
    registry: Registry
    stats: Stats
    short: bool
    master_seed: int
    log: callable = print
    final_limit: callable = lambda: 300.0
    mounts: list = field(default_factory=list)   # tmpfs mounts of the run: unmounted by the round, or at exit


class RoundAbort(Exception):
    pass


def mount_tmpfs(path: str, size: int, mounts: list) -> str | None:
    """Mount a tmpfs of `size` bytes on `path` (root only); None when mounted, else why not."""
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", path],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        return (r.stderr or r.stdout).strip() or f"mount exit {r.returncode}"
    mounts.append(path)
    return None


def umount(path: str, mounts: list) -> bool:
    """Unmount (lazily when busy); True once it is gone from the mount table."""
    for argv in (["umount", path], ["umount", "-l", path]):
        try:
            if subprocess.run(argv, capture_output=True, timeout=30).returncode == 0:
                if path in mounts:
                    mounts.remove(path)
                return True
        except subprocess.TimeoutExpired:
            pass
    return False


def umount_all(mounts: list, under: str | None = None) -> list[str]:
    """Unmount every mount left (exit paths), and any mount point below `under` the mount table shows (one made
    just as a signal came); returns those that would not go."""
    if under:
        try:
            with open("/proc/mounts") as f:
                for line in f:
                    point = line.split()[1].replace("\\040", " ")
                    if point.startswith(under.rstrip("/") + "/") and point not in mounts:
                        mounts.append(point)
        except (OSError, IndexError):
            pass
    return [m for m in sorted(mounts, reverse=True) if not umount(m, mounts)]


class WatchRun:
    """One run of a watch job: its --json events read as they come, with the time the soak saw each."""

    def __init__(self, job: Job, child: Child, phase: str):
        self.job, self.child, self.phase = job, child, phase
        self.started = time.monotonic()
        self.offset = 0
        self.partial = b""
        self.lines: list[tuple[float, str]] = []
        self.events: list[tuple[float, dict]] = []
        self.finished: dict[str, tuple[float, dict]] = {}     # key -> last finished event
        self.waiting: dict[str, tuple[float, dict]] = {}      # key -> first waiting event
        self.skipped: dict[str, int] = {}                     # printed path -> skipped events
        self.stop_sent: float | None = None
        self.done = False

    def read(self) -> None:
        try:
            with open(self.child.out_path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        self.offset += len(data)
        data = self.partial + data
        *complete, self.partial = data.split(b"\n")
        now = time.monotonic()
        for raw in complete:
            line = raw.decode("utf-8", errors="replace")
            if not line.strip():
                continue
            self.lines.append((now, line))
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if not isinstance(obj, dict):
                continue
            self.events.append((now, obj))
            ev, key = obj.get("event"), obj.get("key")
            if ev == "finished" and isinstance(key, str):
                self.finished[key] = (now, obj)
            elif ev == "waiting" and isinstance(key, str):
                self.waiting.setdefault(key, (now, obj))
            elif ev == "skipped" and isinstance(obj.get("path"), str):
                p = os.path.normpath(obj["path"])
                self.skipped[p] = self.skipped.get(p, 0) + 1

    def last_about(self, key: str) -> str:
        for _, obj in reversed(self.events):
            if obj.get("key") == key:
                return json.dumps(obj, ensure_ascii=False)[:300]
        return "nothing"


class Round:
    def __init__(self, ctx: Ctx, plan: Plan):
        self.ctx = ctx
        self.plan = plan
        self.dir = os.path.join(ctx.root, f"round-{plan.index}")
        self.src = os.path.join(self.dir, "src")
        self.disk = plan.disk
        # with a disk plan the relay's --data is on a tmpfs mounted at <round>/disk (setup); a filler file beside
        # --data fills it
        self.disk_dir = os.path.join(self.dir, "disk") if self.disk else None
        self.data = os.path.join(self.disk_dir, "data") if self.disk else os.path.join(self.dir, "data")
        self.logs = os.path.join(self.dir, "logs")
        self.store = layout.store_root(self.data)
        for d in (self.src, self.logs):
            os.makedirs(d, exist_ok=True)
        self.mounted = False
        self.filler: tuple[str, float, float] | None = None   # (path, filled at, release at)
        self.watch_runs: dict[int, WatchRun] = {}
        self.late_made: dict[tuple[int, str], float] = {}     # (job, "fault"/"rerun"/"link") -> when made
        self.extra_skips: dict[int, dict[str, str]] = {}      # watch job -> late link's printed path (not -L)
        self.offsets: dict[tuple, int] = {}                   # catalog sampler: (session, stripe) -> most durable
        self.sampled_bad: set = set()
        self.last_sample = 0.0
        self.ca_copy = os.path.join(self.dir, "ca.pem")
        self.leak_needles: list[str] = []
        self.leak_reported: set[str] = set()
        self.disk_refused: list[str] = []
        self.findings: list[Finding] = []
        self.relay: Child | None = None
        self.relay_children: list[Child] = []
        self.relay_port = 0
        self.relay_down_expected = False
        self.restart_at: float | None = None
        self.proxy: Child | None = None
        self.proxy_logs: list[str] = []
        self.hash_cache: dict[tuple, str] = {}
        self.seen: dict[tuple[str, str], str] = {}       # (account, key) -> sha1 once seen stored
        self.quota_seen: dict[str, int] = {}
        self.quota_reported: set[str] = set()
        self.tokens: dict[str, str] = {}
        self.ca = ""
        self.n = 0
        self.broke = False
        self.last_quota_check = 0.0

    # ------------------------------------------------------------ findings
    def find(self, invariant: str, evidence: str) -> None:
        f = Finding(invariant, self.ctx.master_seed, self.plan.index, evidence)
        self.findings.append(f)
        self.ctx.log(f"  FINDING [{invariant}] round {self.plan.index}: {evidence}")

    # ------------------------------------------------------------ helpers
    def sha1_of(self, path: str, st: os.stat_result) -> str:
        k = (path, st.st_ino, st.st_size, st.st_mtime_ns)
        h = self.hash_cache.get(k)
        if h is None:
            d = hashlib.sha1()
            with open(path, "rb") as f:
                while True:
                    b = f.read(4 * MiB)
                    if not b:
                        break
                    d.update(b)
            h = d.hexdigest()
            self.hash_cache[k] = h
        return h

    def account(self, name: str):
        return next(a for a in self.plan.accounts if a.name == name)

    def expected_all(self) -> dict[str, dict[str, Source]]:
        """Every key each account may hold: the jobs' expected keys and both ways of walking a directory that -L
        reaches through a link too."""
        out: dict[str, dict[str, Source]] = {}
        for j in self.plan.jobs:
            out.setdefault(j.account, {}).update(self.job_keys(j))
        return out

    @staticmethod
    def job_keys(j: Job) -> dict[str, Source]:
        keys = dict(j.expected)
        for a in j.alts:
            keys.update(a.via_link)
            keys.update(a.via_dir)
        return keys

    @staticmethod
    def forbidden(j: Job, key: str) -> bool:
        return any(key == f or key.startswith(f + "/") for f in j.forbidden)

    def forbidden_by(self, account: str, key: str) -> Job | None:
        """The job of `account` whose symbolic link (not followed), loop or unreadable directory `key` is."""
        return next((j for j in self.plan.jobs if j.account == account and self.forbidden(j, key)), None)

    def whose(self, key: str, sha1: str, not_account: str) -> str | None:
        for acc, items in self.expected_all().items():
            if acc != not_account and key in items and items[key].sha1 == sha1:
                return acc
        return None

    def account_bytes(self, account: str) -> int:
        total = 0
        for root, _, files in os.walk(layout.account_dir(self.store, account)):
            for f in files:
                try:
                    total += os.lstat(os.path.join(root, f)).st_size
                except OSError:
                    pass
        return total

    def data_bytes(self) -> int:
        total = 0
        for root, dirs, files in os.walk(self.data):
            if root == self.data:
                dirs[:] = [d for d in dirs if d != layout.DEV_SUBDIR]
            for f in files:
                try:
                    total += os.lstat(os.path.join(root, f)).st_size
                except OSError:
                    pass
        return total

    def staging_state(self) -> tuple[int, int]:
        """(bytes, files) the relay keeps under --data outside the store, its catalog and dev/. Bytes are those on disk:
        a striped upload's staging file (SPEC §6.7) has holes where its stripes have not arrived."""
        total = n = 0
        for root, dirs, files in os.walk(self.data):
            if root == self.data:
                dirs[:] = [d for d in dirs if d not in (layout.DEV_SUBDIR, layout.STORE_SUBDIR)]
                files = [f for f in files if not f.startswith("catalog")]
            for f in files:
                try:
                    st = os.lstat(os.path.join(root, f))
                    total += min(st.st_size, st.st_blocks * 512)
                    n += 1
                except OSError:
                    pass
        return total, n

    def check_quotas(self) -> None:
        for a in self.plan.accounts:
            if a.quota is None:
                continue
            used = self.account_bytes(a.name)
            self.quota_seen[a.name] = max(self.quota_seen.get(a.name, 0), used)
            if used > a.quota and a.name not in self.quota_reported:
                self.quota_reported.add(a.name)
                self.find("quota", f"account {a.name} holds {used} bytes on disk, quota {a.quota}")

    # ------------------------------------------------------------ relay
    def relay_argv(self, port: int, ready: str) -> list[str]:
        extra = []
        if self.disk and self.disk.min_free is not None:
            extra = ["--min-free", str(self.disk.min_free)]
        return [self.ctx.relay_bin, "serve", "--dev", "--data", self.data, "--listen", f"127.0.0.1:{port}",
                "--ready-file", ready, "--log-level", "warning"] + self.plan.relay_args + extra

    def wait_ready(self, child: Child, ready: str, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.path.exists(ready):
                text = open(ready).read()
                if text.endswith("\n"):
                    return text.strip()
            if child.poll() is not None:
                return None
            wait_any([child], 0.02)
        return None

    def start_relay(self) -> None:
        self.n += 1
        ready = os.path.join(self.logs, f"relay-{self.n}.ready")
        for port in ([self.relay_port, 0] if self.relay_port else [0]):
            child = Child(self.ctx.registry, f"relay-{self.n}-{port}", self.relay_argv(port, ready), self.logs)
            self.relay_children.append(child)
            addr = self.wait_ready(child, ready, 30)
            if addr:
                new_port = int(addr.rsplit(":", 1)[1])
                if self.relay_port and new_port != self.relay_port:
                    self.ctx.log(f"  note: relay could not listen on port {self.relay_port} again, now {new_port}")
                self.relay_port = new_port
                self.relay = child
                self.relay_down_expected = False
                self.restart_at = None
                # the agents get a copy of the dev CA: a path under --data in what they print is then the relay's
                try:
                    shutil.copyfile(layout.dev_ca(self.data), self.ca_copy)
                except OSError as e:
                    raise RoundAbort(f"cannot copy the dev CA: {e}")
                return
            if child.poll() is None:
                child.kill_and_reap()
                self.find("relay-lifecycle", f"relay start #{self.n} wrote no ready file within 30 s: "
                          f"{child.stderr()[-300:]!r}")
            else:
                self.check_relay_exit(child, expected=False)
        raise RoundAbort("relay does not start")

    def check_relay_exit(self, child: Child, expected: bool) -> None:
        rc = child.returncode
        err = child.stderr()
        if rc is not None and rc < 0 and -rc not in child.signals_sent:
            self.find("crash", f"relay {child.name} died of signal {-rc}: {err[-300:]!r}")
        elif rc in CRASH_CODES:
            self.find("crash", f"relay {child.name} exit {rc}: {err[-300:]!r}")
        elif not expected:
            self.find("relay-lifecycle", f"relay {child.name} exited on its own with {rc}: {err[-300:]!r}")
        m = CRASH_RE.search(err)
        if m:
            line = err[max(0, m.start() - 150): m.end() + 150]
            self.find("crash", f"relay {child.name} stderr: {line!r}")

    def stop_relay(self, sig: int, timeout: float = 30) -> None:
        r = self.relay
        if r is None or r.poll() is not None:
            return
        self.relay_down_expected = True
        r.signal(sig)
        rc = r.wait(timeout)
        if rc is None:
            self.find("relay-lifecycle", f"relay ignored {signal.Signals(sig).name} for {timeout:.0f} s")
            r.kill_and_reap()
        elif sig == signal.SIGTERM and rc != 0:
            self.find("relay-lifecycle", f"relay exit {rc} after SIGTERM (README: exits 0): {r.stderr()[-300:]!r}")
        self.check_relay_exit(r, expected=True)
        self.relay = None

    def relay_check_alive(self) -> None:
        r = self.relay
        if r is not None and not self.relay_down_expected and r.poll() is not None:
            self.check_relay_exit(r, expected=False)
            self.relay = None
            if self.filler is not None:
                self.restart_at = time.monotonic()   # started again once the filler is gone (run_phase)
                return
            self.ctx.stats.relay_restarts += 1
            self.start_relay()

    # ------------------------------------------------------------ the relay's disk
    def filler_path(self) -> str:
        return os.path.join(self.disk_dir, "filler.bin")

    def fill_disk(self, e, phase: str, since: float) -> None:
        """Fill the relay's tmpfs to ENOSPC with one file beside --data; removed after e.hold seconds."""
        path = self.filler_path()
        written, enospc, error = 0, False, None
        chunk = bytes(1 * MiB)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError as err:
            fd, enospc, error = None, err.errno == errno.ENOSPC, str(err)
        if fd is not None:
            try:
                for size in (MiB, 64 * 1024, 4096, 512, 1):
                    piece = chunk[:size]
                    while True:
                        try:
                            n = os.write(fd, piece)
                        except OSError as err:
                            if err.errno == errno.ENOSPC:
                                enospc = True
                            else:
                                error = str(err)
                            break
                        written += n
                        if n < size:
                            break
                    if error:
                        break
            finally:
                os.close(fd)
        now = time.monotonic()
        self.filler = (path, now, now + e.hold)
        self.ctx.stats.disk_fills += 1
        self.ctx.log(f"  {phase}: disk filled at {e.trigger} (t+{now - since:.1f}s): {written} B written, "
                     f"{'ENOSPC' if enospc else 'NO ENOSPC (' + str(error) + ')'}; held {e.hold:.1f}s")
        if not enospc:
            self.ctx.log(f"  soak tool problem: the filler did not fill the relay's disk ({error})")

    def release_disk(self, phase: str, force: bool = False) -> None:
        if self.filler is None:
            return
        path, filled, until = self.filler
        if not force and time.monotonic() < until:
            return
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        self.filler = None
        self.ctx.log(f"  {phase}: disk freed after {time.monotonic() - filled:.1f}s")

    def disk_free(self) -> tuple[int, int]:
        """(bytes free on the relay's disk, the relay's reserve: --min-free, else 1G or a twentieth of the disk)."""
        st = os.statvfs(self.data)
        free = st.f_bavail * st.f_frsize
        if self.disk and self.disk.min_free is not None:
            return free, self.disk.min_free
        return free, min(1 << 30, st.f_blocks * st.f_frsize // 20)

    # ------------------------------------------------------------ samplers (disk rounds)
    def sample(self, phase: str) -> None:
        """Nothing unverified visible: every file in the store is an object the round may hold, whole and exact.
        Nothing acknowledged lost: no upload's durable offset (or a stripe's durable bytes) falls in the catalog."""
        expected = self.expected_all()
        for root, _, files in os.walk(self.store):
            for f in files:
                path = os.path.join(root, f)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                ident = (path, st.st_ino, st.st_size, st.st_mtime_ns)
                if ident in self.sampled_bad:
                    continue
                ak = layout.object_of_path(self.store, path)
                src = expected.get(ak[0], {}).get(ak[1]) if ak else None
                if src is None:
                    self.sampled_bad.add(ident)
                    self.find("visible-unverified", f"{phase}: {os.path.relpath(path, self.store)!r} "
                              f"({st.st_size} B) in the store is no object of the round")
                    continue
                if st.st_size != src.size or self.sha1_of(path, st) != src.sha1:
                    self.sampled_bad.add(ident)
                    self.find("visible-unverified", f"{phase}: {ak[0]}/{ak[1]!r} visible with {st.st_size} B "
                              f"(sha1 {self.sha1_of(path, st) if st.st_size == src.size else '-'}), "
                              f"source {src.size} B {src.sha1}")
        try:
            db = sqlite3.connect(f"file:{os.path.join(self.data, 'catalog.sqlite')}?mode=ro", uri=True, timeout=2)
            try:
                rows = [((sid, None), key, off) for sid, key, off in
                        db.execute("SELECT id, key, durable_offset FROM session")]
                try:
                    rows += [((sid, stripe), "", b) for sid, stripe, b in
                             db.execute("SELECT session_id, stripe, bytes FROM session_stripe")]
                except sqlite3.Error:
                    pass
            finally:
                db.close()
        except sqlite3.Error:
            return
        for ident, key, off in rows:
            prev = self.offsets.get(ident)
            if prev is not None and off < prev and ident not in self.sampled_bad:
                self.sampled_bad.add(ident)
                what = f"session {ident[0]} ({key!r})" if ident[1] is None else f"session {ident[0]} stripe {ident[1]}"
                self.find("acknowledged-lost", f"{phase}: {what}: durable bytes fell from {prev} to {off} in the "
                          f"catalog")
            self.offsets[ident] = max(off, prev or 0)

    # ------------------------------------------------------------ proxy
    def start_proxy(self) -> str:
        ready = os.path.join(self.logs, "proxy.ready")
        log = os.path.join(self.logs, "proxy.log")
        self.proxy_logs.append(log)
        argv = [sys.executable, FAULTPROXY, "--listen", "127.0.0.1:0", "--target", f"127.0.0.1:{self.relay_port}",
                "--ready-file", ready, "--log", log] + self.plan.proxy_args
        self.proxy = Child(self.ctx.registry, "proxy", argv, self.logs)
        addr = self.wait_ready(self.proxy, ready, 20)
        if not addr:
            raise RoundAbort(f"faultproxy did not start: {self.proxy.stderr()[-300:]!r}")
        return addr

    def stop_proxy(self) -> None:
        p = self.proxy
        if p is None:
            return
        p.signal(signal.SIGTERM)
        if p.wait(5) is None:
            self.ctx.log("  soak tool problem: faultproxy ignored SIGTERM for 5 s (killed)")
            p.kill_and_reap()
        self.proxy = None
        for log in self.proxy_logs:
            try:
                self.ctx.stats.cuts += open(log).read().count("cut@")
            except OSError:
                pass
        self.proxy_logs = []

    # ------------------------------------------------------------ setup
    def setup(self) -> None:
        t0 = time.monotonic()
        if self.disk and os.geteuid() != 0:
            self.ctx.log("  note: not root, so no tmpfs: this round's relay disk plan and disk fills are left out")
            self.disk = None
            for e in self.plan.events:
                if e.target == "disk":
                    e.fired = True
        if self.disk:
            why = mount_tmpfs(self.disk_dir, self.disk.size, self.ctx.mounts)
            if why is not None:
                raise RoundAbort(f"cannot mount a tmpfs for the relay's --data (the soak needs root): {why}")
            self.mounted = True
            self.ctx.stats.tmpfs_rounds += 1
        os.makedirs(self.data, exist_ok=True)
        self.leak_needles = sorted({self.data, os.path.realpath(self.data)} |
                                   ({self.disk_dir, os.path.realpath(self.disk_dir)} if self.disk else set()))
        materialize(self.plan, self.src)
        for j in self.plan.jobs:
            if j.watch is not None:
                j.state = os.path.join(self.dir, f"watch-state-j{j.idx}")
        self.ctx.log(f"  wrote {self.plan.total_files} files, {self.plan.total_bytes / MiB:.1f} MiB "
                     f"in {time.monotonic() - t0:.1f}s")
        for a in self.plan.accounts:
            if a.name == layout.DEV_ACCOUNT:
                continue
            argv = [self.ctx.relay_bin, "token", "add", a.name, "--data", self.data]
            if a.quota is not None:
                argv += ["--quota", str(a.quota)]
            r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            if r.returncode != 0 or not r.stdout.strip():
                raise RoundAbort(f"token add {a.name} failed ({r.returncode}): {r.stderr[-300:]!r}")
            a.token = r.stdout.strip().splitlines()[-1].strip()
        self.start_relay()
        with open(layout.dev_token_file(self.data)) as f:
            self.account(layout.DEV_ACCOUNT).token = f.read().split()[0]
        self.ca = self.ca_copy

    # ------------------------------------------------------------ agents
    def start_agent(self, job: Job, phase: str, address: str) -> Child:
        acct = self.account(job.account)
        argv = job.argv(self.ctx.agent_bin, address, acct.token, self.ca)
        if argv[0] == "setpriv" and os.geteuid() != 0:
            argv = argv[2:]   # not root: no capabilities to drop, and the unreadable directory is unreadable anyway
        self.ctx.stats.agents += 1
        child = Child(self.ctx.registry, f"{phase}-j{job.idx}", argv, self.logs,
                      stdin_file=job.stdin_source.path if job.stdin_source is not None else None)
        if job.watch is not None:
            self.ctx.stats.watch_runs += 1
            self.watch_runs[job.idx] = WatchRun(job, child, phase)
        return child

    def check_leak(self, child: Child, who: str) -> None:
        """No relay path reaches the agent: nothing it prints names the relay's --data (the agents' CA is a copy
        outside it) or the tmpfs it is on."""
        text = child.stdout() + child.stderr()
        for needle in self.leak_needles:
            at = text.find(needle)
            if at >= 0 and who not in self.leak_reported:
                self.leak_reported.add(who)
                self.find("relay-path-leak", f"{who} printed the relay's path {needle!r}: "
                          f"{text[max(0, at - 200): at + 200]!r}")
                return

    def verify_object(self, account: str, key: str, src: Source, what: str) -> None:
        p = layout.object_path(self.store, account, key)
        try:
            st = os.stat(p)
        except OSError as e:
            self.find("stored-on-disk", f"{what}: {account}/{key!r} not at {os.path.relpath(p, self.data)} "
                      f"({e.__class__.__name__})")
            return
        sha = self.sha1_of(p, st) if st.st_size == src.size else None
        if sha != src.sha1:
            other = self.whose(key, sha, account) if sha else None
            if other:
                self.find("cross-account", f"{what}: {account}/{key!r} holds account {other}'s content")
            else:
                self.find("stored-on-disk", f"{what}: {account}/{key!r} has {st.st_size} B sha1 {sha}, "
                          f"source {src.size} B {src.sha1}")
            return
        prev = self.seen.get((account, key))
        if prev is not None and prev != sha:
            self.find("cross-account", f"{account}/{key!r} changed after it was stored")
        self.seen[(account, key)] = sha

    def relay_log_about(self, key: str, pattern: str = r"full|No space") -> str:
        """The first line a relay of the round logged about `key` that matches `pattern` (evidence)."""
        rx = re.compile(pattern, re.IGNORECASE)
        for c in self.relay_children:
            for line in c.stderr().splitlines():
                if f"upload.key={key} " in line and rx.search(line):
                    return line[:400]
        return ""

    def check_full_answer(self, who: str, failed: list[tuple[str, str]]) -> None:
        """A full disk is said so (serve --help, --min-free: STORAGE_ERROR, "storage is full; retry later"), so that
        the agent waits and retries: an item failed with another code while the relay logged that its disk was full
        for that key is a finding. `failed`: (key, error) of the run's failed items."""
        if not self.disk:
            return
        wrong = []
        for key, error in failed:
            if STORAGE_FULL_RE.search(error) or "_ERROR" not in error:
                continue
            relay_line = self.relay_log_about(key)
            if relay_line:
                wrong.append((key, error, relay_line))
        if wrong:
            key, error, relay_line = wrong[0]
            self.find("storage-full-answer", f"{who}: {len(wrong)} items failed with another answer than "
                      f"STORAGE_ERROR while the relay's disk was full, e.g. {key!r}: agent: {error[:200]!r}; "
                      f"relay: {relay_line!r}")

    def check_crash(self, child: Child, who: str) -> None:
        rc, err = child.returncode, child.stderr()
        if rc is not None and rc < 0 and not child.killed_by_us():
            self.find("crash", f"{who} died of signal {-rc}: {err[-300:]!r}")
        elif rc in CRASH_CODES:
            self.find("crash", f"{who} exit {rc}: {err[-300:]!r}")
        m = CRASH_RE.search(err)
        if m:
            self.find("crash", f"{who} stderr: {err[max(0, m.start() - 150): m.end() + 200]!r}")

    def check_agent(self, job: Job, child: Child, phase: str, final: bool) -> dict[str, dict]:
        if job.watch is not None:
            return self.check_watch(job, child, phase, final)
        rc = child.returncode
        err = child.stderr()
        by_us = child.killed_by_us()
        who = f"{phase} agent j{job.idx} ({job.kind}, {job.account})"
        self.check_crash(child, who)
        self.check_leak(child, who)
        results: dict[str, dict] = {}
        twice: list[tuple[str, dict, dict]] = []
        by_path: dict[str, list[dict]] = {}      # "skipped" lines, and "failed" lines of paths that fail alone
        alt_src = {k: src for a in job.alts for k, src in (*a.via_link.items(), *a.via_dir.items())}
        alt_paths = {p for a in job.alts for p in (a.link_path, a.dir_path)}
        for line in child.stdout().splitlines():
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                self.find("json-truth", f"{who}: stdout line is not JSON: {line[:200]!r}")
                continue
            key, status = obj.get("key"), obj.get("status")
            path = os.path.normpath(obj["path"]) if isinstance(obj.get("path"), str) else None
            if status not in ("stored", "deduplicated", "failed", "skipped"):
                self.find("json-truth", f"{who}: {key!r} has status {status!r}")
            if status in ("failed", "skipped") and not obj.get("error"):
                self.find("json-truth", f"{who}: {status} without an error: {line[:200]!r}")
            if status == "skipped" or ((path in job.fails or path in job.skips) and key not in job.expected):
                by_path.setdefault(path, []).append(obj)
                if status == "skipped" and path not in job.skips and path not in alt_paths:
                    self.find("skipped-truth", f"{who}: skipped {path!r}, which is a regular file or directory it "
                              f"can read: {line[:300]!r}")
                continue
            if key not in job.expected and key not in alt_src:
                if self.forbidden(job, key):
                    self.find("symlink-not-followed", f"{who}: {status} {key!r}, what a symbolic link leads to (or "
                              f"a directory it cannot read), though -L was not given: {line[:300]!r}")
                else:
                    self.find("json-truth", f"{who}: reports unknown key {key!r}: {line[:300]!r}")
                continue
            if key in results:
                twice.append((key, results[key], obj))
            results[key] = obj
            src = job.expected.get(key) or alt_src[key]
            if not isinstance(obj.get("sent_bytes"), int):
                self.find("json-truth", f"{who}: {key!r} has no integer sent_bytes: {line[:200]!r}")
            if status in OK_STATUSES:
                if obj.get("bytes") != src.size or obj.get("sha1") != src.sha1:
                    self.find("json-truth", f"{who}: {key!r} {status} with bytes={obj.get('bytes')} "
                              f"sha1={obj.get('sha1')}, source is {src.size} B {src.sha1}")
                self.verify_object(job.account, key, src, f"{who} said {status}")
        if twice:
            key, a, b = twice[0]
            self.find("json-truth", f"{who}: reports {len(twice)} keys twice (exit {rc}), e.g. {key!r}: "
                      f"{json.dumps(a, ensure_ascii=False)[:400]} then {json.dumps(b, ensure_ascii=False)[:400]}")
        self.check_full_answer(who, [(k, o.get("error") or "") for k, o in results.items()
                                     if o.get("status") == "failed"])
        # paths other than files: one result each, the one the help promises
        missing_paths = []
        for want, table in (("skipped", job.skips), ("failed", job.fails)):
            for path, kind in table.items():
                got = by_path.get(path, [])
                if len(got) > 1:
                    self.find("json-truth", f"{who}: {len(got)} results for {path!r} ({kind}): "
                              f"{json.dumps(got[:2], ensure_ascii=False)[:300]}")
                if got and got[0].get("status") != want:
                    inv = "symlink-not-followed" if kind.startswith("link-") and not job.follow else "special-truth"
                    self.find(inv, f"{who}: {path!r} ({kind}) {got[0].get('status')}, should be {want}: "
                              f"{json.dumps(got[0], ensure_ascii=False)[:300]}")
                elif got:
                    if want == "skipped":
                        self.ctx.stats.skipped += 1
                    else:
                        self.ctx.stats.failed_alone += 1
                if not got:
                    missing_paths.append(f"{path!r} ({kind})")
        # -L: a directory reached through a link and directly is walked once, the other path skipped
        alts_incomplete = []
        for a in job.alts:
            by_link = [k for k in a.via_link if k in results]
            by_dir = [k for k in a.via_dir if k in results]
            skip_link, skip_dir = len(by_path.get(a.link_path, [])), len(by_path.get(a.dir_path, []))
            if (by_link and by_dir) or (skip_link and skip_dir) or skip_link > 1 or skip_dir > 1:
                self.find("follow-once", f"{who}: {a.dir_path!r}, reached directly and through the link "
                          f"{a.link_path!r}: {len(by_dir)} keys through the directory, {len(by_link)} through the "
                          f"link; skipped {skip_dir}x and {skip_link}x (walked once, the other path skipped)")
            elif not ((len(by_link) == len(a.via_link) and skip_dir == 1 and not skip_link)
                      or (len(by_dir) == len(a.via_dir) and skip_link == 1 and not skip_dir)):
                alts_incomplete.append(f"{a.dir_path!r} / link {a.link_path!r}: {len(by_dir)}+{len(by_link)} keys, "
                                       f"skipped {skip_dir}x / {skip_link}x")
        if rc is not None and not by_us:
            ok = [k for k in job.expected if results.get(k, {}).get("status") in OK_STATUSES]
            alts_ok = all(all(results.get(k, {}).get("status") in OK_STATUSES for k in side)
                          for a in job.alts for side in [a.via_link if any(k in results for k in a.via_link)
                                                         else a.via_dir])
            missing = [k for k in job.expected if k not in results]
            failed = [k for k, o in results.items() if o.get("status") == "failed"]
            failed += [p for p, got in by_path.items() if any(o.get("status") == "failed" for o in got)]
            skipped = [p for p, got in by_path.items() if any(o.get("status") == "skipped" for o in got)]
            all_ok = len(ok) == len(job.expected) and alts_ok and not alts_incomplete
            if rc == 0 and (missing or failed or missing_paths or (skipped and not job.allow_skipped)):
                self.find("exit-code-truth", f"{who}: exit 0 but {len(failed)} failed, {len(missing)} missing, "
                          f"{len(skipped)} skipped{' (--allow-skipped)' if job.allow_skipped else ''} of "
                          f"{len(job.expected)} (e.g. {(failed + missing + skipped)[:1]!r})")
            elif rc == 1 and all_ok and not failed and not missing_paths and (job.allow_skipped or not skipped):
                self.find("exit-code-truth", f"{who}: exit 1 though all {len(ok)} items were stored"
                          + (f" and the {len(skipped)} skipped paths are allowed (--allow-skipped)" if skipped else "")
                          + f": {err[-300:]!r}")
            elif rc == 3 and (ok or any(o.get("error_code") not in RELAY_REFUSED_CODES
                                        for o in [*results.values(), *(o for got in by_path.values() for o in got)]
                                        if o.get("status") == "failed")):
                self.find("exit-code-truth", f"{who}: exit 3 (nothing went up: relay unreachable or refused) though "
                          f"{len(ok)} items were stored or a failure had another code: {err[-300:]!r}")
            elif rc not in (0, 1, 3) and rc >= 0 and rc not in CRASH_CODES:
                self.find("exit-code-truth", f"{who}: exit {rc}: {err[-300:]!r}")
            if final and missing and rc >= 0:
                self.find("json-truth", f"{who}: exit {rc}, {len(missing)} of {len(job.expected)} items "
                          f"absent from --json (e.g. {missing[0]!r}); stderr {err[-300:]!r}")
            if final and rc >= 0 and (missing_paths or alts_incomplete):
                self.find("json-truth", f"{who}: exit {rc}, paths without their one result: "
                          f"{(missing_paths + alts_incomplete)[:3]}")
        return results

    def check_watch(self, job: Job, child: Child, phase: str, final: bool) -> dict[str, dict]:
        """A watch run that ended: stopped by SIGTERM it exits 0; its events say the truth (a link not followed is
        never uploaded, a fitting file never waits in a clean run, only special paths are skipped)."""
        w = self.watch_runs[job.idx]
        w.read()
        w.done = True
        rc = child.returncode
        who = f"{phase} watch j{job.idx} ({job.account})"
        self.check_crash(child, who)
        self.check_leak(child, who)
        if rc is not None and signal.SIGKILL not in child.signals_sent:
            if rc != 0:
                how = "after SIGTERM" if signal.SIGTERM in child.signals_sent else "on its own"
                self.find("exit-code-truth", f"{who}: exit {rc} {how} (watch --help: 0 when stopped): "
                          f"{child.stderr()[-300:]!r}")
        results: dict[str, dict] = {}
        watch_failed: list[tuple[str, str, str]] = []
        skips = dict(job.skips)
        skips.update(self.extra_skips.get(job.idx, {}))
        for t, line in w.lines:
            try:
                obj = json.loads(line)
            except ValueError:
                self.find("json-truth", f"{who}: stdout line is not JSON: {line[:200]!r}")
                continue
            ev, key = obj.get("event"), obj.get("key")
            if ev == "finished":
                status = obj.get("status")
                if key in job.watch.waiting and status in OK_STATUSES:
                    self.find("quota-waiting", f"{who}: {key!r} {status}, though it is larger than the account's "
                              f"quota: {line[:300]!r}")
                    continue
                if key not in job.expected:
                    if self.forbidden(job, key):
                        self.find("symlink-not-followed", f"{who}: {status} {key!r}, a symbolic link, though -L "
                                  f"was not given: {line[:300]!r}")
                    else:
                        self.find("json-truth", f"{who}: reports unknown key {key!r}: {line[:300]!r}")
                    continue
                src = job.expected[key]
                results[key] = obj
                if status in OK_STATUSES:
                    if obj.get("bytes") != src.size or obj.get("sha1") != src.sha1:
                        self.find("json-truth", f"{who}: {key!r} {status} with bytes={obj.get('bytes')} "
                                  f"sha1={obj.get('sha1')}, source is {src.size} B {src.sha1}")
                    self.verify_object(job.account, key, src, f"{who} said {status}")
                else:
                    watch_failed.append((key, obj.get("error") or "", line))
            elif ev == "skipped":
                p = os.path.normpath(obj.get("path") or "")
                if p not in skips:
                    self.find("skipped-truth", f"{who}: skipped {p!r}, a regular file it can read: {line[:300]!r}")
                elif not obj.get("reason"):
                    self.find("json-truth", f"{who}: skipped without a reason: {line[:300]!r}")
                else:
                    self.ctx.stats.skipped += 1
            elif ev == "waiting":
                if key in job.expected and final:
                    self.find("quota-waiting", f"{who}: {key!r} fits the account's quota but waits (clean re-run): "
                              f"{line[:300]!r}")
                elif key not in job.expected and key not in job.watch.waiting:
                    self.find("json-truth", f"{who}: waiting for unknown key {key!r}: {line[:300]!r}")
        # watch --help: an unreachable relay never fails an item, a full one (quota, storage) makes it wait
        if watch_failed:
            self.check_full_answer(who, [(k, e) for k, e, _ in watch_failed])
            key, error, line = watch_failed[0]
            self.find("watch-item-failed", f"{who}: {len(watch_failed)} files that fit the quota ended failed "
                      f"(watch retries an unreachable relay and waits on a full one), e.g. {line[:300]!r}"
                      + (f"; relay: {self.relay_log_about(key, '.')!r}" if self.relay_log_about(key, '.') else ""))
        # a file that fits, made once one waits, is not held up by it
        which = "rerun" if phase == "rerun" else "fault"
        made = self.late_made.get((job.idx, which))
        late_key = job.watch.late_keys[which]
        if made is not None and made >= w.started and w.waiting and min(t for t, _ in w.waiting.values()) <= made:
            fin = w.finished.get(late_key)
            took = (fin[0] - made) if fin else None
            self.ctx.log(f"  {who}: {late_key!r} made while {len(w.waiting)} waited; "
                         + (f"stored {took:.1f}s later" if took is not None else "not stored while it ran"))
            if final and (took is None or took > WATCH_HELD_UP):
                self.find("quota-waiting", f"{who}: {late_key!r} fits the quota, made while "
                          f"{next(iter(w.waiting))!r} waited, "
                          + (f"stored only {took:.1f}s later" if took is not None else "never stored")
                          + f" (held up by the waiting file?): {w.last_about(late_key)}")
        if final:
            self.watch_final_gaps(job, w, who, report=True)
        return results

    def watch_final_gaps(self, job: Job, w: WatchRun, who: str, report: bool) -> list[str]:
        """What a watch run still owes: fitting files not in the store, waiting files without a waiting event,
        special paths without a skipped event. Empty once it may be stopped."""
        gaps = []
        for key, src in job.expected.items():
            which = next((k for k, v in job.watch.late_keys.items() if v == key), None)
            if which is not None and (job.idx, "link" if which == "link" else which) not in self.late_made:
                continue    # not made yet
            if not self.object_ok(job.account, key, src):
                gaps.append(f"{key!r} not stored ({w.last_about(key)})")
            elif which == ("rerun" if w.phase == "rerun" else "fault") and key not in w.finished:
                # In the store before the watch heard its RESULT: stopped now, the watch would never say it (and the
                # held-up check would read that as never stored).
                gaps.append(f"{key!r} stored, not yet said by the watch ({w.last_about(key)})")
        for key in job.watch.waiting:
            if key not in w.waiting:
                gaps.append(f"{key!r} (over the quota) never said waiting ({w.last_about(key)})")
        skips = dict(job.skips)
        skips.update(self.extra_skips.get(job.idx, {}))
        for p, kind in skips.items():
            if not w.skipped.get(p):
                gaps.append(f"{p!r} ({kind}) never said skipped")
        if report and gaps:
            self.find("clean-rerun-stores-all", f"{who}: by its end {len(gaps)} things undone, e.g. {gaps[:3]}; "
                      f"waiting: {sorted(w.waiting)[:2]}")
        return gaps

    def object_ok(self, account: str, key: str, src: Source) -> bool:
        p = layout.object_path(self.store, account, key)
        try:
            st = os.stat(p)
        except OSError:
            return False
        return st.st_size == src.size and self.sha1_of(p, st) == src.sha1

    def make_late(self, job: Job, which: str, phase: str) -> None:
        """Make a watch job's late file (moved in, or written in place) and, with the fault phase's, a link."""
        w = job.watch
        if (job.idx, which) in self.late_made:
            return
        top = job.inputs[0]
        name, src = w.late_fault if which == "fault" else w.late_rerun
        dest = os.path.join(top, name)
        if w.late_how == "move":
            os.rename(src.path, dest)
        else:   # written in place under its name, then closed
            with open(src.path, "rb") as f, open(dest, "wb") as g:
                shutil.copyfileobj(f, g)
            os.unlink(src.path)
        src.path = dest
        self.late_made[(job.idx, which)] = time.monotonic()
        made = [name]
        if which == "fault":
            link = os.path.join(top, w.late_link)
            os.symlink(w.late_link_target, link)
            self.late_made[(job.idx, "link")] = time.monotonic()
            if not job.follow:
                self.extra_skips.setdefault(job.idx, {})[layout.printed(link)] = "late-link"
            made.append(w.late_link)
        self.ctx.log(f"  {phase}: made {made!r} in watch j{job.idx}'s directory ({w.late_how})")

    # ------------------------------------------------------------ phases
    def stop_watch(self, idx: int, c: Child, why: str) -> None:
        """Stop a watch as its user would: SIGTERM; it must exit 0 within WATCH_STOP_GRACE."""
        w = self.watch_runs[idx]
        if w.stop_sent is None and c.poll() is None:
            w.stop_sent = time.monotonic()
            c.signal(signal.SIGTERM)
        if why == "deadline" and c.poll() is None and c.wait(WATCH_STOP_GRACE) is None:
            self.find("hang", f"{w.phase} watch j{idx} still running {WATCH_STOP_GRACE:.0f}s after SIGTERM: "
                      f"{c.stderr()[-200:]!r}")
            c.signal(signal.SIGKILL)
            c.wait(10)

    def watch_tick(self, idx: int, c: Child, phase: str, now: float) -> None:
        """A running watch: make the phase's late file once a file waits (or after 4 s), and stop the watch once it
        owes nothing (or say so if it ignores SIGTERM)."""
        job, w = self.plan.jobs[idx], self.watch_runs[idx]
        w.read()
        which = "rerun" if phase == "rerun" else "fault"
        if w.stop_sent is not None:
            if now - w.stop_sent > WATCH_STOP_GRACE and c.poll() is None:
                self.find("hang", f"{phase} watch j{idx} still running {WATCH_STOP_GRACE:.0f}s after SIGTERM: "
                          f"{c.stderr()[-200:]!r}")
                c.signal(signal.SIGKILL)
            return
        if (idx, which) not in self.late_made and (w.waiting or now - w.started > 4.0):
            self.make_late(job, which, phase)
        if (idx, which) in self.late_made and not self.watch_final_gaps(job, w, "", report=False):
            self.stop_watch(idx, c, "done")

    def run_phase(self, phase: str, address: str, limit: float, final: bool,
                  events=()) -> dict[int, dict[str, dict]]:
        agents: dict[int, Child] = {}
        done: dict[int, dict[str, dict]] = {}
        for job in self.plan.jobs:
            agents[job.idx] = self.start_agent(job, phase, address)
        t0 = time.monotonic()
        pending_bytes = any(e.trigger.kind == "bytes" for e in events)
        while True:
            now = time.monotonic()
            for idx, c in agents.items():
                if idx not in done and c.poll() is not None:
                    done[idx] = self.check_agent(self.plan.jobs[idx], c, phase, final)
            running = [c for i, c in agents.items() if i not in done]
            if not running:
                break
            if now - t0 > limit:
                for idx, c in agents.items():
                    if idx in done:
                        continue
                    if self.plan.jobs[idx].watch is not None:
                        # a watch runs until it is stopped: at the end of the phase, as its user would
                        self.stop_watch(idx, c, "deadline")
                        done[idx] = self.check_agent(self.plan.jobs[idx], c, phase, final)
                        continue
                    if final:
                        self.find("hang", f"{phase} agent j{idx} ({self.plan.jobs[idx].kind}) still running "
                                  f"after {limit:.0f} s with no faults: {c.stderr()[-200:]!r}")
                    else:
                        self.ctx.stats.deadline_kills += 1
                        self.broke = True
                    c.signal(signal.SIGKILL)
                    c.wait(10)
                    done[idx] = self.check_agent(self.plan.jobs[idx], c, phase, final)
                break
            for idx, c in agents.items():
                if idx not in done and self.plan.jobs[idx].watch is not None:
                    self.watch_tick(idx, c, phase, now)
            self.release_disk(phase)
            self.relay_check_alive()
            if self.restart_at is not None and now >= self.restart_at and self.filler is None:
                self.ctx.stats.relay_restarts += 1
                self.start_relay()
            if events:
                measured = self.data_bytes() if pending_bytes else 0
                for e in events:
                    if e.fired:
                        continue
                    reached = (now - t0 >= e.trigger.value) if e.trigger.kind == "time" else measured >= e.trigger.value
                    if not reached:
                        continue
                    if e.target == "relay":
                        if self.relay is None:
                            continue  # still down from an earlier event: wait for the restart
                        e.fired = True
                        self.broke = True
                        self.ctx.log(f"  {phase}: relay {e.action} at {e.trigger} (t+{now - t0:.1f}s)")
                        if e.action == "kill9":
                            self.ctx.stats.kills += 1
                            self.stop_relay(signal.SIGKILL, 10)
                        else:
                            self.stop_relay(signal.SIGTERM, 30)
                        self.restart_at = time.monotonic() + e.restart_after
                    elif e.target == "disk":
                        if self.filler is not None:
                            continue  # the disk is full already: this fill comes once it is freed
                        e.fired = True
                        self.broke = True
                        self.fill_disk(e, phase, t0)
                    else:
                        e.fired = True
                        c = agents.get(e.job)
                        if c is not None and e.job not in done and c.poll() is None:
                            self.ctx.log(f"  {phase}: kill -9 agent j{e.job} at {e.trigger} (t+{now - t0:.1f}s)")
                            self.ctx.stats.kills += 1
                            self.broke = True
                            c.signal(signal.SIGKILL)
                pending_bytes = any(not e.fired and e.trigger.kind == "bytes" for e in events)
            if now - self.last_quota_check > 0.5:
                self.last_quota_check = now
                self.check_quotas()
            if self.disk and now - self.last_sample > 0.5:
                self.last_sample = now
                self.sample(phase)
            step = 0.1 if pending_bytes else 0.25
            if self.restart_at is not None and self.filler is None:
                step = min(step, max(0.0, self.restart_at - time.monotonic()))
            if self.filler is not None:
                step = min(step, max(0.0, self.filler[2] - time.monotonic()))
            wait_any(running + ([self.relay] if self.relay else []), step)
        self.release_disk(phase, force=True)
        if self.restart_at is not None or self.relay is None:
            self.ctx.stats.relay_restarts += 1
            self.start_relay()
        self.check_quotas()
        if self.disk:
            self.sample(phase)
        return done

    # ------------------------------------------------------------ the round
    def run(self) -> None:
        p = self.plan
        self.setup()
        # phase 1: faults
        address = f"127.0.0.1:{self.relay_port}"
        if p.proxy_args is not None:
            address = self.start_proxy()
        self.ctx.log(f"  fault phase via {'proxy' if p.proxy_args is not None else 'direct'} "
                     f"({len(p.jobs)} agents, limit {p.phase_seconds:.1f}s)")
        t0 = time.monotonic()
        first = self.run_phase("fault", address, p.phase_seconds, final=False, events=p.events)
        self.stop_proxy()
        for j in p.jobs:   # a watch's late file and link are there for the re-run even if the fault phase ended first
            if j.watch is not None:
                self.make_late(j, "fault", "fault")
        if any(o.get("status") == "failed" for r in first.values() for o in r.values()):
            self.broke = True
        self.ctx.log(f"  fault phase done in {time.monotonic() - t0:.1f}s")
        # what is durable before the re-run
        staged_bytes, staged_files = self.staging_state()
        self.sessions_before = self.catalog_sessions()
        stored_before = {}
        for j in p.jobs:
            for key, src in self.job_keys(j).items():
                path = layout.object_path(self.store, j.account, key)
                try:
                    st = os.stat(path)
                    stored_before[(j.account, key)] = st.st_size == src.size and self.sha1_of(path, st) == src.sha1
                except OSError:
                    stored_before[(j.account, key)] = False
        # phase 2: the same agent commands again, no faults
        t0 = time.monotonic()
        limit = self.ctx.final_limit()
        final = self.run_phase("rerun", f"127.0.0.1:{self.relay_port}", limit, final=True)
        self.ctx.log(f"  clean re-run done in {time.monotonic() - t0:.1f}s")
        self.check_final(final)
        self.check_resend(final, staged_bytes, staged_files, stored_before)

    def catalog_sessions(self) -> dict[str, set[str]]:
        """The keys of each account's unfinished sessions in the relay's catalog (an upload under way or cut off)."""
        import sqlite3
        sessions: dict[str, set[str]] = {}
        try:
            db = sqlite3.connect(f"file:{os.path.join(self.data, 'catalog.sqlite')}?mode=ro", uri=True, timeout=10)
            try:
                for account, key in db.execute("SELECT account, key FROM session"):
                    sessions.setdefault(account, set()).add(key)
            finally:
                db.close()
        except sqlite3.Error as error:
            self.ctx.log(f"  (catalog unreadable: {error})")
        return sessions

    def check_final(self, final: dict[int, dict[str, dict]]) -> None:
        used = {a.name: self.account_bytes(a.name) for a in self.plan.accounts}
        # An unfinished session holds its durable bytes against the quota (README, quotas) until it commits or
        # expires, so while the re-run resumes it, it may hold up to its file's size: a refusal is right then too.
        held = {a.name: 0 for a in self.plan.accounts}
        for j in self.plan.jobs:
            for key, src in j.expected.items():
                if key in getattr(self, "sessions_before", {}).get(j.account, set()):
                    held[j.account] += src.size
        # The relay's disk: an item refused as the storage is full is right when it does not fit in what is free
        # now, above the relay's reserve (serve --help, --min-free); what it refused is all that the disk did not hold.
        free, reserve = self.disk_free() if self.disk else (0, 0)
        # What the agents' quota plans admitted and the full disk then refused: the plan counts it against the quota
        # (SPEC §7.2), so a file it left out for that room was rightly QUOTA_EXCEEDED, though it fits on its own now.
        admitted_refused = {a.name: 0 for a in self.plan.accounts}
        if self.disk:
            for j in self.plan.jobs:
                res = final.get(j.idx, {})
                for key, src in j.expected.items():
                    o = res.get(key)
                    if o is not None and o.get("status") not in OK_STATUSES and STORAGE_FULL_RE.search(o.get("error") or ""):
                        admitted_refused[j.account] += src.size
        refused = []
        for j in self.plan.jobs:
            if j.watch is not None:
                continue  # check_watch: every fitting file in the store by the end of its run
            res = final.get(j.idx, {})
            bad = []
            wanted = dict(j.expected)
            for a in j.alts:   # -L: one way of walking the directory (the other is skipped)
                wanted.update(a.via_link if any(k in res for k in a.via_link) else a.via_dir)
            for key, src in wanted.items():
                o = res.get(key)
                if o is not None and o.get("status") in OK_STATUSES:
                    continue
                quota = self.account(j.account).quota
                err = (o or {}).get("error") or ""
                if o is not None and quota is not None and "quota" in err.lower() \
                        and used[j.account] + held[j.account] + admitted_refused[j.account] + src.size > quota:
                    continue
                if self.disk and o is not None and STORAGE_FULL_RE.search(err):
                    if -(-src.size // 4096) * 4096 + reserve + TMPFS_SLACK > free:
                        refused.append(key)
                        continue
                    self.find("clean-rerun-stores-all", f"rerun agent j{j.idx} ({j.kind}, {j.account}): {key!r} "
                              f"({src.size} B) refused as the relay's storage is full, but {free} B are free now "
                              f"above a reserve of {reserve} B: {err[:200]!r}")
                    continue
                bad.append((key, o))
            if bad:
                key, o = bad[0]
                self.find("clean-rerun-stores-all", f"rerun agent j{j.idx} ({j.kind}, {j.account}): {len(bad)} of "
                          f"{len(wanted)} items not stored, e.g. {key!r}: "
                          f"{(o or {}).get('status', 'absent')} {((o or {}).get('error') or '')[:160]!r}")
        if self.disk:
            self.disk_refused = refused
            self.ctx.stats.refused_full += len(refused)
            self.ctx.log(f"  relay's disk after the re-run: {free} B free, reserve {reserve} B; "
                         f"{len(refused)} items refused as it is full (they do not fit)")

    def check_resend(self, final, staged_bytes: int, staged_files: int, stored_before) -> None:
        sent = 0
        allowed = 0
        stdin_unstored = 0
        full_sent = 0
        for j in self.plan.jobs:
            res = final.get(j.idx, {})
            for key, o in res.items():
                if not isinstance(o.get("sent_bytes"), int):
                    continue
                if self.disk and o.get("status") == "failed" and STORAGE_FULL_RE.search(o.get("error") or ""):
                    # bytes the relay had no room for and never acknowledged: sent again on each retry
                    full_sent += o["sent_bytes"]
                    continue
                sent += o["sent_bytes"]
            for key, src in self.job_keys(j).items():
                if j.stdin_source is not None or j.no_dedup or not stored_before[(j.account, key)]:
                    allowed += src.size
                if j.stdin_source is not None and not stored_before[(j.account, key)]:
                    stdin_unstored += src.size
        resumable = max(0, staged_bytes - stdin_unstored)
        bound = allowed - resumable + staged_files * (self.plan.stream_window + SYNC_BATCH + DIRECT_IO_SLACK)
        # A stripe cut off before it was complete is sent again whole (SPEC §6.7): with several connections each
        # staging file may hold one partial stripe per connection, and a stripe is at most 16 MiB below 4 GiB.
        connections = max((j.connections for j in self.plan.jobs), default=1)
        if connections > 1:
            bound += staged_files * connections * STRIPE
        self.ctx.log(f"  re-run sent {sent} B; bound {bound} B (sizes {allowed} - staged {resumable} + "
                     f"{staged_files} staging files x slack)"
                     + (f"; {full_sent} B more for items then refused as the disk is full" if full_sent else ""))
        if sent > bound:
            self.find("resend-bound", f"re-run sent {sent} B > bound {bound} B (sizes still to send {allowed}, "
                      f"staged before {staged_bytes} B in {staged_files} files, window {self.plan.stream_window})")

    def check_store(self) -> None:
        """Quiescent store: every file is an object of a planned account and key, identical to its source; no
        symbolic link not followed (nor what is under one, nor a directory the agent could not read) is an object."""
        expected = self.expected_all()
        unexpected = []
        for root, _, files in os.walk(self.store):
            for f in files:
                path = os.path.join(root, f)
                ak = layout.object_of_path(self.store, path)
                if ak is None or ak[0] not in expected or ak[1] not in expected[ak[0]]:
                    j = self.forbidden_by(*ak) if ak is not None else None
                    if j is not None:
                        self.find("symlink-not-followed", f"store: {ak[0]}/{ak[1]!r} is an object, but it is a "
                                  f"path j{j.idx} must skip (a link without -L, a loop, an unreadable directory)")
                    elif ak is not None and any(ak[1] in jj.watch.waiting for jj in self.plan.jobs
                                                if jj.watch and jj.account == ak[0]):
                        self.find("quota-waiting", f"store: {ak[0]}/{ak[1]!r} is an object though it is larger than "
                                  f"the account's quota")
                    else:
                        unexpected.append(os.path.relpath(path, self.store))
                    continue
                account, key = ak
                src = expected[account][key]
                st = os.lstat(path)
                sha = self.sha1_of(path, st)
                if sha != src.sha1:
                    other = self.whose(key, sha, account)
                    if other:
                        self.find("cross-account", f"store: {account}/{key!r} holds account {other}'s content")
                    else:
                        self.find("store-identity", f"store: {account}/{key!r} is {st.st_size} B sha1 {sha}, "
                                  f"source {src.size} B {src.sha1}")
                elif (account, key) in self.seen and self.seen[(account, key)] != sha:
                    self.find("cross-account", f"store: {account}/{key!r} changed after it was stored")
        for (account, key) in self.seen:
            if not os.path.exists(layout.object_path(self.store, account, key)):
                self.find("cross-account", f"store: {account}/{key!r} vanished after it was stored")
        if unexpected:
            self.find("store-identity", f"{len(unexpected)} files in the store are no planned account's object "
                      f"(<store>/<account>/<key>), e.g. {unexpected[:3]!r}")
        self.check_quotas()

    def unmount(self) -> None:
        """After the round's last look at the store: the relay's tmpfs goes (tools/soak's cleanup retries at exit)."""
        if self.mounted:
            if self.filler is not None:
                self.release_disk("teardown", force=True)
            if umount(self.disk_dir, self.ctx.mounts):
                self.mounted = False
            else:
                self.ctx.log(f"  soak tool problem: could not unmount {self.disk_dir} (retried at exit)")

    def teardown(self, ok: bool) -> None:
        try:
            self.stop_proxy()
        finally:
            try:
                if self.relay is not None:
                    self.stop_relay(signal.SIGTERM, 30)
            finally:
                if self.filler is not None:
                    self.release_disk("teardown", force=True)
        mine = {c.pid for c in self.ctx.registry.children}
        self.ctx.registry.reap_all()
        left = processes_mentioning(self.dir, exclude=set())
        for pid, cmd in left:
            self.find("leftovers", f"process {pid} still running after the round: {cmd[:200]!r}"
                      + (" (started by the soak)" if pid in mine else ""))
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
