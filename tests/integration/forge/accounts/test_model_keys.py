"""Personal model keys (`/api/v1/user/model-keys/{provider}`): write-only, encrypted, audited, each
person's own; and which key pays for a run's model calls (`model_access`)."""

from typing import Any

from litestar.testing import AsyncTestClient
from sqlalchemy import select

from forge.core.settings import Settings
from forge.db.engine import Database
from forge.db.models import Account, AuditEvent, ModelKey, Repository
from tasks.core.models import RepoTaskSettings
from tasks.core.repo_settings import model_access, secret_box
from tests.support.accounts import PASSWORD, Accounts
from tests.support.web import csrf_from, sign_in

KEY = "sk-ant-personal-0123456789-WXYZ"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def session_headers(client: AsyncTestClient[Any], login: str) -> dict[str, str]:
    """A browser session for `login` on `client` (its cookie) and the CSRF header REST calls need."""
    assert (await sign_in(client, login, PASSWORD)).status_code in (302, 303)
    return {"X-CSRF-Token": csrf_from((await client.get("/settings/model-keys/")).text)}


async def test_personal_keys_are_write_only_audited_and_private(
    client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    await make.user("ana")
    await make.user("bob")
    bob = bearer(await make.token("bob", "repo:read"))
    path = "/api/v1/user/model-keys/anthropic"
    ana = await session_headers(client, "ana")
    r = await client.get(path, headers=ana)
    assert r.status_code == 200 and r.json()["configured"] is False
    r = await client.put(path, json={"api_key": KEY, "base_url": "https://llm.example/"}, headers=ana)
    assert r.status_code == 200, r.text
    assert r.json()["configured"] is True and r.json()["last4"] == "WXYZ" and KEY not in r.text
    listed = await client.get("/api/v1/user/model-keys", headers=ana)
    assert {k["provider"]: k["configured"] for k in listed.json()} == {"anthropic": True, "openai": False}
    assert KEY not in listed.text
    # Another person sees only their own (nothing).
    theirs = await client.get(path, headers=bob)
    assert theirs.json()["configured"] is False and "WXYZ" not in theirs.text
    async with db.session() as s:
        row = (await s.execute(select(ModelKey))).scalar_one()
        assert KEY not in row.api_key_enc
        actions = [a.action for a in (await s.execute(select(AuditEvent))).scalars()]
        assert "user.model_key.set" in actions
        assert all(KEY not in str(a.detail) for a in (await s.execute(select(AuditEvent))).scalars())
    r = await client.delete(path, headers=ana)
    assert r.status_code == 200 and r.json()["configured"] is False
    assert (await client.get(path, headers=ana)).json()["configured"] is False


async def test_a_token_cannot_set_or_remove_its_owners_key(
    client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    """A leaked token (any scope) must not point its owner's key at the thief's endpoint, nor remove it."""
    await make.user("ana")
    ana = await session_headers(client, "ana")
    path = "/api/v1/user/model-keys/anthropic"
    assert (await client.put(path, json={"api_key": KEY}, headers=ana)).status_code == 200
    for scopes in (("repo:read",), ("repo:write", "tasks:write", "reviews:write")):
        token = bearer(await make.token("ana", *scopes))
        r = await client.put(
            path, json={"api_key": "sk-thief-0000000000", "base_url": "https://evil.example/"}, headers=token
        )
        assert r.status_code == 403, r.text
        r = await client.delete(path, headers=token)
        assert r.status_code == 403, r.text
    async with db.session() as s:
        row = (await s.execute(select(ModelKey))).scalar_one()
        assert row.base_url is None and row.last4 == "WXYZ"


async def test_bad_provider_key_and_url_get_4xx_with_a_code(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("ana")
    await make.user("bob")
    bob = await session_headers(client, "bob")
    assert (await client.delete("/api/v1/user/model-keys/openai", headers=bob)).json()["code"] == "model_key_not_found"
    ana = bearer(await make.token("ana", "repo:read"))
    r = await client.get("/api/v1/user/model-keys/gemini", headers=ana)
    assert r.status_code == 404 and r.json()["code"] == "unknown_model_provider"
    r = await client.put("/api/v1/user/model-keys/gemini", json={"api_key": KEY}, headers=bob)
    assert r.status_code == 404 and r.json()["code"] == "unknown_model_provider"
    r = await client.put("/api/v1/user/model-keys/openai", json={"api_key": "short"}, headers=bob)
    assert r.status_code == 422 and r.json()["code"] == "invalid_model_key"
    r = await client.put("/api/v1/user/model-keys/openai", json={"api_key": KEY, "base_url": "ftp://x"}, headers=bob)
    assert r.status_code == 422 and r.json()["code"] == "invalid_model_url"
    r = await client.put("/api/v1/user/model-keys/openai", json={"api_key": KEY, "colour": 1}, headers=bob)
    assert r.status_code == 400 or r.status_code == 422
    client.cookies.clear()
    assert (await client.get("/api/v1/user/model-keys")).status_code == 401


async def test_which_key_pays(client: AsyncTestClient[Any], make: Accounts, db: Database, settings: Settings) -> None:
    await make.user("ana")
    ana = bearer(await make.token("ana", "repo:write"))
    assert (await client.post("/api/v1/user/repos", json={"name": "demo"}, headers=ana)).status_code == 201
    s = settings.__class__(
        **{
            **{f: getattr(settings, f) for f in settings.__struct_fields__},
            "model_base_url": "https://instance.example/v1",
            "model_name": "inst-model",
            "model_api_key": "sk-instance-openai",
            "anthropic_api_key": "sk-instance-anthropic",
            "anthropic_model": "claude-inst",
        }
    )
    async with db.session() as session:
        repo_id = (await session.execute(select(Repository.id))).scalar_one()
        ana_id = (await session.execute(select(Account.id).where(Account.login == "ana"))).scalar_one()
        access = await model_access(session, s, repo_id, ana_id)
    assert access["openai"].source == "instance" and access["openai"].api_key == "sk-instance-openai"
    assert access["anthropic"].source == "instance" and access["anthropic"].model == "claude-inst"
    assert access["anthropic"].base_url == "https://api.anthropic.com"
    assert access["openai"].trusted and access["anthropic"].trusted  # the operator's own endpoints
    # The person has a key, but the repository does not allow personal keys: still the instance's.
    put = await client.put(
        "/api/v1/user/model-keys/anthropic", json={"api_key": KEY}, headers=await session_headers(client, "ana")
    )
    assert put.status_code == 200, put.text
    # The repository sets its own Anthropic key: the repository's pays.
    r = await client.put(
        "/api/v1/repos/ana/demo/task-settings",
        json={"anthropic_api_key": "sk-repo-anthropic-key", "anthropic_base_url": "https://repo.example"},
        headers=ana,
    )
    assert r.status_code == 200, r.text
    assert r.json()["anthropic_api_key_set"] is True and "sk-repo-anthropic-key" not in r.text
    async with db.session() as session:
        access = await model_access(session, s, repo_id, ana_id)
        row = await session.get(RepoTaskSettings, repo_id)
        assert row is not None and row.anthropic_api_key_enc
        assert secret_box(s).decrypt(row.anthropic_api_key_enc) == "sk-repo-anthropic-key"
    assert access["anthropic"].source == "repository" and access["anthropic"].api_key == "sk-repo-anthropic-key"
    assert access["anthropic"].base_url == "https://repo.example"
    assert not access["anthropic"].trusted  # a repository's endpoint: the gateway's URL guard checks it
    assert access["openai"].source == "instance"
    # Allowed now: the starter's personal key pays, towards the instance's endpoint (never the repository's).
    r = await client.put(
        "/api/v1/repos/ana/demo/task-settings",
        json={"allow_personal_keys": True, "anthropic_base_url": "https://repo.example"},
        headers=ana,
    )
    assert r.status_code == 200 and r.json()["allow_personal_keys"] is True
    async with db.session() as session:
        access = await model_access(session, s, repo_id, ana_id)
        nobody = await model_access(session, s, repo_id, None)
    assert access["anthropic"].source == "personal" and access["anthropic"].api_key == KEY
    assert access["anthropic"].base_url == "https://api.anthropic.com" and access["anthropic"].trusted
    assert access["openai"].source == "instance"  # no personal OpenAI key
    assert nobody["anthropic"].source == "repository"
    # A repository endpoint without a key of its own never receives the instance's key.
    r = await client.put(
        "/api/v1/repos/ana/demo/task-settings", json={"model_base_url": "https://repo-llm.example/v1"}, headers=ana
    )
    async with db.session() as session:
        access = await model_access(session, s, repo_id, None)
    assert access["openai"].source == "repository" and access["openai"].api_key == ""
    assert not access["openai"].trusted


async def test_the_model_access_page_sets_and_removes_a_key(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("ana")
    await sign_in(client, "ana", PASSWORD)
    assert 'href="/settings/model-keys/"' in (await client.get("/settings/tokens/")).text
    page = await client.get("/settings/model-keys/")
    assert page.status_code == 200 and "No key is set." in page.text
    token = csrf_from(page.text)
    r = await client.post("/settings/model-keys/openai", data={"api_key": KEY, "csrf_token": token})
    assert r.status_code in (200, 303)
    page = await client.get("/settings/model-keys/")
    assert "ending in <code>WXYZ</code>" in page.text and KEY not in page.text
    bad = await client.post("/settings/model-keys/openai", data={"api_key": "x", "csrf_token": token})
    assert bad.status_code == 422 and "printable" in bad.text
    r = await client.post("/settings/model-keys/openai/remove", data={"csrf_token": token})
    assert r.status_code in (200, 303)
    assert "ending in" not in (await client.get("/settings/model-keys/")).text


async def test_an_overlong_or_mistyped_base_url_is_422_not_500(client: AsyncTestClient[Any], make: Accounts) -> None:
    """A body error on `base_url` was a 500: the field shared its name with an app dependency."""
    await make.user("ana")
    ana = await session_headers(client, "ana")
    path = "/api/v1/user/model-keys/anthropic"
    for base_url in ("https://llm.example/" + "x" * 481, "https://llm.example/" + "x" * 5000, 5, ["x"]):
        r = await client.put(path, json={"api_key": KEY, "base_url": base_url}, headers=ana)
        assert r.status_code == 422, r.text
        assert r.json()["code"] == "validation_failed" and r.json()["errors"][0]["key"] == "base_url"
    r = await client.put(path, json={"api_key": KEY, "base_url": "https://llm.example/" + "x" * 480}, headers=ana)
    assert r.status_code == 200 and len(r.json()["base_url"]) == 500
