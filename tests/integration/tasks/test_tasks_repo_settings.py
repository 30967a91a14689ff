"""Per-repository task settings: admins only, the model key encrypted and never shown again."""

from typing import Any

from litestar.testing import AsyncTestClient
from sqlalchemy import select

from forge.db.engine import Database
from forge.db.models import AuditEvent
from tasks.core.models import RepoTaskSettings
from tests.support.accounts import Accounts


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_admins_set_overrides_and_the_key_stays_secret(
    client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    await make.user("ana")
    await make.user("bob")
    await make.user("eve")
    ana = bearer(await make.token("ana", "repo:write"))
    await client.post("/api/v1/user/repos", json={"name": "app"}, headers=ana)
    await client.put("/api/v1/repos/ana/app/collaborators/bob", json={"role": "write"}, headers=ana)
    path = "/api/v1/repos/ana/app/task-settings"
    body = {"model_base_url": "https://llm.example/v1", "model_name": "m", "model_api_key": "sk-topsecret",
            "turn_limit": 10, "tool_timeout_seconds": 30}  # fmt: skip
    r = await client.put(path, json=body, headers=ana)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["model_api_key_set"] is True and "sk-topsecret" not in r.text
    assert got["turn_limit"] == 10 and got["idle_seconds"] is None
    assert (await client.get(path, headers=ana)).json() == got
    # the key is encrypted at rest and absent from the audit log
    async with db.session() as s:
        row = await s.get(RepoTaskSettings, 1)
        assert row is not None and row.model_api_key_enc and "sk-topsecret" not in row.model_api_key_enc
        audit_rows = (
            await s.execute(select(AuditEvent).where(AuditEvent.action == "repo.task_settings.update"))
        ).scalars()
        assert all("sk-topsecret" not in str(a.detail) for a in audit_rows)
    # keeping the key when it is not sent; removing it with ""
    r = await client.put(path, json={"turn_limit": 5}, headers=ana)
    assert r.json()["model_api_key_set"] is True and r.json()["model_name"] is None
    r = await client.put(path, json={"model_api_key": ""}, headers=ana)
    assert r.json()["model_api_key_set"] is False
    # writers may not, outsiders do not even see it
    bob = bearer(await make.token("bob", "repo:write"))
    eve = bearer(await make.token("eve", "repo:write"))
    assert (await client.put(path, json={}, headers=bob)).status_code == 403
    assert (await client.get(path, headers=eve)).status_code == 404
    for bad in ({"model_base_url": "ftp://x"}, {"turn_limit": 0}, {"idle_seconds": -1}, {"colour": 1}):
        assert (await client.put(path, json=bad, headers=ana)).status_code == 422, bad


async def test_a_model_url_cannot_choose_the_whole_upstream_path(client: AsyncTestClient[Any], make: Accounts) -> None:
    """With a fragment or query the gateway's `/v1/messages` would be dropped (the URL chooses the
    path on the host it names); userinfo would travel as credentials. Each is refused with its code."""
    await make.user("ana")
    ana = bearer(await make.token("ana", "repo:write"))
    await client.post("/api/v1/user/repos", json={"name": "app"}, headers=ana)
    path = "/api/v1/repos/ana/app/task-settings"
    for field in ("model_base_url", "anthropic_base_url"):
        for url in (
            "http://10.0.0.5:2375/containers/create#",
            "http://10.0.0.5:2375/containers/create?x=",
            "https://user:pw@llm.example/v1",
            "https://llm.example:99999/v1",
            "gopher://llm.example/",
        ):
            r = await client.put(path, json={field: url}, headers=ana)
            assert r.status_code == 422 and r.json()["code"] == "invalid_model_url", (field, url, r.text)
    r = await client.put(path, json={"anthropic_base_url": "https://llm.example/anthropic"}, headers=ana)
    assert r.status_code == 200, r.text


async def test_a_forced_environment_rebuild_counts_the_generation_up_for_admins_only(
    client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    for login in ("ana", "bob", "eve"):
        await make.user(login)
    ana = bearer(await make.token("ana", "repo:write"))
    await client.post("/api/v1/user/repos", json={"name": "app"}, headers=ana)
    await client.put("/api/v1/repos/ana/app/collaborators/bob", json={"role": "write"}, headers=ana)
    path = "/api/v1/repos/ana/app/environment/rebuild"
    assert (await client.post(path, headers=ana)).json() == {"generation": 1}  # no settings row yet
    assert (await client.post(path, headers=ana)).json() == {"generation": 2}
    assert (await client.post(path, headers=bearer(await make.token("bob", "repo:write")))).status_code == 403
    assert (await client.post(path, headers=bearer(await make.token("eve", "repo:write")))).status_code == 404
    async with db.session() as s:
        row = await s.get(RepoTaskSettings, 1)
        assert row is not None and row.environment_generation == 2
        rebuilds = (
            await s.execute(select(AuditEvent).where(AuditEvent.action == "repo.environment.rebuild"))
        ).scalars()
        assert [a.detail["generation"] for a in rebuilds] == [1, 2]


async def test_an_environment_declared_in_the_settings_is_checked_whole_and_admins_only(
    client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    for login in ("ana", "bob", "eve"):
        await make.user(login)
    ana = bearer(await make.token("ana", "repo:write"))
    await client.post("/api/v1/user/repos", json={"name": "app"}, headers=ana)
    await client.put("/api/v1/repos/ana/app/collaborators/bob", json={"role": "write"}, headers=ana)
    path = "/api/v1/repos/ana/app/environment"
    assert (await client.get(path, headers=ana)).json() == {"declaration": None, "generation": 0}
    declared = "image: sandbox\nsetup: python3 -m pip install --target /opt/env/lib -r requirements.txt\n"
    r = await client.put(path, json={"declaration": declared}, headers=ana)
    assert r.status_code == 200 and r.json() == {"declaration": declared, "generation": 0}, r.text
    bad = "image: rust:latest\nmounts: [/]\nenv: {LD_PRELOAD: /x.so}\n"
    r = await client.put(path, json={"declaration": bad}, headers=ana)
    assert r.status_code == 422 and r.json()["code"] == "invalid_environment", r.text
    for named in ("`mounts`", "rust:latest", "LD_PRELOAD"):
        assert named in r.json()["detail"], named
    assert (await client.get(path, headers=ana)).json()["declaration"] == declared  # nothing half-applied
    bob = bearer(await make.token("bob", "repo:write"))
    assert (await client.put(path, json={"declaration": declared}, headers=bob)).status_code == 403
    assert (await client.get(path, headers=bearer(await make.token("eve", "repo:write")))).status_code == 404
    assert (await client.delete(path, headers=ana)).status_code == 204
    assert (await client.get(path, headers=ana)).json()["declaration"] is None
    async with db.session() as s:
        rows = (await s.execute(select(AuditEvent.action).order_by(AuditEvent.id))).all()
        actions = [a for (a,) in rows if a.startswith("repo.environment")]
    assert actions == ["repo.environment.set", "repo.environment.clear"]


async def test_instance_admins_register_the_images_an_environment_may_name(
    client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    await make.user("root", admin=True)
    await make.user("ana")
    root = bearer(await make.token("root", "admin"))
    ana = bearer(await make.token("ana", "repo:write"))
    await client.post("/api/v1/user/repos", json={"name": "app"}, headers=ana)
    images = "/api/v1/admin/environment-images"
    declared = {"declaration": "image: rust-toolchain:1.83\nsetup: cargo --version\n"}
    r = await client.put("/api/v1/repos/ana/app/environment", json=declared, headers=ana)
    assert r.status_code == 422 and "rust-toolchain:1.83" in r.json()["detail"]  # not registered yet
    r = await client.post(images, json={"reference": "rust-toolchain:1.83", "note": "Rust 1.83"}, headers=root)
    assert r.status_code == 201 and r.json()["reference"] == "rust-toolchain:1.83", r.text
    assert r.json()["added_by"] == "root"
    assert (await client.put("/api/v1/repos/ana/app/environment", json=declared, headers=ana)).status_code == 200
    assert (await client.post(images, json={"reference": "rust-toolchain:1.83"}, headers=root)).status_code == 409
    for bad in ("Rust:1", "x y", "../etc", "a:"):
        r = await client.post(images, json={"reference": bad}, headers=root)
        assert r.status_code == 422 and r.json()["code"] == "invalid_environment_image", bad
    r = await client.post(images, json={"reference": "nul:1", "note": "a\x00b"}, headers=root)
    assert r.status_code == 422 and r.json()["code"] == "invalid_characters", r.text
    assert (await client.post(images, json={"reference": "other:1"}, headers=ana)).status_code == 403
    assert (await client.get(images, headers=ana)).status_code == 403
    [row] = (await client.get(images, headers=root)).json()
    assert (await client.delete(f"{images}/{row['id']}", headers=root)).status_code == 204
    assert (await client.get(images, headers=root)).json() == []
    async with db.session() as s:
        rows = (await s.execute(select(AuditEvent.action).order_by(AuditEvent.id))).all()
    assert [a for (a,) in rows if a.startswith("instance.environment_image")] == [
        "instance.environment_image.add", "instance.environment_image.remove",
    ]  # fmt: skip
