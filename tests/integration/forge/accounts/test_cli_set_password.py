"""`forgehand users set-password LOGIN` (in-process: tests/support/cli.py): the password comes
from stdin (or a prompt), never from the command line; refusals are one line and exit status 2."""

import asyncio
from pathlib import Path

from click.testing import CliRunner

from forge.accounts.accounts import require_by_login
from forge.app.cli import main
from forge.core.security import verify_password
from forge.db.engine import Database
from tests.support.accounts import Accounts
from tests.support.cli import Ran, forgehand, instance_env

NEW = "a brand new long password"


async def run(settings_dir: Path, db_url: str, *args: str, input_: str) -> Ran:
    # In a thread: the command runs its own event loop, and this test's is running.
    return await asyncio.to_thread(forgehand, *args, env=instance_env(settings_dir, db_url), input_=input_)


def test_it_takes_no_password_argument() -> None:
    r = CliRunner().invoke(main, ["users", "set-password", "--help"])
    assert r.exit_code == 0 and "stdin" in r.output
    r = CliRunner().invoke(main, ["users", "set-password", "ana", "--password", "x" * 12])
    assert r.exit_code == 2 and "No such option" in r.output


async def test_set_password_from_stdin(tmp_path: Path, db_url: str, make: Accounts, db: Database) -> None:
    await make.user("ana")
    await make.bot("fixer")
    r = await run(tmp_path / "data", db_url, "users", "set-password", "ana", input_=NEW + "\n")
    assert r.returncode == 0, r.stderr
    assert "password of ana set" in r.stdout and NEW not in r.stdout
    async with db.session() as s:
        ana = await require_by_login(s, "ana")
        assert await verify_password(ana.password_hash, NEW)
    for login, given, says in (
        ("ana", "short\n", "at least 10 characters"),
        ("ana", "x" * 1100 + "\n", "at most 1024"),
        ("fixer", NEW + "\n", "bots have no password"),
        ("nobody", NEW + "\n", "no account"),
    ):
        r = await run(tmp_path / "data", db_url, "users", "set-password", login, input_=given)
        assert r.returncode == 2, (login, r.stdout)
        assert says in r.stderr and "Traceback" not in r.stderr
    tail = (await run(tmp_path / "data", db_url, "audit", "tail", "-n", "20", input_="")).stdout
    assert "user.password.reset" in tail
