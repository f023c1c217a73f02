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

    token(relay, "delete", name, "--delete-objects")
    new = token(relay, "add", name).split()[-1]
    fresh = relay.session(token=new)
    photo = uniq(b"the new device's photo")
    r = fresh.upload_honest("photo.jpg", photo, sid=1)
    assert r["type"] == "RESULT", describe(r)

    # Straight away, before any catalog look of the relay's: dedup against the new account's photo is refused...
    stale.open(3, "copy.jpg", photo)
    f = stale._expect_on_stream(3, 5.0)
    assert f["type"] == "ERROR" and f["code"] == "UNAUTHENTICATED", f"dedup by the old token: {describe(f)}"
    # ...and so is the commit of the upload opened before.
    stale.hash(1, len(pending), sha1(pending))
    f = stale._expect_on_stream(1, 10.0)
    assert f["type"] == "ERROR" and f["code"] == "UNAUTHENTICATED", f"commit by the old token: {describe(f)}"
    # The relay's next look closes the connection.
    stale.expect_conn_error("UNAUTHENTICATED", timeout=6.0)
    files = relay.store_files()
    assert f"{name}/photo.jpg" in files and f"{name}/copy.jpg" not in files and f"{name}/planted.jpg" not in files, \
        sorted(k for k in files if k.startswith(name))
    # The new device goes on.
    fresh.roundtrip()
