#!/usr/bin/env python3
"""Kill a relay (SIGKILL) once its catalog records an upload session with at least BYTES durable: the kill lands
after a part is acknowledged and before the upload ends, whatever the test process that started it is doing.

    tools/s3/kill-after-part.py --pid PID --bytes N (--sqlite PATH | --postgres URL) [--timeout SECONDS]

Exit 0 once it killed the process, 1 when the time ran out (the process is left alone), 2 on a usage error.
Used by the S3 end-to-end tests; polls every 20 ms.
"""
import argparse
import os
import signal
import sqlite3
import subprocess
import sys
import time


def durable_sqlite(path):
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1) as db:
            row = db.execute("SELECT COALESCE(MAX(durable_offset), 0) FROM session").fetchone()
            return row[0] if row else 0
    except sqlite3.Error:
        return 0


def durable_postgres(url):
    run = subprocess.run(["psql", url, "-tAc", "SELECT COALESCE(MAX(durable_offset), 0) FROM session"],
                         capture_output=True, text=True, timeout=10)
    try:
        return int(run.stdout.strip() or 0)
    except ValueError:
        return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--bytes", type=int, required=True)
    p.add_argument("--sqlite")
    p.add_argument("--postgres")
    p.add_argument("--timeout", type=float, default=60)
    a = p.parse_args()
    if (a.sqlite is None) == (a.postgres is None):
        p.error("give one of --sqlite and --postgres")
    deadline = time.monotonic() + a.timeout
    while time.monotonic() < deadline:
        durable = durable_sqlite(a.sqlite) if a.sqlite else durable_postgres(a.postgres)
        if durable >= a.bytes:
            os.kill(a.pid, signal.SIGKILL)
            print(f"killed {a.pid} at {durable} durable bytes", file=sys.stderr)
            return 0
        time.sleep(0.02)
    print(f"no session reached {a.bytes} durable bytes in {a.timeout}s", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
