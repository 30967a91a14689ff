"""The creator labels and the rule that a creator is provably gone (sandbox/owner.py)."""

import subprocess
import sys

import msgspec

from sandbox.owner import LABEL_HOST, LABEL_OWNER, Owner, creator_gone, current_owner, parse_owner, process_start
from tests.support.waiting import until_sync


def _labels(owner: Owner) -> dict[str, str]:
    return owner.labels()


def test_labels_round_trip() -> None:
    me = current_owner()
    labels = me.labels()
    assert set(labels) == {LABEL_HOST, LABEL_OWNER}
    assert parse_owner(labels[LABEL_HOST], labels[LABEL_OWNER]) == me
    assert me.boot and me.pidns and me.start  # Linux: all readable


def test_this_process_is_not_gone() -> None:
    assert not creator_gone(_labels(current_owner()))


def test_a_live_process_is_not_gone_and_an_exited_one_is() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # a live process (killed below)
    try:
        start = process_start(child.pid)
        assert start is not None
        other = msgspec.structs.replace(current_owner(), pid=child.pid, start=start)
        assert not creator_gone(_labels(other))
    finally:
        child.kill()
    # Killed but not waited for: a zombie (once the signal lands), which runs nothing.
    until_sync(lambda: process_start(child.pid) is None, timeout=10, what="the killed child to become a zombie")
    assert creator_gone(_labels(other))
    child.wait()
    assert creator_gone(_labels(other))


def test_a_reused_pid_is_gone() -> None:
    me = current_owner()
    assert creator_gone(_labels(msgspec.structs.replace(me, start=str(int(me.start) + 1))))


def test_another_boot_of_this_host_is_gone() -> None:
    assert creator_gone(_labels(msgspec.structs.replace(current_owner(), boot="0" * 32)))


def test_what_cannot_be_proven_is_never_gone() -> None:
    me = current_owner()
    # Another host (even one that rebooted), another pid namespace, a missing or malformed label.
    assert not creator_gone(_labels(msgspec.structs.replace(me, host=me.host + "-other", boot="0" * 32)))
    assert not creator_gone(_labels(msgspec.structs.replace(me, pidns="1", pid=999_999_999)))
    assert not creator_gone({})
    assert not creator_gone({LABEL_HOST: me.host})
    assert not creator_gone({LABEL_HOST: me.host, LABEL_OWNER: "garbage"})
    assert parse_owner(me.host, f"{me.boot}.{me.pidns}.x.1") is None
