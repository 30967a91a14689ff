"""A rolling upgrade with two real releases on one database: a replica of the previous release keeps
serving, reads and writes, while the next release migrates the database under it; then the next
release serves what the previous one wrote, beside it.

The previous release is this tree as it was before its newest migration: the parent of the commit
that added the newest file in forge/db/migrations/versions (HEAD while that file is not committed
yet), exported with `git archive` and run with this venv's python, its packages first on the path.
What the guard of tests/unit/forge/db/test_migrations_expand_contract.py checks in the migrations'
text, this test checks with the code of both releases running: the previous release's reads,
writes and sign-in still work on the new schema.

On both databases (SQLite: two processes on one file; PostgreSQL: the deployment with replicas).
Over 30 s on a loaded machine (10-40 s per database on 2 busy CPUs): it starts four processes,
`serve` and one command of each release, and the old tree is byte-compiled on its first import.
That cost is the two releases, which are the point."""

import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

import forge
from forge.accounts.initial_password import PASSWORD_FILE
from forge.db.migrate import MIGRATIONS, alembic_config, head_revision
from tests.support import databases
from tests.support.ports import free_port
from tests.support.waiting import until
from tests.support.web import csrf_from

ROOT = Path(forge.__file__).resolve().parents[1]
PACKAGES = ("forge", "tasks", "sandbox", "webhooks", "egress")
FORGEHAND = str(Path(sys.executable).with_name("forgehand"))

# `forgehand` of the previous release: the venv's console script would import this tree. It says
# which code it runs before doing anything else, so the test can check it is the old tree.
PREVIOUS_FORGEHAND = """
import sys
import forge
from forge.db.migrate import head_revision
print(f"release: {forge.__file__} head {head_revision()}", flush=True)
from forge.app.cli import main
main(sys.argv[1:], prog_name="forgehand")
"""
RELEASE_LINE = re.compile(r"^release: (\S+) head (\S+)$", re.MULTILINE)


def _git(*args: str) -> bytes:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True).stdout


def export_previous_release(target: Path) -> str:
    """The python packages of the previous release under `target` (no checkout: `git archive` of
    the tree); returns the commit (or `HEAD`) they come from."""
    newest = max(MIGRATIONS.joinpath("versions").glob("[0-9]*.py")).relative_to(ROOT)
    added = _git("log", "--diff-filter=A", "--format=%H", "-1", "--", str(newest)).decode().strip()
    if added:
        base = f"{added}^"
    else:
        tracked = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "--error-unmatch", str(newest)], capture_output=True, check=False
        )
        assert tracked.returncode != 0, f"no commit adds {newest} in this clone's history (a shallow clone?)"
        base = "HEAD"  # the newest migration is not committed yet: HEAD is the release before it
    names = [n for n in _git("ls-tree", "--name-only", base).decode().split() if n in PACKAGES]
    target.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(target)], input=_git("archive", base, *names), check=True)
    return base


def _env(data: Path, url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGEHAND_") and k != "PYTHONPATH"}
    return env | {
        "FORGEHAND_DATA_DIR": str(data),
        "FORGEHAND_DATABASE_URL": url,
        "FORGEHAND_RUN_WORKER": "false",
        "FORGEHAND_SEED_DEMO": "false",
        "FORGEHAND_LOG_LEVEL": "warning",
        **extra,
    }


@asynccontextmanager
async def serving(command: list[str], env: dict[str, str], cwd: Path, log: Path) -> AsyncIterator[httpx.AsyncClient]:
    """`serve` as a process of its own on a free port, up and answering /healthz; a client on it
    (its own cookies); terminated on exit."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        server = subprocess.Popen(
            command, env=env | {"FORGEHAND_PORT": str(port)}, cwd=cwd, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:

            async def healthy() -> bool:
                assert server.poll() is None, f"serve exited with {server.returncode}: {log.read_text()[-3000:]}"
                return (await client.get("/healthz")).status_code == 200

            await until(healthy, timeout=90, what=f"{command[-1]} on {base}", ignoring=(httpx.TransportError,))
            yield client
            assert server.poll() is None, f"serve exited with {server.returncode}: {log.read_text()[-3000:]}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


async def _alembic_version(url: str) -> list[str]:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            return [r[0] for r in await conn.execute(text("SELECT version_num FROM alembic_version"))]
    finally:
        await engine.dispose()


async def _sign_in(client: httpx.AsyncClient, login: str, password: str) -> httpx.Response:
    form = await client.get("/signin")
    token = csrf_from(form.text[form.text.index('action="/signin"') :])
    return await client.post("/signin", data={"login": login, "password": password, "csrf_token": token, "next": "/"})


@pytest.fixture
async def empty_url(db_url: str, tmp_path: Path) -> str:
    """An empty database of the kind `db_url` is (never migrated)."""
    if db_url.startswith("postgresql"):
        return await databases.postgres_empty(os.environ["FORGEHAND_TEST_DATABASE_URL"])
    return f"sqlite+aiosqlite:///{tmp_path / 'two-releases.db'}"


async def test_the_previous_release_keeps_serving_while_the_next_migrates(empty_url: str, tmp_path: Path) -> None:
    previous = tmp_path / "previous"
    base = export_previous_release(previous)
    data = tmp_path / "data"
    old_command = [sys.executable, "-c", PREVIOUS_FORGEHAND]
    # PYTHONPATH puts the old packages before the venv's editable install of this tree; the working
    # directory is not the repository, whose packages `python -c` would otherwise find first.
    old_env = _env(data, empty_url, PYTHONPATH=str(previous), FORGEHAND_SEED_DEMO="true")
    new_env = _env(data, empty_url)
    new_head = head_revision()
    script = ScriptDirectory.from_config(alembic_config(empty_url))

    # a. The previous release migrates the empty database to its own head, creates the admin and
    # the demo repository, and serves.
    async with serving([*old_command, "serve"], old_env, tmp_path, tmp_path / "previous.log") as old:
        found = RELEASE_LINE.search((tmp_path / "previous.log").read_text())
        assert found, (tmp_path / "previous.log").read_text()
        old_file, old_head = found.groups()
        assert Path(old_file).is_relative_to(previous), f"serve ran {old_file}, not the release of {base}"
        assert old_head != new_head and script.get_revision(old_head) is not None, (old_head, new_head)
        assert await _alembic_version(empty_url) == [old_head]

        made = subprocess.run(
            [*old_command, "tokens", "create", "--user", "root", "--name", "rolling upgrade", "--scope", "admin"],
            env=old_env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
        )
        assert made.returncode == 0, made.stderr
        assert f"release: {old_file} head {old_head}" in made.stdout, made.stdout
        token = made.stdout.split()[-1]
        old.headers["Authorization"] = f"Bearer {token}"
        assert [r["full_name"] for r in (await old.get("/api/v1/repos")).json()] == ["root/demo"]

        # b. The next release migrates the database under it.
        upgrade = subprocess.run(
            [FORGEHAND, "db", "upgrade"],
            env=new_env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert upgrade.returncode == 0, upgrade.stderr
        assert await _alembic_version(empty_url) == [new_head]

        # c. The previous release still reads...
        assert (await old.get("/healthz")).json()["status"] == "ok"
        repos = await old.get("/api/v1/repos")
        assert repos.status_code == 200 and [r["full_name"] for r in repos.json()] == ["root/demo"], repos.text
        demo = await old.get("/api/v1/repos/root/demo")
        assert demo.status_code == 200, demo.text
        task_list = await old.get("/api/v1/repos/root/demo/tasks")
        assert task_list.status_code == 200 and task_list.json() == [], task_list.text
        # ... and writes: a repository, an issue, ...
        created = await old.post("/api/v1/user/repos", json={"name": "made-by-previous", "auto_init": True})
        assert created.status_code == 201, created.text
        issue = await old.post("/api/v1/repos/root/demo/issues", json={"title": "Opened by the previous release"})
        assert issue.status_code == 201, issue.text
        # ... and a person signs in (a session and its audit row) and chooses a password.
        del old.headers["Authorization"]
        generated = (data / PASSWORD_FILE).read_text().split("password:")[1].strip()
        signed_in = await _sign_in(old, "root", generated)
        assert signed_in.status_code == 303 and signed_in.headers["location"] == "/", signed_in.text
        form = await old.get("/settings/password")
        changed = await old.post(
            "/settings/password",
            data={
                "csrf_token": csrf_from(form.text),
                "current_password": generated,
                "new_password": "chosen after the upgrade",
                "repeat_password": "chosen after the upgrade",
            },
        )
        assert changed.status_code == 200 and "Password changed" in changed.text, changed.text
        me = await old.get("/api/v1/user")
        assert me.status_code == 200 and me.json()["login"] == "root", me.text

        # The next release serves beside it: what the previous release wrote, and a write of its own
        # that the previous release then reads.
        async with serving([FORGEHAND, "serve"], new_env, tmp_path, tmp_path / "next.log") as new:
            assert (await _sign_in(new, "root", "chosen after the upgrade")).status_code == 303
            new.headers["Authorization"] = f"Bearer {token}"
            repo = await new.get("/api/v1/repos/root/made-by-previous")
            assert repo.status_code == 200, repo.text
            readme = await new.get("/api/v1/repos/root/made-by-previous/contents/README.md")
            assert readme.status_code == 200, readme.text
            number = issue.json()["number"]
            shown = await new.get(f"/api/v1/repos/root/demo/issues/{number}")
            assert shown.status_code == 200 and shown.json()["title"] == "Opened by the previous release", shown.text
            opened = await new.post("/api/v1/repos/root/demo/issues", json={"title": "Opened by the next release"})
            assert opened.status_code == 201, opened.text

        listed = await old.get("/api/v1/repos/root/demo/issues", params={"state": "all"})
        assert listed.status_code == 200, listed.text
        titles = sorted(i["title"] for i in listed.json())
        assert titles == ["Opened by the next release", "Opened by the previous release"], listed.text
