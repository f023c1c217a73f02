#!/usr/bin/env python3
"""An example post-commit hook (upload-relay serve --on-commit): a preview of each JPEG next to it, as the photo
service's Lambda made them.

    upload-relay serve ... --on-commit 'tools/hooks/jpeg-preview.py'
    upload-relay serve ... --store s3://BUCKET/PREFIX --on-commit 'S3_ENDPOINT=http://127.0.0.1:8333 tools/hooks/jpeg-preview.py'

It reads the event the relay gives on stdin (JSON: account, key, size, sha1, location). For a JPEG (by its key, then
by its bytes) it writes a preview at most PREVIEW_SIZE pixels wide and high (default 320) next to the object:
`<location>.preview.jpg` for the local store; `<key>.preview.jpg` in the same bucket for S3 (S3_ENDPOINT and the
relay's AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, signed by botocore). Other files are left alone.

Exit 0: done (or nothing to do, as for bytes that are not a JPEG after all: retrying would not help). Exit 1: a
failure worth retrying (the store did not answer); the relay keeps the event and runs the hook again later.
Needs Pillow (pip install Pillow).
"""
import io
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


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


def main() -> int:
    event = json.load(sys.stdin)
    key, location = event["key"], event["location"]
    if not key.lower().endswith((".jpg", ".jpeg")) or key.lower().endswith(".preview.jpg"):
        return 0
    if location.startswith("s3://"):
        sys.path.insert(0, os.path.join(HERE, "..", "cluster"))
        from cluster import S3
        endpoint = os.environ.get("S3_ENDPOINT")
        if not endpoint:
            print("jpeg-preview: set S3_ENDPOINT for an s3:// store", file=sys.stderr)
            return 1
        bucket, _, object_key = location[len("s3://"):].partition("/")
        s3 = S3(endpoint, os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"],
                os.environ.get("AWS_REGION", "us-east-1"))
        try:
            data = s3.get(bucket, object_key)
        except Exception as error:  # noqa: BLE001 - the store did not answer: retry later
            print(f"jpeg-preview: {key}: {error}", file=sys.stderr)
            return 1
        if data is None:
            return 0
        small = preview(data)
        if small is None:
            print(f"jpeg-preview: {key} is not a JPEG; no preview", file=sys.stderr)
            return 0
        status, body = s3.call("PUT", f"/{bucket}/{object_key}.preview.jpg", small)
        if status != 200:
            print(f"jpeg-preview: {key}: PUT of its preview answered HTTP {status}", file=sys.stderr)
            return 1
        return 0
    with open(location, "rb") as f:
        small = preview(f.read())
    if small is None:
        print(f"jpeg-preview: {key} is not a JPEG; no preview", file=sys.stderr)
        return 0
    temporary = location + ".preview.jpg.tmp"
    with open(temporary, "wb") as f:
        f.write(small)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, location + ".preview.jpg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
