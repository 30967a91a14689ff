"""The hosts file a sandbox without Docker's networking mounts: written when it is not exactly ours,
never through a symlink."""

import os
import stat
from pathlib import Path

import pytest

from sandbox.hosts import ensure_hosts_file
from sandbox.spec import HOSTS_TEXT


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_a_missing_file_and_its_directory_are_made(tmp_path: Path) -> None:
    hosts = tmp_path / "channels" / "hosts"
    ensure_hosts_file(hosts)
    assert hosts.read_text() == HOSTS_TEXT and mode(hosts) == 0o644
    assert mode(hosts.parent) & 0o755 == 0o755
    assert sorted(p.name for p in hosts.parent.iterdir()) == ["hosts"]  # nothing staged is left


def test_a_file_that_is_ours_is_left_alone(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    ensure_hosts_file(hosts)
    before = hosts.stat().st_ino
    ensure_hosts_file(hosts)
    assert hosts.stat().st_ino == before


@pytest.mark.parametrize(
    ("content", "file_mode"),
    [("1.2.3.4 localhost\n", 0o644), (HOSTS_TEXT + "1.2.3.4 x\n", 0o644), (HOSTS_TEXT, 0o600), (HOSTS_TEXT, 0o666)],
    ids=["other-content", "more-content", "unreadable-to-the-sandbox", "writable-by-all"],
)
def test_anything_else_is_replaced(tmp_path: Path, content: str, file_mode: int) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(content)
    hosts.chmod(file_mode)
    ensure_hosts_file(hosts)
    assert hosts.read_text() == HOSTS_TEXT and mode(hosts) == 0o644


def test_a_symlink_is_replaced_and_its_target_left_alone(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text(HOSTS_TEXT)  # even with the right content: the daemon would follow the link
    secret.chmod(0o644)
    hosts = tmp_path / "hosts"
    hosts.symlink_to(secret)
    ensure_hosts_file(hosts)
    assert not hosts.is_symlink() and hosts.read_text() == HOSTS_TEXT
    assert secret.read_text() == HOSTS_TEXT and secret.exists()


def test_a_directory_that_cannot_be_made_is_an_os_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError):
        ensure_hosts_file(tmp_path / "file" / "hosts")


def test_the_umask_does_not_change_the_mode(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        ensure_hosts_file(tmp_path / "hosts")
    finally:
        os.umask(old)
    assert mode(tmp_path / "hosts") == 0o644
