"""The `forgehand` command against a real data directory: in-process for what the commands do
(tests/support/cli.py), as a real subprocess for what only a process shows (the console script, the
working directory, a bad environment)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import Ran, forgehand, instance_env

FORGEHAND = str(Path(sys.executable).with_name("forgehand"))


def run(data_dir: Path, db_url: str, *args: str, input_: str | None = None) -> Ran:
    return forgehand(*args, env=instance_env(data_dir, db_url), input_=input_)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "cli-data"


def test_every_command_has_help() -> None:
    from click.testing import CliRunner

    from forge.app.cli import main

    for args in (
        [],
        ["serve"],
        ["db", "upgrade"],
        ["users", "create"],
        ["users", "list"],
        ["users", "disable"],
        ["bots", "create"],
        ["tokens", "create"],
        ["tokens", "list"],
        ["tokens", "revoke"],
        ["audit", "tail"],
        ["sandbox"],
    ):
        r = CliRunner().invoke(main, [*args, "--help"])
        assert r.exit_code == 0, (args, r.output)
        assert "Usage:" in r.output


def test_users_bots_tokens_audit_roundtrip(data_dir: Path, db_url: str) -> None:
    """The CLI's account commands as an operator runs them, one after another on one instance."""
    assert run(data_dir, db_url, "db", "upgrade").returncode == 0
    r = run(data_dir, db_url, "users", "create", "ana", "--admin", "--password", "correct horse battery")
    assert r.returncode == 0, r.stderr
    r = run(data_dir, db_url, "users", "create", "carol")  # not interactive: a password is generated
    assert r.returncode == 0 and "password: " in r.stdout
    assert run(data_dir, db_url, "bots", "create", "fixer", "--owner", "ana").returncode == 0
    r = run(
        data_dir, db_url, "tokens", "create", "--user", "fixer", "--name", "ci",
        "--scope", "tasks:write", "--scope", "repo:read", "--expires-days", "30",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip().splitlines()[-1]
    assert token.startswith("fh_") and len(token) == 43
    listing = run(data_dir, db_url, "tokens", "list", "--user", "fixer")
    assert token[-8:] in listing.stdout and token not in listing.stdout
    token_id = listing.stdout.split("\t")[0]
    assert run(data_dir, db_url, "tokens", "revoke", token_id).returncode == 0
    assert "revoked" in run(data_dir, db_url, "tokens", "list", "--user", "fixer", "--all").stdout
    users = run(data_dir, db_url, "users", "list").stdout
    assert users.splitlines()[0] == "login\ttype\tflags\towner"
    assert "ana\tUser\tadmin" in users and "fixer\tBot\t-\tana" in users
    assert run(data_dir, db_url, "users", "disable", "carol").returncode == 0
    assert "carol\tUser\tdisabled" in run(data_dir, db_url, "users", "list").stdout
    tail = run(data_dir, db_url, "audit", "tail", "-n", "50").stdout
    for action in ("user.create", "bot.create", "token.create", "token.revoke", "user.disable"):
        assert action in tail


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["users", "create", "bad--name", "--password", "correct horse battery"], "login"),
        (["users", "create", "ana", "--password", "short"], "at least"),
        (["bots", "create", "fixer", "--owner", "ghost"], "no account 'ghost'"),
        (["tokens", "create", "--user", "ghost", "--name", "x", "--scope", "repo:read"], "no account"),
        (["tokens", "create", "--user", "ana", "--name", "x", "--scope", "repo:all"], "unknown scope"),
        (["tokens", "revoke", "999"], "no token 999"),
        (["users", "disable", "ghost"], "no account"),
    ],
)
def test_errors_are_one_line_with_exit_status_2(data_dir: Path, db_url: str, args: list[str], message: str) -> None:
    run(data_dir, db_url, "users", "create", "ana", "--password", "correct horse battery")
    r = run(data_dir, db_url, *args)
    assert r.returncode == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_bad_setting_is_one_line(data_dir: Path, db_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGEHAND_")}
    env.update({"FORGEHAND_DATA_DIR": str(data_dir), "FORGEHAND_PORT": "eighty"})
    r = subprocess.run([FORGEHAND, "users", "list"], capture_output=True, text=True, env=env, check=False, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().startswith("forgehand: error: FORGEHAND_PORT")


def test_repos_import_keeps_branches_and_tags(data_dir: Path, db_url: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    env = {**os.environ, "GIT_AUTHOR_NAME": "A", "GIT_AUTHOR_EMAIL": "a@x", "GIT_COMMITTER_NAME": "A",
           "GIT_COMMITTER_EMAIL": "a@x", "HOME": str(tmp_path)}  # fmt: skip
    for args in (
        ["init", "-b", "trunk", str(src)],
        ["-C", str(src), "commit", "--allow-empty", "-m", "one"],
        ["-C", str(src), "tag", "v1"],
        ["-C", str(src), "branch", "feature"],
    ):
        subprocess.run(["git", *args], check=True, env=env, capture_output=True)
    run(data_dir, db_url, "users", "create", "ana", "--password", "correct horse battery")
    r = run(data_dir, db_url, "repos", "import", str(src), "--owner", "ana", "--name", "imported")
    assert r.returncode == 0, r.stderr
    assert "ana/imported (default branch trunk)" in r.stdout
    bare = data_dir / "repos" / "ana" / "imported.git"
    refs = subprocess.run(["git", "ls-remote", str(bare)], capture_output=True, text=True, check=True).stdout
    assert "refs/heads/trunk" in refs and "refs/heads/feature" in refs and "refs/tags/v1" in refs
    r = run(data_dir, db_url, "repos", "import", str(tmp_path / "missing"), "--owner", "ana")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    r = run(data_dir, db_url, "repos", "import", "https://example.org/x.git", "--owner", "ana")
    assert r.returncode == 2


def test_commands_on_an_unmigrated_database_say_to_run_db_upgrade(data_dir: Path, tmp_path: Path) -> None:
    db_url = f"sqlite+aiosqlite:///{tmp_path / 'never-migrated.db'}"
    for args in (["users", "create", "bob"], ["users", "list"], ["audit", "tail"]):
        out = run(data_dir, db_url, *args)
        assert out.returncode != 0, args
        assert "Traceback" not in out.stderr, out.stderr
        assert "run `forgehand db upgrade`" in out.stderr, out.stderr
    assert run(data_dir, db_url, "db", "upgrade").returncode == 0
    created = run(data_dir, db_url, "users", "create", "bob", "--password", "correct horse battery")
    assert created.returncode == 0, created.stderr


def _plain_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGEHAND_")}
    env.update(extra)
    return env


def test_a_command_run_where_there_is_no_instance_says_where_it_looked_and_creates_nothing(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    empty = tmp_path / "empty"
    elsewhere.mkdir()
    empty.mkdir()
    cases = [
        (elsewhere, {}, elsewhere / "var"),  # the default ./var of another directory
        (elsewhere, {"FORGEHAND_DATA_DIR": str(empty)}, empty),  # an empty directory
        (elsewhere, {"FORGEHAND_DATA_DIR": "missing"}, elsewhere / "missing"),  # relative, missing
    ]
    commands = (["users", "list"], ["users", "create", "bob"], ["tokens", "list", "--user", "ana"], ["audit", "tail"])
    for cwd, env, looked_at in cases:
        for args in commands:
            r = forgehand(*args, env=env, cwd=cwd)
            assert r.returncode == 2, (args, r)
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
            assert f"{looked_at.resolve()} has no forgehand database (forgehand.db)" in lines[0]
            assert "FORGEHAND_DATA_DIR=PATH" in lines[0] and "--data-dir PATH" in lines[0]
            assert "nothing was created" in lines[0]
    assert list(elsewhere.iterdir()) == [] and list(empty.iterdir()) == []


def test_data_dir_option_points_a_command_at_an_instance_from_anywhere(tmp_path: Path) -> None:
    instance, elsewhere = tmp_path / "instance", tmp_path / "elsewhere"
    elsewhere.mkdir()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([FORGEHAND, *args], cwd=elsewhere, env=_plain_env(), capture_output=True, text=True)

    assert cli("--data-dir", str(instance), "db", "upgrade").returncode == 0
    created = cli("--data-dir", str(instance), "users", "create", "ana", "--password", "correct horse battery")
    assert created.returncode == 0, created.stderr
    listed = cli("--data-dir", str(instance), "users", "list")
    assert listed.returncode == 0 and "ana\tUser" in listed.stdout, listed.stderr
    assert list(elsewhere.iterdir()) == []
