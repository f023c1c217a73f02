"""One soak round: relay + accounts, a fault phase (proxy cuts and stalls, kill -9 of relay and agents),
a clean re-run of the same agent commands, and the invariants checked along the way."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
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
OK_STATUSES = ("stored", "deduplicated")
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


class RoundAbort(Exception):
    pass


class Round:
    def __init__(self, ctx: Ctx, plan: Plan):
        self.ctx = ctx
        self.plan = plan
        self.dir = os.path.join(ctx.root, f"round-{plan.index}")
        self.src = os.path.join(self.dir, "src")
        self.data = os.path.join(self.dir, "data")
        self.logs = os.path.join(self.dir, "logs")
        self.store = layout.store_root(self.data)
        for d in (self.src, self.data, self.logs):
            os.makedirs(d, exist_ok=True)
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
        out: dict[str, dict[str, Source]] = {}
        for j in self.plan.jobs:
            out.setdefault(j.account, {}).update(j.expected)
        return out

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
        return [self.ctx.relay_bin, "serve", "--dev", "--data", self.data, "--listen", f"127.0.0.1:{port}",
                "--ready-file", ready, "--log-level", "warning"] + self.plan.relay_args

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
            self.ctx.stats.relay_restarts += 1
            self.start_relay()

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
        materialize(self.plan, self.src)
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
        self.ca = layout.dev_ca(self.data)

    # ------------------------------------------------------------ agents
    def start_agent(self, job: Job, phase: str, address: str) -> Child:
        acct = self.account(job.account)
        argv = job.argv(self.ctx.agent_bin, address, acct.token, self.ca)
        self.ctx.stats.agents += 1
        return Child(self.ctx.registry, f"{phase}-j{job.idx}", argv, self.logs,
                     stdin_file=job.stdin_source.path if job.stdin_source is not None else None)

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

    def check_agent(self, job: Job, child: Child, phase: str, final: bool) -> dict[str, dict]:
        rc = child.returncode
        err = child.stderr()
        by_us = child.killed_by_us()
        who = f"{phase} agent j{job.idx} ({job.kind}, {job.account})"
        if rc is not None and rc < 0 and not by_us:
            self.find("crash", f"{who} died of signal {-rc}: {err[-300:]!r}")
        elif rc in CRASH_CODES:
            self.find("crash", f"{who} exit {rc}: {err[-300:]!r}")
        m = CRASH_RE.search(err)
        if m:
            self.find("crash", f"{who} stderr: {err[max(0, m.start() - 150): m.end() + 200]!r}")
        results: dict[str, dict] = {}
        for line in child.stdout().splitlines():
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                self.find("json-truth", f"{who}: stdout line is not JSON: {line[:200]!r}")
                continue
            key, status = obj.get("key"), obj.get("status")
            if key not in job.expected:
                self.find("json-truth", f"{who}: reports unknown key {key!r}")
                continue
            if key in results:
                self.find("json-truth", f"{who}: reports {key!r} twice")
            results[key] = obj
            src = job.expected[key]
            if status not in ("stored", "deduplicated", "failed"):
                self.find("json-truth", f"{who}: {key!r} has status {status!r}")
            if not isinstance(obj.get("sent_bytes"), int):
                self.find("json-truth", f"{who}: {key!r} has no integer sent_bytes: {line[:200]!r}")
            if status in OK_STATUSES:
                if obj.get("bytes") != src.size or obj.get("sha1") != src.sha1:
                    self.find("json-truth", f"{who}: {key!r} {status} with bytes={obj.get('bytes')} "
                              f"sha1={obj.get('sha1')}, source is {src.size} B {src.sha1}")
                self.verify_object(job.account, key, src, f"{who} said {status}")
            elif status == "failed" and not obj.get("error"):
                self.find("json-truth", f"{who}: {key!r} failed without an error")
        if rc is not None and not by_us:
            ok = [k for k in job.expected if results.get(k, {}).get("status") in OK_STATUSES]
            missing = [k for k in job.expected if k not in results]
            failed = [k for k, o in results.items() if o.get("status") == "failed"]
            if rc == 0 and (missing or failed):
                self.find("exit-code-truth", f"{who}: exit 0 but {len(failed)} failed, {len(missing)} missing "
                          f"of {len(job.expected)} (e.g. {(failed + missing)[0]!r})")
            elif rc == 1 and len(ok) == len(job.expected):
                self.find("exit-code-truth", f"{who}: exit 1 though all {len(ok)} items were stored")
            elif rc not in (0, 1) and rc >= 0 and rc not in CRASH_CODES:
                self.find("exit-code-truth", f"{who}: exit {rc}: {err[-300:]!r}")
            if final and missing and rc >= 0:
                self.find("json-truth", f"{who}: exit {rc}, {len(missing)} of {len(job.expected)} items "
                          f"absent from --json (e.g. {missing[0]!r}); stderr {err[-300:]!r}")
        return results

    # ------------------------------------------------------------ phases
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
            self.relay_check_alive()
            if self.restart_at is not None and now >= self.restart_at:
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
            step = 0.1 if pending_bytes else 0.25
            if self.restart_at is not None:
                step = min(step, max(0.0, self.restart_at - time.monotonic()))
            wait_any(running + ([self.relay] if self.relay else []), step)
        if self.restart_at is not None or self.relay is None:
            self.ctx.stats.relay_restarts += 1
            self.start_relay()
        self.check_quotas()
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
        if any(o.get("status") == "failed" for r in first.values() for o in r.values()):
            self.broke = True
        self.ctx.log(f"  fault phase done in {time.monotonic() - t0:.1f}s")
        # what is durable before the re-run
        staged_bytes, staged_files = self.staging_state()
        self.sessions_before = self.catalog_sessions()
        stored_before = {}
        for j in p.jobs:
            for key, src in j.expected.items():
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
        for j in self.plan.jobs:
            res = final.get(j.idx, {})
            bad = []
            for key, src in j.expected.items():
                o = res.get(key)
                if o is not None and o.get("status") in OK_STATUSES:
                    continue
                quota = self.account(j.account).quota
                err = (o or {}).get("error") or ""
                if o is not None and quota is not None and "quota" in err.lower() and used[j.account] + held[j.account] + src.size > quota:
                    continue
                bad.append((key, o))
            if bad:
                key, o = bad[0]
                self.find("clean-rerun-stores-all", f"rerun agent j{j.idx} ({j.kind}, {j.account}): {len(bad)} of "
                          f"{len(j.expected)} items not stored, e.g. {key!r}: "
                          f"{(o or {}).get('status', 'absent')} {((o or {}).get('error') or '')[:160]!r}")

    def check_resend(self, final, staged_bytes: int, staged_files: int, stored_before) -> None:
        sent = 0
        allowed = 0
        stdin_unstored = 0
        for j in self.plan.jobs:
            res = final.get(j.idx, {})
            sent += sum(o.get("sent_bytes") or 0 for o in res.values() if isinstance(o.get("sent_bytes"), int))
            for key, src in j.expected.items():
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
                     f"{staged_files} staging files x slack)")
        if sent > bound:
            self.find("resend-bound", f"re-run sent {sent} B > bound {bound} B (sizes still to send {allowed}, "
                      f"staged before {staged_bytes} B in {staged_files} files, window {self.plan.stream_window})")

    def check_store(self) -> None:
        """Quiescent store: every file is an object of a planned account and key, identical to its source."""
        expected = self.expected_all()
        unexpected = []
        for root, _, files in os.walk(self.store):
            for f in files:
                path = os.path.join(root, f)
                ak = layout.object_of_path(self.store, path)
                if ak is None or ak[0] not in expected or ak[1] not in expected[ak[0]]:
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

    def teardown(self, ok: bool) -> None:
        try:
            self.stop_proxy()
        finally:
            if self.relay is not None:
                self.stop_relay(signal.SIGTERM, 30)
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
