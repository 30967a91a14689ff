"""`forgehand doctor` against real data directories and databases: what it says is wrong, and the fix.

Tests that are not about Docker point DOCKER_HOST at a socket that is not there and turn the worker
off: the engine's line is then a quick WARN, and the rest is what they check."""

import json
import sqlite3
from pathlib import Path

import pytest

from forge.db.migrate import head_revision, upgrade
from tests.support.cli import Ran, forgehand, instance_env
from tests.support.git import git

NO_DOCKER = {"DOCKER_HOST": "unix:///nonexistent/docker.sock", "FORGEHAND_RUN_WORKER": "false"}


def doctor(env: dict[str, str], *args: str) -> Ran:
    r = forgehand("doctor", *args, env=env)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def lines(r: Ran) -> dict[str, str]:
    """Each check's line, by the check's name (the second column)."""
    return {line.split()[1]: line for line in r.stdout.splitlines()}


def migrated(tmp_path: Path, revision: str = "head") -> dict[str, str]:
    """A SQLite instance's environment: its data directory made by `db upgrade`, then the schema at `revision`."""
    data_dir = tmp_path / "data"
    url = f"sqlite+aiosqlite:///{tmp_path / 'forgehand.db'}"
    if revision != "head":
        upgrade(url, revision)
    else:
        env = instance_env(data_dir, url)
        assert forgehand("db", "upgrade", env=env).returncode == 0
    (data_dir / "repos").mkdir(parents=True, exist_ok=True)
    return instance_env(data_dir, url)


@pytest.mark.docker
def test_a_fresh_instance_with_docker_and_images_is_all_ok(tmp_path: Path, db_url: str) -> None:
    env = instance_env(tmp_path / "data", db_url)
    assert forgehand("db", "upgrade", env=env).returncode == 0
    (tmp_path / "data" / "repos" / "ana" / "tools.git").mkdir(parents=True)
    (tmp_path / "data" / "repos" / "ana" / "tools.git" / "HEAD").write_text("ref: refs/heads/main\n")
    r = doctor(env)
    assert r.returncode == 0, r.stdout
    found = lines(r)
    assert list(found) == [
        "settings", "data-dir", "database", "repos", "storage", "docker", "sandbox-image", "agents-image",
        "allow-lists", "clock",
    ]  # fmt: skip
    assert all(line.startswith("OK ") for line in found.values()), r.stdout
    assert f"at revision {head_revision()}" in found["database"]
    assert "1 repositories readable" in found["repos"]


def test_a_database_one_revision_behind_fails_naming_db_upgrade(tmp_path: Path) -> None:
    env = {**migrated(tmp_path, "0041"), **NO_DOCKER}
    (tmp_path / "data" / "repos").mkdir(parents=True, exist_ok=True)
    r = doctor(env)
    assert r.returncode == 1
    found = lines(r)
    assert found["database"].startswith("FAIL")
    assert "at revision 0041, behind" in found["database"] and "run `forgehand db upgrade`" in found["database"]
    assert found["docker"].startswith("WARN")  # no worker here: a missing engine does not fail
    assert found["settings"].startswith("OK") and found["data-dir"].startswith("OK")


def test_a_database_ahead_of_the_code_says_the_code_is_older(tmp_path: Path) -> None:
    env = {**migrated(tmp_path), **NO_DOCKER}
    with sqlite3.connect(tmp_path / "forgehand.db") as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999_from_the_future'")
    found = lines(r := doctor(env))
    assert r.returncode == 1
    assert found["database"].startswith("FAIL") and "this code is older than the database" in found["database"]


def test_a_missing_database_file_is_not_created(tmp_path: Path) -> None:
    env = {**migrated(tmp_path), **NO_DOCKER}
    (tmp_path / "forgehand.db").unlink()
    found = lines(r := doctor(env))
    assert r.returncode == 1 and found["database"].startswith("FAIL") and "forgehand db upgrade" in found["database"]
    assert not (tmp_path / "forgehand.db").exists()


def test_a_data_dir_that_cannot_exist_fails(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory\n")
    data_dir = tmp_path / "a-file" / "data"
    r = doctor({"FORGEHAND_DATA_DIR": str(data_dir), **NO_DOCKER})
    assert r.returncode == 1
    found = lines(r)
    assert found["data-dir"].startswith("FAIL") and "does not exist" in found["data-dir"]
    assert "FORGEHAND_DATA_DIR" in found["data-dir"]
    assert found["repos"].startswith("FAIL") and found["database"].startswith("FAIL")


def test_bad_allow_list_entries_fail_naming_them(tmp_path: Path) -> None:
    env = {
        **migrated(tmp_path),
        **NO_DOCKER,
        "FORGEHAND_MODEL_ALLOWED_HOSTS": "models.internal,bad host!",
        "FORGEHAND_EGRESS_ALLOWED_HOSTS": "pypi.internal:8443,10.0.0.0/8,a:b:c",
    }
    found = lines(r := doctor(env))
    assert r.returncode == 1
    assert found["settings"].startswith("OK")  # the rest of the settings are fine: only the allow-list fails
    line = found["allow-lists"]
    assert line.startswith("FAIL")
    assert "FORGEHAND_MODEL_ALLOWED_HOSTS: 'bad host!'" in line
    assert "FORGEHAND_EGRESS_ALLOWED_HOSTS: 'a:b:c'" in line
    assert "models.internal" not in line and "pypi.internal" not in line


def test_json_is_a_list_of_checks(tmp_path: Path) -> None:
    env = {**migrated(tmp_path, "0041"), **NO_DOCKER}
    r = doctor(env, "--json")
    assert r.returncode == 1
    checks = json.loads(r.stdout)
    assert isinstance(checks, list)
    assert all(set(c) == {"check", "status", "detail", "fix"} for c in checks)
    assert all(c["status"] in {"OK", "WARN", "FAIL"} for c in checks)
    by_name = {c["check"]: c for c in checks}
    assert by_name["database"]["status"] == "FAIL" and "forgehand db upgrade" in by_name["database"]["fix"]
    assert by_name["docker"]["status"] == "WARN" and by_name["docker"]["fix"]
    assert by_name["clock"] == {"check": "clock", "status": "OK", "detail": "SQLite: one machine, one clock", "fix": ""}


def test_the_database_and_the_clock_on_each_database(tmp_path: Path, db_url: str) -> None:
    """PostgreSQL: the database's clock is compared with this host's; SQLite: one machine, one clock."""
    env = {**instance_env(tmp_path / "data", db_url), **NO_DOCKER}
    assert forgehand("db", "upgrade", env=env).returncode == 0
    found = lines(r := doctor(env))
    assert r.returncode == 0, r.stdout
    if db_url.startswith("sqlite"):
        assert found["database"].startswith("OK") and found["clock"].startswith("OK")
        assert "one machine" in found["clock"]
        return
    assert found["database"].startswith("OK") and "postgresql+asyncpg://" in found["database"]
    assert "forgehand:forgehand@" not in found["database"]  # the password is never printed
    assert found["clock"].startswith("OK") and "differ by" in found["clock"]


def test_bad_settings_fail_on_one_line(tmp_path: Path) -> None:
    r = doctor({"FORGEHAND_DATA_DIR": str(tmp_path / "data"), "FORGEHAND_PORT": "eighty"})
    assert r.returncode == 1
    [line] = r.stdout.splitlines()  # the other checks need the settings: not run
    assert line.startswith("FAIL  settings") and "FORGEHAND_PORT" in line
    assert not (tmp_path / "data").exists()


def test_a_host_that_does_not_see_the_shared_repositories_fails_naming_the_mount(tmp_path: Path, db_url: str) -> None:
    """A second host (a worker, a replica) on the same database whose data directory is not the
    shared one: the repositories the database knows are not there, and doctor says so."""
    env = {**instance_env(tmp_path / "data", db_url), **NO_DOCKER}
    assert forgehand("db", "upgrade", env=env).returncode == 0
    assert forgehand("users", "create", "ana", "--password", "correct horse battery", env=env).returncode == 0
    source = tmp_path / "app"
    git("init", "-q", "-b", "main", str(source), cwd=tmp_path)
    git("commit", "-q", "--allow-empty", "-m", "first", cwd=source)
    made = forgehand("repos", "import", str(source), "--owner", "ana", env=env)
    assert made.returncode == 0, made.stderr
    assert lines(doctor(env))["storage"].startswith("OK ")

    elsewhere = {**instance_env(tmp_path / "other-host", db_url), **NO_DOCKER}  # the same database
    r = doctor(elsewhere)
    assert r.returncode != 0, r.stdout
    found = lines(r)["storage"]
    assert found.startswith("FAIL ") and "1 of the 1 repositories" in found and "ana/app" in found
    assert "mount the shared data directory" in r.stdout
