"""Repository secrets over REST (GitHub's Actions secrets paths and shapes) and through the service
a run reads them with: set, list, read, replace, delete by an admin; who else gets what; values
never in a response, an audit row or the database in clear; what is refused, with its code."""

from typing import Any

import msgspec
from litestar.testing import AsyncTestClient
from sqlalchemy import select, text

from forge.core.settings import Settings
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.models import AuditEvent
from forge.repos import repositories
from forge.repos.repo_secrets import MAX_SECRETS, RepoSecrets, secret_box
from tests.support.accounts import Accounts

API = "/api/v1/repos/ana/proj"
SECRETS = f"{API}/actions/secrets"
VALUE = "pypi-AgEIcHlwaS5vcmcCJGZmNTEtc2VjcmV0LXZhbHVl"
NEW_VALUE = "pypi-rotated-7c1d9b2e5a"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class Team(msgspec.Struct):
    ana: str  # owner
    adam: str  # admin collaborator
    bob: str  # write collaborator
    rita: str  # reader
    out: str  # can read nothing


async def _team(client: AsyncTestClient[Any], make: Accounts) -> Team:
    for login in ("ana", "adam", "bob", "rita", "out"):
        await make.user(login)
    ana = await make.token("ana", "repo:write")
    r = await client.post("/api/v1/user/repos", json={"name": "proj", "auto_init": True}, headers=bearer(ana))
    assert r.status_code == 201, r.text
    for login, role in (("adam", "admin"), ("bob", "write"), ("rita", "read")):
        r = await client.put(f"{API}/collaborators/{login}", json={"role": role}, headers=bearer(ana))
        assert r.status_code == 200, r.text
    return Team(
        ana=ana,
        adam=await make.token("adam", "repo:write"),
        bob=await make.token("bob", "repo:write"),
        rita=await make.token("rita", "repo:write"),
        out=await make.token("out", "repo:write"),
    )


async def _raw_values(db: Database) -> list[str]:
    async with db.session() as s:
        return [row[0] for row in await s.execute(text("SELECT value_encrypted FROM repo_secrets"))]


async def test_an_admin_sets_lists_replaces_and_deletes_a_secret_whose_value_is_never_shown(
    client: AsyncTestClient[Any], make: Accounts, db: Database, settings: Settings
) -> None:
    t = await _team(client, make)
    empty = await client.get(SECRETS, headers=bearer(t.ana))
    assert empty.status_code == 200 and empty.json() == {"total_count": 0, "secrets": []}

    r = await client.put(f"{SECRETS}/PYPI_TOKEN", json={"value": VALUE}, headers=bearer(t.ana))
    assert r.status_code == 201, r.text
    r = await client.put(f"{SECRETS}/mirror_token", json={"value": "m-1"}, headers=bearer(t.adam))
    assert r.status_code == 201, r.text

    listed = (await client.get(SECRETS, headers=bearer(t.adam))).json()
    assert listed["total_count"] == 2
    assert [s["name"] for s in listed["secrets"]] == ["PYPI_TOKEN", "mirror_token"]
    assert set(listed["secrets"][0]) == {"name", "created_at", "updated_at"}
    one = await client.get(f"{SECRETS}/PYPI_TOKEN", headers=bearer(t.ana))
    assert one.status_code == 200 and set(one.json()) == {"name", "created_at", "updated_at"}
    before = one.json()

    # Rotation: PUT again. 204, the same row: created_at kept, updated_at moved.
    r = await client.put(f"{SECRETS}/PYPI_TOKEN", json={"value": NEW_VALUE}, headers=bearer(t.ana))
    assert r.status_code == 204 and r.content == b""
    after = (await client.get(f"{SECRETS}/PYPI_TOKEN", headers=bearer(t.ana))).json()
    assert after["created_at"] == before["created_at"] and after["updated_at"] > before["updated_at"]

    # In the database: sealed, never in clear; the service opens it with the instance's box.
    raw = await _raw_values(db)
    assert len(raw) == 2 and all(VALUE not in v and NEW_VALUE not in v and "m-1" not in v for v in raw)
    async with db.session() as s:
        repo = await repositories.find(s, "ana", "proj")
        assert repo is not None
        got = await RepoSecrets(s, secret_box(settings)).values(repo.id, ["PYPI_TOKEN", "MISSING", "mirror_token"])
    assert got == {"PYPI_TOKEN": NEW_VALUE, "mirror_token": "m-1"}

    r = await client.delete(f"{SECRETS}/mirror_token", headers=bearer(t.ana))
    assert r.status_code == 204
    r = await client.delete(f"{SECRETS}/mirror_token", headers=bearer(t.ana))
    assert r.status_code == 404 and r.json()["code"] == "secret_not_found"
    r = await client.get(f"{SECRETS}/mirror_token", headers=bearer(t.ana))
    assert r.status_code == 404 and r.json()["code"] == "secret_not_found"
    assert [s["name"] for s in (await client.get(SECRETS, headers=bearer(t.ana))).json()["secrets"]] == ["PYPI_TOKEN"]

    # The audit rows name the secret, never its value.
    async with db.session() as s:
        rows = (
            (await s.execute(select(AuditEvent).where(AuditEvent.action.like("repo.secret.%")).order_by(AuditEvent.id)))
            .scalars()
            .all()
        )
    assert [(a.action, a.actor_login, a.target, a.detail["name"]) for a in rows] == [
        ("repo.secret.put", "ana", "ana/proj", "PYPI_TOKEN"),
        ("repo.secret.put", "adam", "ana/proj", "mirror_token"),
        ("repo.secret.put", "ana", "ana/proj", "PYPI_TOKEN"),
        ("repo.secret.delete", "ana", "ana/proj", "mirror_token"),
    ]
    assert [a.detail.get("created") for a in rows[:3]] == [True, True, False]
    dumped = msgspec.json.encode([(a.target, a.detail) for a in rows]).decode()
    assert VALUE not in dumped and NEW_VALUE not in dumped and "m-1" not in dumped


async def test_below_admin_the_access_rule_answers_403_or_404(client: AsyncTestClient[Any], make: Accounts) -> None:
    t = await _team(client, make)
    assert (await client.put(f"{SECRETS}/TOKEN", json={"value": "v"}, headers=bearer(t.ana))).status_code == 201
    # A writer and a reader can see the repository: told they lack the role (403). An outsider
    # cannot: the repository does not exist for them (404, as one that does not exist).
    for token, status in ((t.bob, 403), (t.rita, 403), (t.out, 404)):
        for method, path, body in (
            ("GET", SECRETS, None),
            ("GET", f"{SECRETS}/TOKEN", None),
            ("PUT", f"{SECRETS}/TOKEN", {"value": "stolen"}),
            ("DELETE", f"{SECRETS}/TOKEN", None),
        ):
            r = await client.request(method, path, json=body, headers=bearer(token))
            assert r.status_code == status, (method, path, r.text)
            assert "stolen" not in r.text
            if status == 404:
                assert r.json()["code"] == "repo_not_found"
    # A read-only token of the owner lacks the scope repository settings need.
    read_only = await make.token("ana", "repo:read")
    r = await client.get(SECRETS, headers=bearer(read_only))
    assert r.status_code == 403 and r.json()["code"] == "insufficient_scope"
    assert [s["name"] for s in (await client.get(SECRETS, headers=bearer(t.ana))).json()["secrets"]] == ["TOKEN"]


async def test_bad_names_values_too_large_and_too_many_are_refused_with_their_codes(
    client: AsyncTestClient[Any], make: Accounts, db: Database, settings: Settings
) -> None:
    t = await _team(client, make)
    for bad in ("1TOKEN", "MY-TOKEN", "A" * 129, "FORGEHAND_TOKEN", "github_token", "GITHUB_X", "caf%C3%A9"):
        r = await client.put(f"{SECRETS}/{bad}", json={"value": "v"}, headers=bearer(t.ana))
        assert r.status_code == 422 and r.json()["code"] == "invalid_secret_name", (bad, r.text)
    r = await client.put(f"{SECRETS}/FORGEHAND_X", json={"value": "v"}, headers=bearer(t.ana))
    assert "FORGEHAND_" in r.json()["detail"]
    assert (await client.put(f"{SECRETS}/{'A' * 128}", json={"value": "v"}, headers=bearer(t.ana))).status_code == 201

    r = await client.put(f"{SECRETS}/BIG", json={"value": "x" * (48 * 1024 + 1)}, headers=bearer(t.ana))
    assert r.status_code == 422 and r.json()["code"] == "secret_too_large"
    # 48 KiB in UTF-8 bytes: 16 Ki three-byte characters fit, one more does not.
    assert (await client.put(f"{SECRETS}/BIG", json={"value": "€" * 16384}, headers=bearer(t.ana))).status_code == 201
    r = await client.put(f"{SECRETS}/BIG2", json={"value": "€" * 16385}, headers=bearer(t.ana))
    assert r.status_code == 422 and r.json()["code"] == "secret_too_large"
    for value in ("", "a\x00b"):
        r = await client.put(f"{SECRETS}/ODD", json={"value": value}, headers=bearer(t.ana))
        assert r.status_code == 422 and r.json()["code"] == "invalid_secret_value", (value, r.text)
    r = await client.put(f"{SECRETS}/ODD", json={"value": "v", "encrypted_value": "x"}, headers=bearer(t.ana))
    assert r.status_code in (400, 422)

    # Fill the repository to the limit through the service (two are there), then one more.
    async with db.session(write=True) as s:
        res = await repositories.load(s, Actor.system("test").principal, "ana", "proj")
        secrets = RepoSecrets(s, secret_box(settings))
        for i in range(MAX_SECRETS - 2):
            assert await secrets.put(Actor.system("test"), res, f"S_{i:03d}", f"v{i}")
    listed = (await client.get(SECRETS, headers=bearer(t.ana))).json()
    assert listed["total_count"] == MAX_SECRETS
    r = await client.put(f"{SECRETS}/ONE_MORE", json={"value": "v"}, headers=bearer(t.ana))
    assert r.status_code == 422 and r.json()["code"] == "too_many_secrets"
    # Replacing one at the limit is not adding one.
    assert (await client.put(f"{SECRETS}/BIG", json={"value": "small"}, headers=bearer(t.ana))).status_code == 204


async def test_secrets_go_with_their_repository(
    client: AsyncTestClient[Any], make: Accounts, db: Database, settings: Settings
) -> None:
    t = await _team(client, make)
    assert (await client.put(f"{SECRETS}/TOKEN", json={"value": "v"}, headers=bearer(t.ana))).status_code == 201
    async with db.session() as s:
        repo = await repositories.find(s, "ana", "proj")
        assert repo is not None
        repo_id = repo.id
        assert await RepoSecrets(s, secret_box(settings)).values(repo_id, []) == {}
        # Another instance key cannot open them (the box is the instance's).
        other = RepoSecrets(s, secret_box(msgspec.structs.replace(settings, secret_key="y" * 48)))
        try:
            await other.values(repo_id, ["TOKEN"])
        except ValueError:
            pass
        else:
            raise AssertionError("a value opened with another instance key")
    async with db.session(write=True) as s:
        await s.execute(text("DELETE FROM repositories WHERE id = :id"), {"id": repo_id})
    assert await _raw_values(db) == []
