"""The example post-commit hook tools/hooks/jpeg-preview.py, the S3 helper it uses (tools/cluster/cluster.py, class
S3) and tools/s3/seaweedfs.sh keeping its files under its DIR:

    python3 -m pytest -q -p no:cacheprovider tools/hooks

The S3 tests use the server at UPLOAD_S3_ENDPOINT (with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) when it is set, as
tools/test sets it, else a SeaweedFS of their own (tools/s3/seaweedfs.sh start, stopped at the end); either way in
buckets of their own with random names, removed after. Every folder they make is removed, on failure too.
Needs Pillow and botocore.
"""
import hashlib
import io
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from urllib.parse import parse_qs, urlsplit

sys.dont_write_bytecode = True

import pytest  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
HOOK = os.path.join(HERE, "jpeg-preview.py")
SEAWEEDFS = os.path.join(REPO, "tools", "s3", "seaweedfs.sh")
sys.path.insert(0, os.path.join(REPO, "tools", "cluster"))
from cluster import S3, exports  # noqa: E402

# Keys S3 requests get wrong when not encoded in full: each must name its own object.
AWKWARD_KEYS = [
    "plain.jpg",
    "with space.jpg",
    "pic?a.jpg",
    "pic",
    "hash#tag.jpg",
    "per%cent.jpg",
    "per%25cent.jpg",
    "plus+sign.jpg",
    "plus sign.jpg",
    "amp&eq=semi;comma,.jpg",
    "quote'dq\"paren(x)!*@$.jpg",
    "tilde~dash-under_dot..jpg",
    "ünïcödé/日本語.jpg",
    "emoji 📷 photo.jpg",
    "dir/sub dir/a?b#c%d+e f.jpg",
    "dir/sub dir/a",
]


def jpeg(width: int, height: int, colour=(200, 40, 40)) -> bytes:
    from PIL import Image
    out = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(out, "JPEG")
    return out.getvalue()


def image_of(data: bytes) -> tuple[str, int, int]:
    from PIL import Image
    image = Image.open(io.BytesIO(data))
    return image.format, image.width, image.height


def event(account: str, key: str, location: str) -> dict:
    return {"event": "commit", "id": 1, "account": account, "key": key, "size": 0, "sha1": "0" * 40,
            "location": location, "committed_at": "2026-01-01T00:00:00Z", "attempt": 1}


def run_hook(payload: dict, **environment: str) -> subprocess.CompletedProcess:
    """The hook as the relay runs it: the event on stdin; only the settings given here (of those it reads)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREVIEW_DEST", "PREVIEW_SIZE", "S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    env.update(environment)
    return subprocess.run([sys.executable, HOOK], input=json.dumps(payload), env=env, capture_output=True, text=True,
                          timeout=120)


def snapshot(root: str) -> dict[str, str]:
    """Every folder and file under `root`, each file with its bytes' SHA-256."""
    found = {}
    for folder, folders, files in os.walk(root):
        for name in folders:
            found[os.path.relpath(os.path.join(folder, name), root) + "/"] = ""
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return found


@pytest.fixture
def workdir(request) -> str:
    folder = tempfile.mkdtemp(prefix="jpeg-preview-test-")
    request.addfinalizer(lambda: shutil.rmtree(folder, ignore_errors=True))
    return folder


@pytest.fixture
def relay_data(workdir) -> dict:
    """A relay's data folder with the default store (<data>/store) holding a 1600x1200 JPEG, an object named like
    its preview (an agent's own upload), and a .jpg that is no JPEG."""
    store = os.path.join(workdir, "data", "store")
    os.makedirs(os.path.join(store, "dev", "DCIM"))
    files = {"DCIM/IMG_0001.jpg": jpeg(1600, 1200), "DCIM/IMG_0001.jpg.preview.jpg": b"an agent's own file",
             "DCIM/IMG_0002.jpg": os.urandom(5000)}
    for key, data in files.items():
        with open(os.path.join(store, "dev", key), "wb") as f:
            f.write(data)
    return {"work": workdir, "store": store, "previews": store + ".previews", "files": files}


# ------------------------------------------------------------------ the local store

def test_local_store_preview_lands_beside_the_store(relay_data):
    store, previews = relay_data["store"], relay_data["previews"]
    before = snapshot(store)
    location = os.path.join(store, "dev", "DCIM", "IMG_0001.jpg")
    for _ in range(2):  # delivery is at least once: a second run is harmless
        done = run_hook(event("dev", "DCIM/IMG_0001.jpg", location))
        assert done.returncode == 0, done.stderr
        with open(os.path.join(previews, "dev", "DCIM", "IMG_0001.jpg.preview.jpg"), "rb") as f:
            assert image_of(f.read()) == ("JPEG", 320, 240)
    assert snapshot(store) == before, "the hook changed the relay's store"
    # A .jpg that is no JPEG: nothing to do, nothing written.
    other = run_hook(event("dev", "DCIM/IMG_0002.jpg", os.path.join(store, "dev", "DCIM", "IMG_0002.jpg")))
    assert other.returncode == 0, other.stderr
    assert sorted(snapshot(previews)) == ["dev/", "dev/DCIM/", "dev/DCIM/IMG_0001.jpg.preview.jpg"]
    assert snapshot(store) == before


def test_local_store_preview_dest_elsewhere(relay_data):
    dest = os.path.join(relay_data["work"], "elsewhere")
    before = snapshot(relay_data["store"])
    location = os.path.join(relay_data["store"], "dev", "DCIM", "IMG_0001.jpg")
    done = run_hook(event("dev", "DCIM/IMG_0001.jpg", location), PREVIEW_DEST=dest, PREVIEW_SIZE="100")
    assert done.returncode == 0, done.stderr
    with open(os.path.join(dest, "dev", "DCIM", "IMG_0001.jpg.preview.jpg"), "rb") as f:
        assert image_of(f.read()) == ("JPEG", 100, 75)
    assert snapshot(relay_data["store"]) == before
    assert not os.path.exists(relay_data["previews"])


@pytest.mark.parametrize("dest", ["store", "store/", "store/dev", "store/dev/DCIM", "store/new/folder", "link-to-store",
                                  "link-to-store/previews", "data/store/../store/x"])
def test_local_preview_dest_inside_the_store_is_refused(relay_data, dest):
    work, store = relay_data["work"], relay_data["store"]
    os.symlink(store, os.path.join(work, "link-to-store"))
    path = os.path.join(work, dest) if dest.startswith(("link", "data")) else os.path.join(work, "data", dest)
    before = snapshot(store)
    refused = run_hook(event("dev", "DCIM/IMG_0001.jpg", os.path.join(store, "dev", "DCIM", "IMG_0001.jpg")),
                       PREVIEW_DEST=path)
    assert refused.returncode == 1, refused.stderr
    assert "inside the relay's store" in refused.stderr and "PREVIEW_DEST" in refused.stderr, refused.stderr
    assert snapshot(store) == before, "a refused run changed the store"
    assert not os.path.exists(relay_data["previews"])


def test_local_preview_that_would_land_in_the_store_is_refused(relay_data):
    """A PREVIEW_DEST above the store puts the previews of an account named like the store's folder inside it."""
    store = relay_data["store"]
    os.makedirs(os.path.join(store, "store"))
    with open(os.path.join(store, "store", "x.jpg"), "wb") as f:
        f.write(jpeg(400, 400))
    before = snapshot(store)
    refused = run_hook(event("store", "x.jpg", os.path.join(store, "store", "x.jpg")),
                       PREVIEW_DEST=os.path.dirname(store))
    assert refused.returncode == 1 and "inside the relay's store" in refused.stderr, refused.stderr
    assert snapshot(store) == before


# ------------------------------------------------------------------ the S3 store, without a server

@pytest.mark.parametrize("location,dest,says", [
    ("s3://photos/relay/acct/a.jpg", None, "set PREVIEW_DEST"),
    ("s3://photos/relay/acct/a.jpg", "s3://photos/relay", "inside the relay's store"),
    ("s3://photos/relay/acct/a.jpg", "s3://photos/relay/previews", "inside the relay's store"),
    ("s3://photos/relay/acct/a.jpg", "s3://photos//relay//previews/", "inside the relay's store"),
    ("s3://photos/acct/a.jpg", "s3://photos/previews", "inside the relay's store"),  # no prefix: the whole bucket
    ("s3://photos/top/relay/relay/x/a.jpg", "s3://photos/top", "inside the relay's store"),  # account "relay"
])
def test_s3_store_refusals(location, dest, says):
    account, key = ("relay", "x/a.jpg") if "/relay/relay/" in location else ("acct", "a.jpg")
    settings = {"PREVIEW_DEST": dest} if dest else {}
    # No S3_ENDPOINT: a refusal comes before any request.
    refused = run_hook(event(account, key, location), **settings)
    assert refused.returncode == 1, refused.stderr
    assert says in refused.stderr, refused.stderr


# ------------------------------------------------------------------ a real S3 server

@pytest.fixture(scope="session")
def s3_server(request) -> dict:
    """UPLOAD_S3_ENDPOINT's server when it is set; else a SeaweedFS of our own, stopped and removed at the end."""
    if os.environ.get("UPLOAD_S3_ENDPOINT"):
        return {"UPLOAD_S3_ENDPOINT": os.environ["UPLOAD_S3_ENDPOINT"],
                "AWS_ACCESS_KEY_ID": os.environ["AWS_ACCESS_KEY_ID"],
                "AWS_SECRET_ACCESS_KEY": os.environ["AWS_SECRET_ACCESS_KEY"],
                "UPLOAD_S3_REGION": os.environ.get("UPLOAD_S3_REGION", "us-east-1")}
    folder = tempfile.mkdtemp(prefix="jpeg-preview-s3-")
    request.addfinalizer(lambda: shutil.rmtree(folder, ignore_errors=True))
    request.addfinalizer(lambda: subprocess.run([SEAWEEDFS, "stop", folder], capture_output=True, timeout=120))
    started = subprocess.run([SEAWEEDFS, "start", folder], capture_output=True, text=True, timeout=600)
    assert started.returncode == 0, f"SeaweedFS did not start: {started.stderr[-2000:]}"
    return exports(started.stdout)


@pytest.fixture
def s3(s3_server) -> S3:
    return S3(s3_server["UPLOAD_S3_ENDPOINT"], s3_server["AWS_ACCESS_KEY_ID"], s3_server["AWS_SECRET_ACCESS_KEY"],
              s3_server.get("UPLOAD_S3_REGION", "us-east-1"))


def botocore_client(endpoint: str, key: str, secret: str, region: str = "us-east-1"):
    """botocore's own S3 client: the tests make and check objects with it, not with the class they test."""
    import botocore.session
    from botocore.config import Config
    return botocore.session.get_session().create_client(
        "s3", endpoint_url=endpoint, region_name=region, aws_access_key_id=key, aws_secret_access_key=secret,
        config=Config(s3={"addressing_style": "path"}))


@pytest.fixture
def boto(s3_server):
    return botocore_client(s3_server["UPLOAD_S3_ENDPOINT"], s3_server["AWS_ACCESS_KEY_ID"],
                           s3_server["AWS_SECRET_ACCESS_KEY"], s3_server.get("UPLOAD_S3_REGION", "us-east-1"))


def keys_in(boto, bucket: str, prefix: str = "") -> list[str]:
    keys = []
    for page in boto.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [item["Key"] for item in page.get("Contents", [])]
    return sorted(keys)


def read(boto, bucket: str, key: str) -> bytes | None:
    try:
        return boto.get_object(Bucket=bucket, Key=key)["Body"].read()
    except boto.exceptions.NoSuchKey:
        return None


@pytest.fixture
def bucket(request, boto) -> str:
    """A bucket of this test's own, emptied and removed after it."""
    name = "jpeg-preview-test-" + secrets.token_hex(6)
    boto.create_bucket(Bucket=name)

    def remove():
        for key in keys_in(boto, name):
            boto.delete_object(Bucket=name, Key=key)
        boto.delete_bucket(Bucket=name)
    request.addfinalizer(remove)
    return name


def test_hook_with_s3_store_key_holding_question_mark(s3_server, boto, bucket):
    """The key "pic?a.jpg" once made the hook read and then overwrite the object "pic"."""
    pic = jpeg(800, 600, (20, 20, 200))
    photo = jpeg(1600, 1200)
    boto.put_object(Bucket=bucket, Key="relay/acct/pic", Body=pic)
    boto.put_object(Bucket=bucket, Key="relay/acct/pic?a.jpg", Body=photo)
    done = run_hook(event("acct", "pic?a.jpg", f"s3://{bucket}/relay/acct/pic?a.jpg"),
                    PREVIEW_DEST=f"s3://{bucket}/previews", S3_ENDPOINT=s3_server["UPLOAD_S3_ENDPOINT"],
                    AWS_ACCESS_KEY_ID=s3_server["AWS_ACCESS_KEY_ID"],
                    AWS_SECRET_ACCESS_KEY=s3_server["AWS_SECRET_ACCESS_KEY"])
    assert done.returncode == 0, done.stderr
    assert read(boto, bucket, "relay/acct/pic") == pic, "the object pic changed"
    assert read(boto, bucket, "relay/acct/pic?a.jpg") == photo, "the object pic?a.jpg changed"
    small = read(boto, bucket, "previews/acct/pic?a.jpg.preview.jpg")
    assert small is not None, f"no preview; the bucket holds {keys_in(boto, bucket)}"
    assert image_of(small) == ("JPEG", 320, 240)
    assert keys_in(boto, bucket) == ["previews/acct/pic?a.jpg.preview.jpg", "relay/acct/pic", "relay/acct/pic?a.jpg"]


def test_hook_with_s3_store_refuses_dest_in_the_relays_prefix(s3_server, boto, bucket):
    boto.put_object(Bucket=bucket, Key="relay/acct/a.jpg", Body=jpeg(640, 480))
    refused = run_hook(event("acct", "a.jpg", f"s3://{bucket}/relay/acct/a.jpg"),
                       PREVIEW_DEST=f"s3://{bucket}/relay/previews", S3_ENDPOINT=s3_server["UPLOAD_S3_ENDPOINT"],
                       AWS_ACCESS_KEY_ID=s3_server["AWS_ACCESS_KEY_ID"],
                       AWS_SECRET_ACCESS_KEY=s3_server["AWS_SECRET_ACCESS_KEY"])
    assert refused.returncode == 1 and "inside the relay's store" in refused.stderr, refused.stderr
    assert keys_in(boto, bucket) == ["relay/acct/a.jpg"]


def test_s3_class_get_names_the_object(s3, boto, bucket):
    """GET of each awkward key answers that object's bytes (botocore put them), "pic?a.jpg" not those of "pic"."""
    stored = {key: f"{index}:{key}".encode() * (index + 1) for index, key in enumerate(AWKWARD_KEYS)}
    for key, data in stored.items():
        boto.put_object(Bucket=bucket, Key="t/" + key, Body=data)
    for key, data in stored.items():
        assert s3.get(bucket, "t/" + key) == data, key
    assert s3.get(bucket, "t/no such?key") is None


def test_s3_class_put_head_list_delete(s3, boto, bucket):
    """PUT, HEAD, DELETE and listing each name the object they were given, whatever its key holds, as botocore's own
    client sees them."""
    stored = {key: f"{index}:{key}".encode() * (index + 1) for index, key in enumerate(AWKWARD_KEYS)}
    for key, data in stored.items():
        s3.put(bucket, "t/" + key, data)
    assert keys_in(boto, bucket) == sorted("t/" + key for key in stored)
    for key, data in stored.items():
        assert read(boto, bucket, "t/" + key) == data, key
        assert s3.head(bucket, "t/" + key) == len(data), key
    assert sorted(s3.list_keys(bucket)) == sorted("t/" + key for key in stored)
    assert sorted(s3.list_keys(bucket, "t/dir/sub dir/a")) == ["t/dir/sub dir/a", "t/dir/sub dir/a?b#c%d+e f.jpg"]
    assert s3.list_keys(bucket, "t/per%") == ["t/per%25cent.jpg", "t/per%cent.jpg"]
    for key in AWKWARD_KEYS[::2]:
        s3.delete(bucket, "t/" + key)
        assert s3.get(bucket, "t/" + key) is None and s3.head(bucket, "t/" + key) is None, key
    assert keys_in(boto, bucket) == sorted("t/" + key for key in AWKWARD_KEYS[1::2])
    assert s3.open_uploads(bucket) == 0


def test_s3_class_requests_are_botocores(monkeypatch):
    """The path (and so the canonical URI SigV4 signs) and the query of each request the class sends are those
    botocore's own S3 client sends for the same call (no server: both are caught before they leave)."""
    import cluster
    import urllib.error
    s3 = S3("http://127.0.0.1:9", "key", "secret")
    client = botocore_client(s3.endpoint, "key", "secret")
    theirs, ours = [], []

    class Sent(Exception):
        pass

    def botocore_sends(request, **_):
        theirs.append(request.url)
        raise Sent()

    def class_sends(request, timeout=None):
        ours.append(request.full_url)
        raise urllib.error.HTTPError(request.full_url, 404, "caught", {}, io.BytesIO(b""))

    client.meta.events.register("before-send.s3", botocore_sends)
    monkeypatch.setattr(cluster.urllib.request, "urlopen", class_sends)

    def same(call, **arguments):
        with pytest.raises(Sent):
            getattr(client, call)(Bucket="b", **arguments)
        assert urlsplit(ours[-1]).path == urlsplit(theirs[-1]).path, (call, arguments)
        mine, botocores = (parse_qs(urlsplit(url).query, keep_blank_values=True) for url in (ours[-1], theirs[-1]))
        botocores.pop("encoding-type", None)  # botocore asks for url-encoded keys in listings, and decodes them
        assert mine == botocores, (call, arguments)

    for key in AWKWARD_KEYS:
        s3.get("b", key)
        same("get_object", Key=key)
    for key in AWKWARD_KEYS:
        for method, call, arguments in ((s3.head, "head_object", {}), (s3.delete, "delete_object", {}),
                                        (lambda b, k: s3.put(b, k, b"x"), "put_object", {"Body": b"x"})):
            try:
                method("b", key)
            except cluster.Failed:
                pass
            same(call, Key=key, **arguments)
        try:
            s3.list_keys("b", key)
        except cluster.Failed:
            pass
        same("list_objects_v2", Prefix=key)


# ------------------------------------------------------------------ tools/s3/seaweedfs.sh

def test_seaweedfs_keeps_its_files_under_dir(workdir):
    """Started with TMPDIR a fresh folder: while it runs and after it stops, nothing of it outside DIR (its logs,
    its sockets), in TMPDIR or in /tmp."""
    tmpdir, folder = os.path.join(workdir, "tmpdir"), os.path.join(workdir, "s3")
    os.makedirs(tmpdir)
    environment = dict(os.environ, TMPDIR=tmpdir)
    before = set(os.listdir("/tmp"))
    started = subprocess.run([SEAWEEDFS, "start", folder], env=environment, capture_output=True, text=True, timeout=600)
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        found = exports(started.stdout)
        with open(os.path.join(folder, "weed.pid")) as f:
            pid = int(f.read())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            ports = {word.split(b"=")[1].decode() for word in f.read().split(b"\0")
                     if b"=" in word and b"port" in word.split(b"=")[0].lower()}
        try:
            private_tmp = os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
        except OSError:
            private_tmp = False

        def ours() -> list[str]:
            """This server's files new in /tmp: sockets named by its ports, logs named by its PID."""
            names = []
            for name in sorted(set(os.listdir("/tmp")) - before):
                path = os.path.join("/tmp", name)
                if name.startswith("seaweedfs-") and any(name.endswith(f"-{port}.sock") for port in ports):
                    names.append(name)
                elif name.startswith("weed."):  # a log, or a link to the newest log
                    if (os.readlink(path) if os.path.islink(path) else name).endswith(f".{pid}"):
                        names.append(name)
            return names

        boto = botocore_client(found["UPLOAD_S3_ENDPOINT"], found["AWS_ACCESS_KEY_ID"], found["AWS_SECRET_ACCESS_KEY"])
        boto.create_bucket(Bucket="scratch")
        boto.put_object(Bucket="scratch", Key="a b?c.txt", Body=b"hello")
        assert read(boto, "scratch", "a b?c.txt") == b"hello"
        during, during_tmpdir = ours(), sorted(os.listdir(tmpdir))
        logs = [name for name in os.listdir(os.path.join(folder, "log")) if name.endswith(f".{pid}")] \
            if os.path.isdir(os.path.join(folder, "log")) else []
    finally:
        subprocess.run([SEAWEEDFS, "stop", folder], env=environment, capture_output=True, timeout=120)
    after, after_tmpdir = ours(), sorted(os.listdir(tmpdir))
    assert (after, after_tmpdir) == ([], []), f"left after stop: in /tmp {after}, in TMPDIR {after_tmpdir}"
    # While it runs: weed mini's gRPC sockets are the one thing its flags cannot move out of /tmp; the script gives
    # it a /tmp of its own (DIR/tmp) where it may, else stop removes them.
    allowed = [] if private_tmp else [name for name in during if "-grpc-" in name]
    assert (during, during_tmpdir) == (allowed, []), f"while it ran: in /tmp {during}, in TMPDIR {during_tmpdir}"
    assert logs, "no log of it in DIR/log"
