"""Fixtures: one shared relay for most cases, dedicated relays for cases that need special options.

After every case the relays the case used must still be alive: a fresh connection does a full
honest upload and gets RESULT, and the relay's RSS stays bounded (agentlib.Relay.check_alive).
"""
import os
import sys

sys.dont_write_bytecode = True

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import agentlib  # noqa: E402

# Tests that count the credit a closed stream gives back expect the whole 256K: the relay resizes connection windows to
# its memory budget's share (SPEC 5.5), which stays 256K while --memory-budget (32M) / connections open >= 256K.
SHARED_ARGS = ["--stream-window", "64K", "--connection-window", "256K", "--max-streams", "8", "--sync-bytes", "16K"]
TIMEOUT_ARGS = ["--handshake-timeout", "2s", "--frame-timeout", "2s", "--idle-timeout", "4s"]


class _Shared:
    def __init__(self):
        self.relay = None
        self.dead = []

    def get(self):
        if self.relay is not None and not self.relay.alive():
            # a previous case killed it; that case failed its own alive check. Start a new one.
            self.dead.append(self.relay)
            self.relay = None
        if self.relay is None:
            self.relay = agentlib.Relay.start(SHARED_ARGS)
        return self.relay

    def stop(self):
        for r in self.dead + ([self.relay] if self.relay else []):
            r.stop()


@pytest.fixture(scope="session")
def _shared_mgr():
    m = _Shared()
    try:
        yield m
    finally:
        m.stop()


class _CaseRelays:
    def __init__(self):
        self.check = []   # relays that must be alive and healthy after the case
        self.owned = []   # dedicated relays to stop after the case


@pytest.fixture
def _case():
    """Relays used by the current case: connections closed, alive-checked, dedicated ones stopped."""
    case = _CaseRelays()
    yield case
    errors = []
    try:
        for r in case.check + case.owned:
            r.close_conns()
        for r in case.check:
            try:
                r.check_alive()
            except BaseException as e:  # noqa: BLE001
                errors.append(f"relay not alive/healthy after the case: {e}")
            finally:
                r.close_conns()
    finally:
        for r in case.owned:
            r.stop()
    if errors:
        pytest.fail("; ".join(errors), pytrace=False)


@pytest.fixture
def relay(_shared_mgr, _case):
    r = _shared_mgr.get()
    _case.check.append(r)
    return r


@pytest.fixture
def make_relay(_case):
    """Start a dedicated relay: make_relay(args, check_alive=True, prefix=()). Stopped and removed after the case."""

    def make(args=(), check_alive=True, prefix=()):
        r = agentlib.Relay.start(list(args), prefix=prefix)
        _case.owned.append(r)
        if check_alive:
            _case.check.append(r)
        return r

    return make


@pytest.fixture(scope="module")
def timeout_relay():
    binary = agentlib.relay_bin()
    help_text = agentlib.serve_help(binary)
    missing = [o for o in ("--handshake-timeout", "--frame-timeout", "--idle-timeout") if o not in help_text]
    if missing:
        yield ("missing", missing)
        return
    r = agentlib.Relay.start(SHARED_ARGS + TIMEOUT_ARGS)
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture
def trelay(timeout_relay, _case):
    if isinstance(timeout_relay, tuple):
        pytest.fail(f"relay binary {agentlib.relay_bin()} does not support {', '.join(timeout_relay[1])} "
                    f"(target: serve gains --idle-timeout/--frame-timeout/--handshake-timeout)", pytrace=False)
    _case.check.append(timeout_relay)
    return timeout_relay
