"""A round's plan, drawn from one seeded RNG: accounts, relay windows, agent jobs, their files, and
every fault decision (proxy cuts and stalls, kill points as time or byte offsets). Materializing
the plan writes the source files and records their size and SHA-1."""
from __future__ import annotations

import hashlib
import os
import random
from dataclasses import dataclass, field

from . import layout

KiB = 1024
MiB = 1024 * 1024

NAME_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789-_"
EXOTIC = ["é", "ß", "日本", " ", "+", "~", "="]


@dataclass
class Source:
    path: str            # the file on disk
    size: int
    seed: int
    mode: str            # random | zeros | copy-of:<seed>
    sha1: str = ""


@dataclass
class Account:
    name: str
    quota: int | None = None
    token: str = ""


@dataclass
class Job:
    idx: int
    account: str
    kind: str                       # files | dir | bigdir | mixed | stdin
    root: str                       # src/<job dir>: the job's top-level entries live here
    inputs: list[str] = field(default_factory=list)     # paths given to `send`
    stdin_source: Source | None = None
    stdin_name: str | None = None
    prefix: str | None = None
    concurrency: int = 8
    connections: int = 1
    no_dedup: bool = False
    retry_for: str | None = None
    twin_of: int | None = None      # same key names as that job, another account
    dup_of: int | None = None       # the very same command as that job, run at the same time
    files: list[tuple[str, Source]] = field(default_factory=list)  # (relative path under root, source)
    expected: dict[str, Source] = field(default_factory=dict)      # key -> source (after materialize)

    def argv(self, agent_bin: str, relay: str, token: str, ca: str) -> list[str]:
        a = [agent_bin, "send", "--relay", relay, "--token", token, "--ca", ca, "--json", "--quiet",
             "--concurrency", str(self.concurrency)]
        if self.connections > 1:
            a += ["--connections", str(self.connections)]
        if self.prefix:
            a += ["--prefix", self.prefix]
        if self.no_dedup:
            a.append("--no-dedup")
        if self.retry_for:
            a += ["--retry-for", self.retry_for]
        if self.stdin_source is not None:
            a += ["--name", self.stdin_name, "-"]
        else:
            a += self.inputs
        return a


@dataclass
class Trigger:
    kind: str       # "time" (seconds after the phase started) | "bytes" (bytes under the relay's data dir)
    value: float

    def __str__(self) -> str:
        return f"t+{self.value:.2f}s" if self.kind == "time" else f"{int(self.value)}B"


@dataclass
class FaultEvent:
    target: str                 # relay | agent
    action: str                 # kill9 | term (relay only)
    trigger: Trigger
    job: int | None = None
    restart_after: float = 0.0  # relay: seconds before it is started again on the same --data
    fired: bool = False


@dataclass
class Plan:
    index: int
    seed: int
    accounts: list[Account]
    relay_args: list[str]
    stream_window: int
    jobs: list[Job]
    proxy_args: list[str] | None
    events: list[FaultEvent]
    phase_seconds: float
    total_bytes: int = 0
    total_files: int = 0

    def describe(self) -> str:
        acc = ",".join(f"{a.name}" + (f"(quota {a.quota})" if a.quota is not None else "") for a in self.accounts)
        jobs = " ".join(f"j{j.idx}:{j.kind}/{j.account}/{len(j.expected) or len(j.files) or 1}"
                        + ("/nodedup" if j.no_dedup else "") + (f"/conn{j.connections}" if j.connections > 1 else "")
                        + (f"/twin{j.twin_of}" if j.twin_of is not None else "")
                        + (f"/dup{j.dup_of}" if j.dup_of is not None else "")
                        for j in self.jobs)
        ev = " ".join(f"{e.target}{'' if e.job is None else e.job}:{e.action}@{e.trigger}" for e in self.events)
        return (f"accounts={acc} relay[{' '.join(self.relay_args)}] proxy[{' '.join(self.proxy_args or ['none'])}] "
                f"jobs: {jobs} events: {ev or 'none'} phase={self.phase_seconds:.1f}s")


def _name(rng: random.Random, stem: str) -> str:
    n = stem + "-" + "".join(rng.choice(NAME_CHARS) for _ in range(rng.randint(1, 8)))
    if rng.random() < 0.1:
        n += rng.choice(EXOTIC) + "x"
    if rng.random() < 0.5:
        n += rng.choice([".bin", ".jpg", ".txt", ".tar", ""])
    return n


def _small_size(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.08:
        return 0
    if r < 0.15:
        return rng.choice([1, 2, 4095, 4096, 4097, 65535, 65536, 65537])
    if r < 0.75:
        return rng.randint(1, 16 * KiB)
    return rng.randint(16 * KiB, 256 * KiB)


def _file_size(rng: random.Random, large_cap: int, remaining: int) -> int:
    r = rng.random()
    if r < 0.7:
        size = _small_size(rng)
    elif r < 0.9:
        size = rng.randint(256 * KiB, 8 * MiB)
    else:
        size = rng.randint(8 * MiB, large_cap)
    return max(0, min(size, remaining))


def _large_size(rng: random.Random, large_cap: int, remaining: int) -> int:
    return max(0, min(rng.randint(4 * MiB, large_cap), remaining))


def _mode(rng: random.Random) -> str:
    return "zeros" if rng.random() < 0.05 else "random"


def plan_round(index: int, seed: int, short: bool) -> Plan:
    rng = random.Random(seed)
    # Drawn apart from `rng`, so that the seeds replayed before --connections existed keep their plans.
    connections_rng = random.Random(f"{seed}-connections")
    large_cap = 32 * MiB if short else 200 * MiB
    budget = rng.choice([8, 16, 24, 40] if short else [24, 48, 96, 160, 240]) * MiB
    max_dir_files = 600 if short else 3000
    files_left = 1000 if short else 3500   # per round, twins and duplicates included (~80 small files/s)

    n_acc = rng.choice([1, 2, 2, 3, 3])
    accounts = [Account(layout.DEV_ACCOUNT)]
    for name in ["alice", "bob"][: n_acc - 1]:
        accounts.append(Account(name))

    stream_window = rng.choice([64 * KiB, 128 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 8 * MiB])
    conn_window = rng.choice([64 * KiB, 256 * KiB, 1 * MiB, 8 * MiB, 32 * MiB])
    max_streams = rng.choice([1, 2, 3, 8, 64])
    relay_args = ["--stream-window", str(stream_window), "--connection-window", str(conn_window),
                  "--max-streams", str(max_streams)]
    if rng.random() < 0.3:
        relay_args += ["--direct-io-buffer", rng.choice(["0", "4K", "64K", "4M"])]

    jobs: list[Job] = []
    remaining = budget
    n_jobs = rng.randint(1, 4 if short else 6)
    for j in range(n_jobs):
        kind = rng.choices(["files", "dir", "bigdir", "mixed", "stdin"], weights=[4, 3, 2, 2, 2])[0]
        if kind in ("dir", "mixed") and files_left < 100:
            kind = "files"
        job = Job(idx=len(jobs), account=rng.choice(accounts).name, kind=kind, root=f"j{len(jobs)}")
        job.concurrency = rng.choice([1, 2, 3, 4, 8, 16, 32])
        job.connections = connections_rng.choice([1, 1, 2, 3])
        job.no_dedup = rng.random() < 0.25
        if rng.random() < 0.3:
            job.prefix = rng.choice(["p", "up/load", "préfixe", "a b"]) + str(job.idx)
        if rng.random() < 0.2:
            job.retry_for = rng.choice(["10s", "30s", "2m"])
        d = job.idx
        if kind == "stdin":
            size = min(rng.choice([0, 1, rng.randint(1, 64 * KiB), rng.randint(64 * KiB, 4 * MiB),
                                   rng.randint(4 * MiB, min(64 * MiB, large_cap))]), remaining)
            job.stdin_name = (f"stdin{d}/" if rng.random() < 0.5 else "") + _name(rng, f"s{d}")
            job.files.append((f"stdin-{d}.data", Source("", size, rng.getrandbits(48), _mode(rng))))
            remaining -= size
        if kind in ("files", "mixed"):
            for i in range(rng.randint(1, 6)):
                size = _file_size(rng, large_cap, remaining)
                if i < 3 and rng.random() < 0.25:  # several large ones at once
                    size = _large_size(rng, large_cap, remaining)
                job.files.append((_name(rng, f"f{d}.{i}"), Source("", size, rng.getrandbits(48), _mode(rng))))
                remaining -= size
        if kind in ("dir", "mixed"):
            top = _name(rng, f"d{d}")
            n = rng.randint(100, max(100, min(max_dir_files, files_left)))
            subdirs = [top] + [f"{top}/{_name(rng, 's')}" for _ in range(rng.randint(0, 6))]
            subdirs += [f"{rng.choice(subdirs)}/{_name(rng, 'n')}" for _ in range(rng.randint(0, 3))]
            for i in range(n):
                size = min(_small_size(rng), remaining)
                job.files.append((f"{rng.choice(subdirs)}/{i}-{_name(rng, 'x')}",
                                  Source("", size, rng.getrandbits(48), _mode(rng))))
                remaining -= size
        if kind == "bigdir":
            top = _name(rng, f"b{d}")
            for i in range(rng.randint(2, 5)):
                size = _large_size(rng, large_cap, remaining) if rng.random() < 0.8 else _small_size(rng)
                job.files.append((f"{top}/{_name(rng, f'big{i}')}", Source("", size, rng.getrandbits(48), _mode(rng))))
                remaining -= size
        files_left -= len(job.files)
        if kind != "stdin":
            tops = sorted({p.split("/")[0] for p, _ in job.files})
            job.inputs = tops
        jobs.append(job)
        remaining = max(remaining, 0)

    # the same key names under another account (content usually different)
    if len(accounts) > 1:
        for origin in list(jobs):
            if rng.random() < 0.35 and len(origin.files) <= files_left:
                files_left -= len(origin.files)
                others = [a.name for a in accounts if a.name != origin.account]
                twin = Job(idx=len(jobs), account=rng.choice(others), kind=origin.kind, root=f"j{len(jobs)}",
                           inputs=list(origin.inputs), stdin_name=origin.stdin_name, prefix=origin.prefix,
                           concurrency=rng.choice([1, 4, 8, 16]), no_dedup=rng.random() < 0.25, twin_of=origin.idx)
                same = rng.random() < 0.2
                for rel, src in origin.files:
                    size = src.size if same or rng.random() < 0.5 else _small_size(rng)
                    twin.files.append((rel, Source("", size, src.seed if same else rng.getrandbits(48), src.mode)))
                if origin.kind == "stdin":
                    twin.stdin_source = None
                jobs.append(twin)
    # the very same command twice at once
    for origin in list(jobs):
        if rng.random() < 0.12 and len(origin.files) <= files_left:
            files_left -= len(origin.files)
            jobs.append(Job(idx=len(jobs), account=origin.account, kind=origin.kind, root=origin.root,
                            inputs=list(origin.inputs), stdin_name=origin.stdin_name, prefix=origin.prefix,
                            concurrency=rng.choice([1, 8]), no_dedup=origin.no_dedup, dup_of=origin.idx,
                            files=origin.files))

    # quotas: some accounts get small ones (relative to what they will be sent)
    planned: dict[str, int] = {}
    for job in jobs:
        if job.dup_of is None:
            planned[job.account] = planned.get(job.account, 0) + sum(s.size for _, s in job.files)
    for a in accounts:
        if a.name != layout.DEV_ACCOUNT and rng.random() < 0.45:
            p = planned.get(a.name, 0)
            a.quota = max(64 * KiB, int(p * rng.uniform(0.2, 1.3)))

    # faults
    proxy_args = None
    phase = rng.uniform(6, 10) if short else rng.uniform(10, 25)
    if rng.random() < 0.55:
        proxy_args = []
        if rng.random() < 0.8:
            lo = rng.choice([64 * KiB, 512 * KiB, 2 * MiB, 8 * MiB])
            hi = lo + rng.choice([1 * MiB, 16 * MiB, 64 * MiB])
            proxy_args += ["--cut-random", str(rng.getrandbits(32)), "--cut-min", str(lo), "--cut-max", str(hi)]
        if rng.random() < 0.35 or not proxy_args:
            proxy_args += ["--delay-ms", str(rng.choice([5, 50, 200, 800]))]
        if rng.random() < 0.6:
            proxy_args.append("--every")
        proxy_args += ["--server-close", rng.choice(["fin", "rst"])]
    total = sum(sum(s.size for _, s in j.files) for j in jobs if j.dup_of is None)
    events: list[FaultEvent] = []

    def trigger() -> Trigger:
        if rng.random() < 0.5 or total == 0:
            return Trigger("time", rng.uniform(0.05, phase * 0.9))
        return Trigger("bytes", rng.randint(0, max(1, total)))
    for _ in range(rng.choice([0, 0, 1, 1, 2])):
        events.append(FaultEvent("relay", "term" if rng.random() < 0.15 else "kill9", trigger(),
                                 restart_after=rng.choice([0.0, 0.0, rng.uniform(0.1, 3.0)])))
    for job in jobs:
        if rng.random() < 0.3:
            events.append(FaultEvent("agent", "kill9", trigger(), job=job.idx))
    plan = Plan(index, seed, accounts, relay_args, stream_window, jobs, proxy_args, events, phase)
    plan.total_bytes = total
    plan.total_files = sum(len(j.files) for j in jobs if j.dup_of is None)
    return plan


def _write_content(path: str, src: Source) -> str:
    """Write `src.size` bytes determined by (seed, mode); returns the SHA-1 hex."""
    h = hashlib.sha1()
    r = random.Random(src.seed)
    with open(path, "wb") as f:
        if src.mode == "zeros":
            block = bytes(MiB)
        else:
            block = r.randbytes(min(src.size, MiB) or 1)
        left = src.size
        i = 0
        while left > 0:
            if src.mode == "zeros":
                chunk = block[: min(left, MiB)]
            else:
                rot = (i * 7919) % len(block)
                chunk = (i.to_bytes(8, "little") + block[rot:] + block[:rot])[: min(left, MiB)]
            f.write(chunk)
            h.update(chunk)
            left -= len(chunk)
            i += 1
    return h.hexdigest()


def materialize(plan: Plan, src_dir: str) -> None:
    """Write every job's files under src_dir/<job root>/ and compute each job's expected keys."""
    written: dict[str, Source] = {}
    for job in plan.jobs:
        base = os.path.join(src_dir, job.root)
        os.makedirs(base, exist_ok=True)
        if job.dup_of is not None:
            origin = plan.jobs[job.dup_of]
            job.stdin_source = origin.stdin_source
            job.inputs = list(origin.inputs)
            job.expected = dict(origin.expected)
            continue
        for rel, src in job.files:
            full = os.path.join(base, *rel.split("/"))
            src.path = full
            if full not in written:
                os.makedirs(os.path.dirname(full), exist_ok=True)
                src.sha1 = _write_content(full, src)
                written[full] = src
        if job.kind == "stdin":
            job.stdin_source = job.files[0][1]
            key = f"{job.prefix}/{job.stdin_name}" if job.prefix else job.stdin_name  # --prefix: "every key"
            job.expected = {key: job.stdin_source}
        else:
            job.inputs = [os.path.join(base, t) for t in job.inputs]
            by_path = {s.path: s for _, s in job.files}
            job.expected = {}
            for inp in job.inputs:
                for key, path in layout.keys_for_path(inp, job.prefix).items():
                    job.expected[key] = by_path[path]
