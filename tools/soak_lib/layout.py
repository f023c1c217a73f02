"""Where things are, as the soak understands them from the README and --help (not from the code).

The ONE place that knows where an account's object lives in the relay's store.
"""
from __future__ import annotations

import os
import stat

STORE_SUBDIR = "store"          # `--data DIR` keeps objects in DIR/store unless --store says otherwise
DEV_SUBDIR = "dev"              # `serve --dev` writes DIR/dev/ca.pem and DIR/dev/token
DEV_ACCOUNT = "dev"             # the account `serve --dev` makes


def store_root(data_dir: str) -> str:
    return os.path.join(data_dir, STORE_SUBDIR)


def object_path(store: str, account: str, key: str) -> str:
    """The object of `account` for `key`: <store>/<account>/<key> (keys use "/" between segments)."""
    return os.path.join(store, account, *key.split("/"))


def object_of_path(store: str, path: str) -> tuple[str, str] | None:
    """Inverse of object_path: (account, key) for a file under the store, None if it cannot be one."""
    rel = os.path.relpath(path, store)
    parts = rel.split(os.sep)
    if len(parts) < 2 or parts[0] in ("", ".", ".."):
        return None
    return parts[0], "/".join(parts[1:])


def account_dir(store: str, account: str) -> str:
    return os.path.join(store, account)


def dev_ca(data_dir: str) -> str:
    return os.path.join(data_dir, DEV_SUBDIR, "ca.pem")


def dev_token_file(data_dir: str) -> str:
    return os.path.join(data_dir, DEV_SUBDIR, "token")


def keys_for_path(path: str, prefix: str | None, exclude=frozenset()) -> dict[str, str]:
    """Keys `upload-agent send` should use for PATH (from `send --help`): a file is stored under its
    base name, a directory is walked recursively and keys are paths relative to the directory's
    parent. Returns {key: file path}. --prefix P puts every key under P/. Only regular files count
    ("Only files are uploaded"): a symbolic link, a FIFO and what a link to a directory leads to are
    not walked (the soak models what -L adds apart); paths in `exclude` (and what is under them) are
    left out, as the soak expects another result for them (a name that is not UTF-8 or makes no key,
    a directory the agent cannot read)."""
    path = os.path.normpath(path)
    out: dict[str, str] = {}
    if os.path.isdir(path):
        parent = os.path.dirname(path)
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if os.path.join(root, d) not in exclude
                             and not os.path.islink(os.path.join(root, d)))
            for f in sorted(files):
                full = os.path.join(root, f)
                if full in exclude or not stat.S_ISREG(os.lstat(full).st_mode):
                    continue
                out[key_of(full, parent, None)] = full
    else:
        out[os.path.basename(path)] = path
    if prefix:
        out = {f"{prefix}/{k}": v for k, v in out.items()}
    return out


def key_of(full: str, parent: str, prefix: str | None) -> str:
    """The key of the file at `full` found by walking a directory whose parent is `parent`."""
    key = "/".join(os.path.relpath(full, parent).split(os.sep))
    return f"{prefix}/{key}" if prefix else key


def printed(path: str) -> str:
    """A path as the agent prints it in --json: UTF-8, each byte that is not UTF-8 as U+FFFD (Python holds such
    bytes as surrogate escapes)."""
    return os.path.normpath(path).encode("utf-8", "surrogateescape").decode("utf-8", "replace")
