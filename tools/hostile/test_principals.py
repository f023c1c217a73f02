"""A connection acts for the principal it authenticated as (SPEC §2.3, issue 40 finding 1): after `token delete` and
`token add` of the same name, a connection made with the old token can neither dedup against, write nor read anything
of the new account, at whatever phase of the relay's catalog look it tries (before the look closes it)."""
import os
import subprocess

from agentlib import sha1, uniq, describe


def token(relay, *args):
    p = subprocess.run([relay.binary, "token", *args, "--data", relay.data], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, f"token {' '.join(args)}: {p.stderr}"
    return p.stdout.strip()


def token_said(relay, *args):
    """What `token ...` says on stderr (its words for people), once it returned 0."""
    p = subprocess.run([relay.binary, "token", *args, "--data", relay.data], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"token {' '.join(args)}: {p.stderr}"
    return p.stderr


def test_deleted_account_given_again_is_another_principal(relay):
    name = f"dv{os.urandom(3).hex()}"
    old = relay.add_account(name)
    stale = relay.session(token=old)
    stale.roundtrip()
    # An upload opened before the delete, its HASH sent after the name is given again.
    pending = uniq(b"planted by the old device")
    stale.open(1, "planted.jpg", pending)
    assert stale.expect_offset(1)["disposition"] == "START"
    stale.send_data(1, pending)

    # `token delete` returns once the relay has closed the connections of the account: the old one is closed by then,
    # before the name can be given again, and its upload with it.
    said = token_said(relay, "delete", name, "--delete-objects")
    assert "the running relay has closed its connections" in said, said
    stale.expect_conn_error("UNAUTHENTICATED", timeout=1.0)
    new = token(relay, "add", name).split()[-1]
    fresh = relay.session(token=new)
    photo = uniq(b"the new device's photo")
    r = fresh.upload_honest("photo.jpg", photo, sid=1)
    assert r["type"] == "RESULT", describe(r)
    files = relay.store_files()
    assert f"{name}/photo.jpg" in files and f"{name}/planted.jpg" not in files, sorted(k for k in files if k.startswith(name))
    fresh.roundtrip()


def test_rotate_returns_once_old_connections_are_closed(relay):
    name = f"rt{os.urandom(3).hex()}"
    old = relay.add_account(name)
    stale = relay.session(token=old)
    stale.roundtrip()
    said = token_said(relay, "rotate", name)
    assert "the running relay has closed its connections" in said, said
    stale.expect_conn_error("UNAUTHENTICATED", timeout=1.0)
