"""A round's plan, drawn from one seeded RNG: accounts, relay windows, agent jobs, their files, and
every fault decision (proxy cuts and stalls, kill points as time or byte offsets). Materializing
the plan writes the source files and records their size and SHA-1.

Later additions draw from RNGs of their own, seeded from the round's seed and a name, so that a seed
replayed from before them keeps the rest of its plan: `-connections`, `-specials` (symbolic links,
a FIFO, names that are not UTF-8 or make no key, awkward names, an unreadable directory, -L,
--allow-skipped), `-disk` (the relay's --data on a small tmpfs, a filler that fills it) and `-watch`
(an `upload-agent watch` job on an account whose quota one file never fits)."""
from __future__ import annotations

import hashlib
import os
import random
import unicodedata
from dataclasses import dataclass, field

from . import layout

KiB = 1024
MiB = 1024 * 1024

NAME_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789-_"
EXOTIC = ["é", "ß", "日本", " ", "+", "~", "="]
# Names a key may hold (stored like any other): spaces at either end, dots only, a leading dash, URL and shell
# characters, decomposed Unicode (kept as its bytes, not normalized), 4-byte UTF-8, a long name.
AWKWARD = [" lead space", "trail space ", "...", ".hidden", "-dash", "a#b", "q?x", "pct%41", 'quo"te', "it's",
           unicodedata.normalize("NFD", "café-nfd"), "emoji\U0001F600", "y" * 200, "star*", "[br]", "colon:x",
           "semi;x", "amp&x", "<lt>", "pipe|x", "{br}", "~tilde", "日本語", "a b  c", "+plus", "=eq"]
# Characters no key may hold (send --help: "a backslash, a control character"): such a file fails alone.
BAD_CHARS = ["\\", "\n", "\t", "\x01"]
# Bytes that are not UTF-8, as Python's surrogate escapes (0xff, 0xfe, 0xe9 then "x", 0xc3 then "(").
NON_UTF8 = ["\udcff", "\udcfe", "\udce9x", "\udcc3("]


@dataclass
class Source:
    path: str            # the file on disk
    size: int
    seed: int
    mode: str            # random | zeros | copy-of:<seed>
    sha1: str = ""


@dataclass
class Special:
    """A directory entry that is not a plain regular file, or a regular file whose name is special; or (arg) a path
    named on the command line. kind: link-file-in | link-file-out | link-dir-in | link-dir-out | link-dangling |
    link-loop | fifo | nonutf8 | badname | unreadable | missing."""
    kind: str
    rel: str                        # under the job's root ("/" between segments; may hold surrogate escapes)
    target: str = ""                # a link's target as written (relative); out-links: filled in by materialize
    target_rel: str = ""            # link-file-in / link-dir-in: the target under the job's root
    source: Source | None = None    # the bytes a link leads to, or the file's own (nonutf8, badname)
    files: list[tuple[str, Source]] = field(default_factory=list)  # link-dir-*, unreadable: (rel to it, source)
    arg: bool = False               # named on the command line


@dataclass
class Alt:
    """-L and a link to a directory that is also walked directly: walked once, under one path or the other; the
    path not walked gets one "skipped" line (send --help: "walk the directories (each once)")."""
    link_path: str                  # printed path of the link
    dir_path: str                   # printed path of the directory
    via_link: dict[str, Source]     # keys when walked through the link
    via_dir: dict[str, Source]      # keys when walked directly


@dataclass
class WatchPlan:
    """An `upload-agent watch` job: its directory, the files that never fit the account's quota (they wait), and
    what the soak makes in it while it runs."""
    top: str                                        # the watched directory, under the job's root
    waiting_files: list[tuple[str, Source]]         # (rel under root, source): each larger than the quota
    late_fault: tuple[str, Source]                  # (name in top, source): made during the fault phase
    late_rerun: tuple[str, Source]                  # made during the clean re-run, once a file waits
    late_how: str                                   # move (renamed in) | write (written in place, closed)
    late_link: str                                  # name in top of a link made with late_fault ...
    late_link_target: str                           # ... to this fitting file (name in top)
    settle: str = "1s"
    waiting: dict[str, Source] = field(default_factory=dict)     # key -> source (materialize)
    late_keys: dict[str, str] = field(default_factory=dict)      # "fault" / "rerun" / "link" -> key


@dataclass
class Disk:
    """The relay's --data on a tmpfs of `size` bytes: small (what the round sends does not fit) or filler (it fits;
    disk:fill events fill it for a while)."""
    size: int
    min_free: int | None
    mode: str


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
    follow: bool = False            # -L / --follow-symlinks
    allow_skipped: bool = False     # --allow-skipped
    nocaps: bool = False            # run under setpriv --bounding-set=-all (an unreadable directory shows)
    specials: list[Special] = field(default_factory=list)
    watch: WatchPlan | None = None
    state: str | None = None        # --state (watch jobs: their own queue)
    # what the agent must say about paths other than expected keys (materialize):
    skips: dict[str, str] = field(default_factory=dict)       # printed path -> kind: one "skipped" result each
    fails: dict[str, str] = field(default_factory=dict)       # printed path -> kind: one "failed" result each
    alts: list[Alt] = field(default_factory=list)
    forbidden: list[str] = field(default_factory=list)        # keys (and key/...) of links not followed: never stored
    # On an account with a quota: `send`'s check of the whole selection (SPEC §7.2) either sends what fits
    # (--send-what-fits) or is left to the relay's refusals at OPEN (--no-quota-check); either way each item that does
    # not fit is refused on its own, as the final check expects. The default (nothing sent when the selection does not
    # fit) is tested end to end (CommandLineTests).
    quota_flag: str | None = None

    def argv(self, agent_bin: str, relay: str, token: str, ca: str) -> list[str]:
        a = [agent_bin, "watch" if self.watch else "send", "--relay", relay, "--token", token, "--ca", ca,
             "--json", "--quiet", "--concurrency", str(self.concurrency)]
        if self.nocaps:
            a = ["setpriv", "--bounding-set=-all"] + a
        if self.follow:
            a.append("--follow-symlinks" if self.idx % 2 else "-L")
        if self.allow_skipped:
            a.append("--allow-skipped")
        if self.quota_flag and not self.watch:
            a.append(self.quota_flag)
        if self.state:
            a += ["--state", self.state]
        if self.watch:
            a += ["--settle", self.watch.settle]
        if self.connections > 1:
            a += ["--connections", str(self.connections)]
        if self.prefix:
            a += ["--prefix", self.prefix]
        if self.no_dedup:
            a.append("--no-dedup")
        if self.retry_for and not self.watch:
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
    target: str                 # relay | agent | disk
    action: str                 # kill9 | term (relay only) | fill (disk: the relay's tmpfs filled to ENOSPC)
    trigger: Trigger
    job: int | None = None
    restart_after: float = 0.0  # relay: seconds before it is started again on the same --data
    hold: float = 0.0           # disk fill: seconds the disk stays full
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
    disk: Disk | None = None

    def describe(self) -> str:
        acc = ",".join(f"{a.name}" + (f"(quota {a.quota})" if a.quota is not None else "") for a in self.accounts)
        jobs = " ".join(f"j{j.idx}:{j.kind}/{j.account}/{len(j.expected) or len(j.files) or 1}"
                        + ("/nodedup" if j.no_dedup else "") + (f"/conn{j.connections}" if j.connections > 1 else "")
                        + (f"/twin{j.twin_of}" if j.twin_of is not None else "")
                        + (f"/dup{j.dup_of}" if j.dup_of is not None else "")
                        + ("/L" if j.follow else "") + ("/allow-skipped" if j.allow_skipped else "")
                        + ("/nocaps" if j.nocaps else "") + (f"/retry{j.retry_for}" if j.retry_for else "")
                        + (f"/special[{','.join(sp.kind + ('(arg)' if sp.arg else '') for sp in j.specials)}]"
                           if j.specials else "")
                        + (f"/waiting{len(j.watch.waiting_files)}/late-{j.watch.late_how}" if j.watch else "")
                        for j in self.jobs)
        ev = " ".join(f"{e.target}{'' if e.job is None else e.job}:{e.action}@{e.trigger}"
                      + (f"/hold{e.hold:.1f}s" if e.action == "fill" else "") for e in self.events)
        disk = (f" disk[tmpfs {self.disk.size // MiB}M min-free "
                f"{'default' if self.disk.min_free is None else str(self.disk.min_free // KiB) + 'K'} {self.disk.mode}]"
                if self.disk else "")
        return (f"accounts={acc} relay[{' '.join(self.relay_args)}] proxy[{' '.join(self.proxy_args or ['none'])}]"
                f"{disk} jobs: {jobs} events: {ev or 'none'} phase={self.phase_seconds:.1f}s")


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
    quotas = {a.name for a in accounts if a.quota is not None}
    for job in jobs:
        if job.account in quotas:
            job.quota_flag = "--send-what-fits" if job.idx % 2 == 0 else "--no-quota-check"

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
    # symbolic links and other entries that are not plain files (each job's draws in job order; a twin draws its
    # own, a duplicate runs the very same command on the very same files)
    specials_rng = random.Random(f"{seed}-specials")
    for job in jobs:
        if job.dup_of is None:
            _draw_specials(specials_rng, job)
    for job in jobs:
        if job.dup_of is not None:
            o = jobs[job.dup_of]
            job.specials, job.follow, job.allow_skipped, job.nocaps = o.specials, o.follow, o.allow_skipped, o.nocaps
            job.inputs = list(o.inputs)
    # an `upload-agent watch` on an account of its own whose quota one file (or two) never fits
    watch_rng = random.Random(f"{seed}-watch")
    if watch_rng.random() < 0.3:
        _draw_watch(watch_rng, plan, short)
    # the relay's --data on a small tmpfs
    disk_rng = random.Random(f"{seed}-disk")
    if disk_rng.random() < 0.25:
        _draw_disk(disk_rng, plan, total, short)
    plan.total_bytes = total
    plan.total_files = sum(len(j.files) for j in jobs if j.dup_of is None)
    return plan


def _special_source(r: random.Random) -> Source:
    return Source("", _small_size(r), r.getrandbits(48), _mode(r))


def _draw_specials(r: random.Random, job: Job) -> None:
    """Directory jobs get a directory of entries that are not plain files (links to files and directories inside
    and outside the tree, dangling, back to an ancestor, a FIFO, names that are not UTF-8 or make no key) and files
    with awkward names; a files job gets such paths among its arguments. Sometimes -L, --allow-skipped, and an
    agent without capabilities with a directory it cannot read."""
    if job.kind in ("dir", "mixed", "bigdir"):
        if r.random() >= 0.5:
            return
        tops = sorted({p.split("/")[0] for p, _ in job.files if "/" in p})
        if not tops:
            return
        top = r.choice(tops)
        sp = f"{top}/{_name(r, 'sp')}"
        in_top = [(p, s) for p, s in job.files if p.startswith(top + "/")]
        kinds = ["link-file-in", "link-file-out", "link-dir-in", "link-dir-out", "link-dangling", "link-loop",
                 "fifo", "nonutf8", "badname"]
        chosen = [k for k in kinds if r.random() < 0.45] or [r.choice(kinds)]
        for i, k in enumerate(chosen):
            rel = f"{sp}/{k[:6]}{i}-{_name(r, 'e')}"
            if k == "link-file-in":
                tr, src = r.choice(in_top)
                job.specials.append(Special(k, rel, target_rel=tr, source=src))
            elif k == "link-file-out":
                job.specials.append(Special(k, rel, target_rel=_name(r, "out"), source=_special_source(r)))
            elif k == "link-dir-in":
                plain = f"{top}/{_name(r, 'ld')}"
                for n in range(r.randint(1, 3)):
                    job.files.append((f"{plain}/{n}-{_name(r, 'l')}", _special_source(r)))
                job.specials.append(Special(k, rel, target_rel=plain))
            elif k == "link-dir-out":
                job.specials.append(Special(k, rel, target_rel=_name(r, "outdir"),
                                            files=[(f"{n}-{_name(r, 'o')}", _special_source(r))
                                                   for n in range(r.randint(1, 2))]))
            elif k == "link-dangling":
                job.specials.append(Special(k, rel, target=_name(r, "nowhere")))
            elif k == "link-loop":
                job.specials.append(Special(k, rel, target=r.choice(["..", "."])))
            elif k == "fifo":
                job.specials.append(Special(k, rel))
            elif k == "nonutf8":
                job.specials.append(Special(k, f"{sp}/nu{i}-{r.choice(NON_UTF8)}{r.choice(['', '.jpg'])}",
                                            source=_special_source(r)))
            elif k == "badname":
                job.specials.append(Special(k, f"{sp}/bad{i}{r.choice(BAD_CHARS)}name", source=_special_source(r)))
        for name in r.sample(AWKWARD, r.randint(0, 3)):
            job.files.append((f"{sp}/{name}", _special_source(r)))
        if r.random() < 0.3:
            job.nocaps = True
            job.specials.append(Special("unreadable", f"{top}/{_name(r, 'locked')}",
                                        files=[(f"{n}-{_name(r, 'u')}", _special_source(r))
                                               for n in range(r.randint(1, 2))]))
    elif job.kind == "files":
        if r.random() >= 0.3:
            return
        kinds = ["link-file-in", "link-file-out", "fifo", "missing", "badname", "nonutf8"]
        weights = [3, 2, 2, 2, 2, 1]
        for i in range(r.randint(1, 3)):
            k = r.choices(kinds, weights)[0]
            if k == "link-file-in":
                tr, src = r.choice(job.files)
                sp = Special(k, f"lnarg{i}-{_name(r, 'a')}", target_rel=tr, source=src, arg=True)
            elif k == "link-file-out":
                sp = Special(k, f"lnout{i}-{_name(r, 'a')}", target_rel=_name(r, "out"), source=_special_source(r),
                             arg=True)
            elif k == "fifo":
                sp = Special(k, f"fifo{i}-{_name(r, 'a')}", arg=True)
            elif k == "missing":
                sp = Special(k, f"missing{i}-{_name(r, 'a')}", arg=True)
            elif k == "badname":
                sp = Special(k, f"bad{i}{r.choice(BAD_CHARS)}arg", source=_special_source(r), arg=True)
            else:
                sp = Special(k, f"nu{i}-{r.choice(NON_UTF8)}", source=_special_source(r), arg=True)
            job.specials.append(sp)
            job.inputs.append(sp.rel)
    else:
        return
    if job.specials or r.random() < 0.2:
        job.follow = r.random() < 0.4
        job.allow_skipped = r.random() < 0.25


def _draw_watch(w: random.Random, plan: Plan, short: bool) -> None:
    """A watch job (account carol): files that fit its quota, one or two that never do (they wait while the others
    go up), links, a FIFO, names that are not UTF-8 or make no key; and files and a link made while it runs."""
    idx = len(plan.jobs)
    top = _name(w, f"w{idx}")
    job = Job(idx=idx, account="carol", kind="watch", root=f"j{idx}", concurrency=w.choice([1, 2, 4, 8]))
    if w.random() < 0.3:
        job.prefix = w.choice(["w", "watch/d", "wé"]) + str(idx)
    subdirs = [top, top, f"{top}/{_name(w, 's')}"]
    top_files = []
    for i in range(w.randint(4, 30 if short else 80)):
        place = w.choice(subdirs)
        rel = f"{place}/{i}-{_name(w, 'wf')}"
        src = _special_source(w)
        job.files.append((rel, src))
        if place == top:
            top_files.append((rel, src))
    if not top_files:
        rel = f"{top}/t-{_name(w, 'wf')}"
        top_files.append((rel, _special_source(w)))
        job.files.append(top_files[-1])
    if w.random() < 0.5:
        job.files.append((f"{top}/m-{_name(w, 'mid')}", Source("", w.randint(256 * KiB, 4 * MiB), w.getrandbits(48),
                                                                _mode(w))))
    for name in w.sample(AWKWARD, w.randint(0, 2)):
        job.files.append((f"{top}/{name}", _special_source(w)))
    job.follow = w.random() < 0.4
    follow_bytes = 0
    kinds = ["link-file-in", "link-file-out", "link-dangling", "fifo", "nonutf8", "badname"]
    for i, k in enumerate(k for k in kinds if w.random() < 0.5):
        rel = f"{top}/{k[:6]}{i}-{_name(w, 'e')}"
        if k == "link-file-in":
            tr, src = w.choice(top_files)
            job.specials.append(Special(k, rel, target_rel=tr, source=src))
            follow_bytes += src.size
        elif k == "link-file-out":
            src = _special_source(w)
            job.specials.append(Special(k, rel, target_rel=_name(w, "out"), source=src))
            follow_bytes += src.size
        elif k == "link-dangling":
            job.specials.append(Special(k, rel, target=_name(w, "nowhere")))
        elif k == "fifo":
            job.specials.append(Special(k, rel))
        elif k == "nonutf8":
            job.specials.append(Special(k, f"{top}/nu{i}-{w.choice(NON_UTF8)}", source=_special_source(w)))
        else:
            job.specials.append(Special(k, f"{top}/bad{i}{w.choice(BAD_CHARS)}name", source=_special_source(w)))
    link_target = w.choice(top_files)[0].split("/")[-1]
    follow_bytes += next(s.size for r_, s in top_files if r_.split("/")[-1] == link_target)
    late_fault = (f"late-f-{_name(w, 'lf')}", _special_source(w))
    late_rerun = (f"late-r-{_name(w, 'lr')}", _special_source(w))
    fitting = sum(s.size for _, s in job.files) + late_fault[1].size + late_rerun[1].size
    if job.follow:
        fitting += follow_bytes
    quota = fitting + w.randint(64 * KiB, 512 * KiB)
    waiting = [(f"{top}/big{n}-{_name(w, 'wait')}", Source("", quota + w.randint(64 * KiB, 2 * MiB), w.getrandbits(48),
                                                            _mode(w)))
               for n in range(w.randint(1, 2))]
    job.files += waiting
    job.inputs = [top]
    job.watch = WatchPlan(top=top, waiting_files=waiting, late_fault=late_fault, late_rerun=late_rerun,
                          late_how=w.choice(["move", "write"]), late_link=f"late-link-{_name(w, 'll')}",
                          late_link_target=link_target)
    plan.jobs.append(job)
    plan.accounts.append(Account("carol", quota=quota))
    if w.random() < 0.25:
        plan.events.append(FaultEvent("agent", "kill9", Trigger("time", w.uniform(0.5, plan.phase_seconds * 0.8)),
                                      job=idx))


def _draw_disk(k: random.Random, plan: Plan, total: int, short: bool) -> None:
    """The relay's --data on a tmpfs: "small" (what the round sends does not fit; a file that does not fit is
    refused at OPEN) or "filler" (everything fits, but disk:fill events fill the disk to ENOSPC for a while). The
    send jobs get a short --retry-for: they retry a full relay that long, then the item fails. An agent takes some
    40 ms per item to give up on a full relay, so a short run's "small" rounds have at most 400 files (the clean
    re-run must end within its limit)."""
    min_free = k.choice([None, 1 * MiB, 2 * MiB, 4 * MiB])
    watch = any(j.watch for j in plan.jobs)
    files = sum(len(j.files) for j in plan.jobs)
    if total >= 12 * MiB and k.random() < 0.5 and not watch and (files <= 400 or not short):
        mode = "small"
        size = max(8 * MiB, -(-int(total * k.uniform(0.35, 0.8)) // MiB) * MiB)
        size = max(size, (min_free or 0) + 6 * MiB)
    else:
        mode = "filler"
        size = -(-int(total * 1.5) // MiB) * MiB + 16 * MiB + (min_free or 0)
    plan.disk = Disk(size, min_free, mode)
    n_fills = k.choice([1, 1, 2]) if mode == "filler" else k.choice([0, 0, 1])
    for _ in range(n_fills):   # early: most fault phases are over in a few seconds
        if k.random() < 0.6 or total == 0:
            trig = Trigger("time", k.uniform(0.05, min(3.0, plan.phase_seconds * 0.5)))
        else:
            trig = Trigger("bytes", k.randint(0, max(1, total // 2)))
        plan.events.append(FaultEvent("disk", "fill", trig, hold=k.uniform(0.5, 4.0)))
    for j in plan.jobs:
        if not j.watch:
            j.retry_for = k.choice(["3s", "5s", "8s"])


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
    """Write every job's files under src_dir/<job root>/ (and what its links lead to outside it, under
    src_dir/x-<job root>/) and compute what each job must report: its expected keys, and the paths that must be
    skipped or fail."""
    written: dict[str, Source] = {}
    for job in plan.jobs:
        base = os.path.join(src_dir, job.root)
        os.makedirs(base, exist_ok=True)
        if job.dup_of is not None:
            origin = plan.jobs[job.dup_of]
            job.stdin_source = origin.stdin_source
            job.inputs = list(origin.inputs)
            job.expected = dict(origin.expected)
            job.skips, job.fails = dict(origin.skips), dict(origin.fails)
            job.alts, job.forbidden = list(origin.alts), list(origin.forbidden)
            continue
        for rel, src in job.files:
            full = os.path.join(base, *rel.split("/"))
            src.path = full
            if full not in written:
                os.makedirs(os.path.dirname(full), exist_ok=True)
                src.sha1 = _write_content(full, src)
                written[full] = src
        outside = os.path.join(src_dir, "x-" + job.root)
        _make_specials(job, base, outside)
        exclude = {_full(base, sp.rel) for sp in job.specials if sp.kind in ("nonutf8", "badname", "unreadable")}
        if job.kind == "stdin":
            job.stdin_source = job.files[0][1]
            key = f"{job.prefix}/{job.stdin_name}" if job.prefix else job.stdin_name  # --prefix: "every key"
            job.expected = {key: job.stdin_source}
        elif job.watch is not None:
            _expect_watch(job, base, src_dir, exclude)
        else:
            args = {sp.rel for sp in job.specials if sp.arg}
            plain = [os.path.join(base, t) for t in job.inputs if t not in args]
            job.inputs = [os.path.join(base, t) for t in job.inputs]
            by_path = {s.path: s for _, s in job.files}
            job.expected = {}
            for inp in plain:
                for key, path in layout.keys_for_path(inp, job.prefix, exclude).items():
                    job.expected[key] = by_path[path]
            _expect_specials(job, base)
        for sp in job.specials:
            if sp.kind == "unreadable":
                os.chmod(_full(base, sp.rel), 0)


def _full(base: str, rel: str) -> str:
    return os.path.join(base, *rel.split("/"))


def _write_source(path: str, src: Source) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    src.path = path
    src.sha1 = _write_content(path, src)


def _make_specials(job: Job, base: str, outside: str) -> None:
    for sp in job.specials:
        full = _full(base, sp.rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        k = sp.kind
        if k in ("link-file-in", "link-dir-in"):
            sp.target = os.path.relpath(_full(base, sp.target_rel), os.path.dirname(full))
        elif k == "link-file-out":
            sp.target = os.path.join(outside, sp.target_rel)
            _write_source(sp.target, sp.source)
        elif k == "link-dir-out":
            sp.target = os.path.join(outside, sp.target_rel)
            for name, src in sp.files:
                _write_source(os.path.join(sp.target, name), src)
        if k.startswith("link-"):
            os.symlink(sp.target, full)
        elif k == "fifo":
            os.mkfifo(full)
        elif k in ("nonutf8", "badname"):
            _write_source(full, sp.source)
        elif k == "unreadable":
            for name, src in sp.files:
                _write_source(os.path.join(full, name), src)


def _expect_specials(job: Job, base: str) -> None:
    """What a send must report for each special path (send --help): a link is skipped unless -L, then it is what it
    points to (a directory walked once: through the link or directly, the other path skipped; a link back to a
    directory being walked is skipped); a FIFO, a name that is not UTF-8 and a directory that cannot be read are
    skipped; a name no key may hold and a path that does not exist fail alone."""
    P = layout.printed
    for sp in job.specials:
        full = _full(base, sp.rel)
        key = layout.key_of(full, base, job.prefix)
        k = sp.kind
        if k in ("link-file-in", "link-file-out", "link-dir-out", "link-dir-in") and not job.follow:
            job.skips[P(full)] = k
            job.forbidden.append(key)
        elif k in ("link-file-in", "link-file-out"):
            job.expected[key] = sp.source
        elif k == "link-dir-out":
            for name, src in sp.files:
                job.expected[f"{key}/{name}"] = src
        elif k == "link-dir-in":
            target = _full(base, sp.target_rel)
            dkey = layout.key_of(target, base, job.prefix)
            via_dir = {kk: src for kk, src in job.expected.items() if kk.startswith(dkey + "/")}
            for kk in via_dir:
                del job.expected[kk]
            via_link = {key + kk[len(dkey):]: src for kk, src in via_dir.items()}
            job.alts.append(Alt(P(full), P(target), via_link, via_dir))
        elif k in ("link-dangling", "link-loop", "fifo", "nonutf8", "unreadable"):
            job.skips[P(full)] = k
            if k in ("link-loop", "unreadable"):
                job.forbidden.append(key)
        elif k in ("badname", "missing"):
            job.fails[P(full)] = k


def _expect_watch(job: Job, base: str, src_dir: str, exclude: set[str]) -> None:
    """A watch job: files that fit are expected stored, the larger ones wait; links are skipped (stored as what they
    point to with -L); a FIFO, a name that is not UTF-8 or makes no key, a dangling link are skipped (watch --help;
    watch reports a name no key may hold as skipped too). The late files are written aside now and moved or copied in
    by the runner."""
    w = job.watch
    P = layout.printed
    top = _full(base, w.top)
    job.inputs = [top]
    waiting = {s.path for _, s in w.waiting_files}
    by_path = {s.path: s for _, s in job.files}
    for key, path in layout.keys_for_path(top, job.prefix, exclude).items():
        if path in waiting:
            w.waiting[key] = by_path[path]
        else:
            job.expected[key] = by_path[path]
    for sp in job.specials:
        full = _full(base, sp.rel)
        key = layout.key_of(full, base, job.prefix)
        if sp.kind in ("link-file-in", "link-file-out"):
            if job.follow:
                job.expected[key] = sp.source
            else:
                job.skips[P(full)] = sp.kind
                job.forbidden.append(key)
        else:
            job.skips[P(full)] = sp.kind
    aside = os.path.join(src_dir, "late-" + job.root)
    for which, (name, src) in (("fault", w.late_fault), ("rerun", w.late_rerun)):
        _write_source(os.path.join(aside, name), src)
        key = layout.key_of(os.path.join(top, name), base, job.prefix)
        job.expected[key] = src
        w.late_keys[which] = key
    link_key = layout.key_of(os.path.join(top, w.late_link), base, job.prefix)
    w.late_keys["link"] = link_key
    if job.follow:
        job.expected[link_key] = by_path[os.path.join(top, w.late_link_target)]
    else:
        job.forbidden.append(link_key)
