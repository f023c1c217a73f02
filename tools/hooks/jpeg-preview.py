#!/usr/bin/env python3
"""An example post-commit hook (upload-relay serve --on-commit): a preview of each JPEG, as the photo service's Lambda
made them, written outside the relay's store.

    upload-relay serve ... --on-commit 'tools/hooks/jpeg-preview.py'
    upload-relay serve ... --store s3://BUCKET/PREFIX --on-commit \\
        'PREVIEW_DEST=s3://BUCKET/previews S3_ENDPOINT=http://127.0.0.1:8333 tools/hooks/jpeg-preview.py'

It reads the event the relay gives on stdin (JSON: account, key, size, sha1, location). For a JPEG (by its key, then
by its bytes) it writes a preview at most PREVIEW_SIZE pixels wide and high (default 320) at
`<PREVIEW_DEST>/<account>/<key>.preview.jpg`, PREVIEW_DEST being a directory or s3://BUCKET[/PREFIX]. Unset, it is
for the local store the directory beside the store, `<store>.previews` (the store is `location` less its
`/<account>/<key>`: the relay's default store <data>/store gets <data>/store.previews); for an S3 store there is no
safe default, and the hook asks for PREVIEW_DEST.

Never in the store: every object there is vouched for by the relay's catalog (its size and SHA-1), and a preview
written among them could replace an object an agent uploaded under that name, leaving the catalog describing bytes
that are gone. So a PREVIEW_DEST inside the store is refused: a path inside the store's folder (symbolic links
resolved), or the store's bucket at a prefix inside the relay's (any prefix when the relay has none); and so is any
preview that would land in the store all the same (a PREVIEW_DEST above it).

S3, for reading the object or writing the preview: S3_ENDPOINT and the relay's AWS_ACCESS_KEY_ID /
AWS_SECRET_ACCESS_KEY (AWS_REGION, else AWS_DEFAULT_REGION, else us-east-1), signed by botocore
(tools/cluster/cluster.py, class S3, which percent-encodes keys in full: a key may hold "?", "#", "%", spaces...).
Other files are left alone.

Exit 0: done, or nothing to do (not a JPEG by its key or by its bytes, or the object is gone: retrying would not
help). Exit 1: a failure worth retrying (the store did not answer), or a misconfiguration (PREVIEW_DEST unset for an
S3 store, or inside the store; S3 settings missing); the relay keeps the event and runs the hook again later, so once
the configuration is fixed the events still queued get their previews.
Needs Pillow (pip install Pillow).
"""
import io
import json
import os
import secrets
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SUFFIX = ".preview.jpg"


class Misconfigured(Exception):
    """Exit 1 with this message: nothing written."""


def log(message: str):
    print(f"jpeg-preview: {message}", file=sys.stderr, flush=True)


def preview(data: bytes) -> bytes | None:
    from PIL import Image, UnidentifiedImageError
    size = int(os.environ.get("PREVIEW_SIZE", "320"))
    try:
        image = Image.open(io.BytesIO(data))
        if image.format != "JPEG":
            return None
        image.thumbnail((size, size))
        out = io.BytesIO()
        image.convert("RGB").save(out, "JPEG", quality=80)
        return out.getvalue()
    except (UnidentifiedImageError, OSError):
        return None


def s3_client():
    sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
    from cluster import S3
    endpoint = os.environ.get("S3_ENDPOINT")
    if not endpoint:
        raise Misconfigured("set S3_ENDPOINT (the S3 server's URL) for an s3:// store or PREVIEW_DEST")
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if not key or not secret:
        raise Misconfigured("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for an s3:// store or PREVIEW_DEST")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    return S3(endpoint, key, secret, region)


def split_s3(url: str) -> tuple[str, str]:
    """s3://BUCKET[/PREFIX] as (bucket, prefix), the prefix's segments joined by one "/", none at either end."""
    bucket, _, prefix = url[len("s3://"):].partition("/")
    if not bucket:
        raise Misconfigured(f"{url!r} names no bucket (s3://BUCKET[/PREFIX])")
    return bucket, "/".join(part for part in prefix.split("/") if part)


def within(path: str, root: str) -> bool:
    """`path` is `root` or below it (both resolved paths, or both bucket prefixes; "" and "/" hold everything)."""
    root = root.rstrip("/")
    return not root or path == root or path.startswith(root + "/")


class Place:
    """Where bytes are: a folder (`bucket` None, `root` a path) or a bucket at a prefix (`root`, maybe "")."""

    def __init__(self, bucket: str | None, root: str):
        self.bucket, self.root = bucket, root

    def __str__(self):
        if self.bucket is None:
            return self.root
        return f"s3://{self.bucket}/{self.root}" if self.root else f"s3://{self.bucket}"

    def name(self, path: str) -> str:
        """`path` (what `join` makes) as a person would give it."""
        return path if self.bucket is None else f"s3://{self.bucket}/{path}"

    def join(self, *parts: str) -> str:
        if self.bucket is None:
            return os.path.join(self.root, *parts)
        return "/".join(([self.root] if self.root else []) + list(parts))

    def holds(self, path: str) -> bool:
        """`path` (what `join` makes, for a place of the same kind) lies in this place."""
        if self.bucket is None:
            return within(os.path.realpath(path), os.path.realpath(self.root))
        return within(path, self.root)


def the_store(account: str, key: str, location: str) -> Place:
    """The relay's store: `location` less its trailing /<account>/<key>."""
    tail = f"{account}/{key}"
    if location.startswith("s3://"):
        bucket, _, object_key = location[len("s3://"):].partition("/")
        if not bucket or not (object_key == tail or object_key.endswith("/" + tail)):
            raise Misconfigured(f"the location {location!r} does not end with /{tail}")
        return Place(bucket, object_key[:-len(tail)].rstrip("/"))
    if not location.endswith("/" + tail):
        raise Misconfigured(f"the location {location!r} does not end with /{tail}")
    return Place(None, location[:-len(tail) - 1] or "/")


def the_destination(store: Place) -> Place:
    dest = os.environ.get("PREVIEW_DEST", "").strip()
    if not dest:
        if store.bucket is not None:
            raise Misconfigured(f"the store is {store}: set PREVIEW_DEST to a directory or s3://BUCKET/PREFIX outside "
                                "it for the previews (there is no safe default in the relay's bucket)")
        return Place(None, (store.root.rstrip("/") or "/") + ".previews")
    if dest.lower().startswith("s3://"):
        return Place(*split_s3(dest))
    return Place(None, dest)


def refuse_overlap(store: Place, dest: Place, target: str):
    """Misconfigured when the destination, or this preview in it, lies in the relay's store."""
    if store.bucket != dest.bucket:  # a folder and a bucket, or two buckets
        return
    if store.holds(dest.root):
        raise Misconfigured(f"PREVIEW_DEST {dest} is inside the relay's store {store}: previews there could replace "
                            "objects the relay's catalog describes; give a directory or s3://BUCKET/PREFIX outside it")
    if store.holds(target):
        raise Misconfigured(f"the preview would be {dest.name(target)}, inside the relay's store {store}; give a "
                            "PREVIEW_DEST that does not hold the store")


def main() -> int:
    event = json.load(sys.stdin)
    account, key, location = event["account"], event["key"], event["location"]
    if not key.lower().endswith((".jpg", ".jpeg")):
        return 0
    try:
        store = the_store(account, key, location)
        dest = the_destination(store)
        target = dest.join(account, key + SUFFIX)
        refuse_overlap(store, dest, target)
        s3 = s3_client() if store.bucket is not None or dest.bucket is not None else None
    except Misconfigured as error:
        log(f"{key}: {error}")
        return 1

    if store.bucket is not None:
        try:
            data = s3.get(store.bucket, store.join(account, key))
        except Exception as error:  # noqa: BLE001 - the store did not answer: retry later
            log(f"{key}: {error}")
            return 1
    else:
        try:
            with open(location, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = None
        except OSError as error:
            log(f"{key}: {error}")
            return 1
    if data is None:
        log(f"{key} is gone; no preview")
        return 0
    small = preview(data)
    if small is None:
        log(f"{key} is not a JPEG; no preview")
        return 0

    if dest.bucket is not None:
        try:
            s3.put(dest.bucket, target, small)
        except Exception as error:  # noqa: BLE001 - the destination did not answer: retry later
            log(f"{key}: writing its preview {dest.name(target)}: {error}")
            return 1
        return 0
    try:
        folder = os.path.dirname(target)
        os.makedirs(folder, exist_ok=True)
        temporary = os.path.join(folder, f".{os.path.basename(target)}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(handle, "wb") as f:
                f.write(small)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, target)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError as error:
        log(f"{key}: writing its preview {target}: {error}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
