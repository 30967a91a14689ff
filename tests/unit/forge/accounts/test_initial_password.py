"""The first admin's password file: written 0600, removed only for the account it names."""

from pathlib import Path

from forge.accounts import initial_password


def test_the_file_is_private_and_goes_only_for_its_own_login(tmp_path: Path) -> None:
    path = initial_password.write(tmp_path, "root", "s3cret-generated")
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.read_text() == "login: root\npassword: s3cret-generated\n"
    assert not initial_password.discard(tmp_path, "ana")
    assert path.exists()
    assert initial_password.discard(tmp_path, "ROOT")  # logins are case-insensitive
    assert not path.exists()
    assert not initial_password.discard(tmp_path, "root")  # nothing left to remove
