"""The repository's egress setting (REST and settings page) and the operator's egress settings:
off by default, every bad rule or preset refused with its own code and named, audited."""

from typing import Any

import msgspec
import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from forge.core.settings import Settings, SettingsError, load_settings
from forge.db.engine import Database
from forge.db.events import EventBus
from forge.db.models import AuditEvent
from forge.git import RepoStore
from tasks.core.egress_config import EgressSettings, plan
from tasks.system import TaskSystem
from tests.support.accounts import Accounts
from tests.support.web import csrf_from, sign_in

PATH = "/api/v1/repos/ana/app/task-settings"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_egress_is_off_until_an_admin_sets_an_allow_list(
    client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    await make.user("ana")
    await make.user("bob")
    ana = bearer(await make.token("ana", "repo:write"))
    await client.post("/api/v1/user/repos", json={"name": "app"}, headers=ana)
    await client.put("/api/v1/repos/ana/app/collaborators/bob", json={"role": "write"}, headers=ana)
    assert (await client.get(PATH, headers=ana)).json()["egress"] == {"mode": "off", "rules": [], "presets": []}

    egress = {
        "mode": "allow-list",
        "rules": ["pypi.org", " *.example.org:443 ", "GET http://mirror.example/debian/", "pypi.org"],
        "presets": ["NPM", "npm"],
    }
    r = await client.put(PATH, json={"egress": egress}, headers=ana)
    assert r.status_code == 200, r.text
    stored = {
        "mode": "allow-list",
        "rules": ["pypi.org", "*.example.org:443", "GET http://mirror.example/debian/"],
        "presets": ["npm"],
    }
    assert r.json()["egress"] == stored
    assert (await client.get(PATH, headers=ana)).json()["egress"] == stored
    async with db.session() as s:
        audit = (
            (await s.execute(select(AuditEvent).where(AuditEvent.action == "repo.task_settings.update")))
            .scalars()
            .all()
        )
        assert audit[-1].detail["egress"] == stored

    # A write collaborator may not open the network.
    bob = bearer(await make.token("bob", "repo:write"))
    assert (await client.put(PATH, json={"egress": egress}, headers=bob)).status_code == 403

    # Absent (like every other field of the PUT): back to off.
    r = await client.put(PATH, json={"turn_limit": 3}, headers=ana)
    assert r.json()["egress"]["mode"] == "off"


@pytest.mark.parametrize(
    ("egress", "status", "code", "named"),
    [
        ({"mode": "allow-list", "rules": ["GET https://pypi.org/simple/"]}, 422, "invalid_egress_rule", "plain http"),
        ({"mode": "allow-list", "rules": ["*.org"]}, 422, "invalid_egress_rule", "'*.org'"),
        ({"mode": "allow-list", "rules": ["pypi.org:99999"]}, 422, "invalid_egress_rule", "'pypi.org:99999'"),
        ({"mode": "allow-list", "presets": ["cargo"]}, 422, "invalid_egress_preset", "'cargo'"),
        ({"mode": "everything"}, 422, "validation_failed", "mode"),
        ({"mode": "allow-list", "rules": [""]}, 422, "validation_failed", "rules"),
        ({"mode": "allow-list", "rules": ["x.example"] * 201}, 422, "validation_failed", "rules"),
        ({"mode": "allow-list", "extra": 1}, 422, "validation_failed", "extra"),
    ],
)
async def test_bad_egress_settings_are_refused_with_a_stable_code(
    client: AsyncTestClient[Any], make: Accounts, egress: dict[str, Any], status: int, code: str, named: str
) -> None:
    await make.user("ana")
    ana = bearer(await make.token("ana", "repo:write"))
    await client.post("/api/v1/user/repos", json={"name": "app"}, headers=ana)
    r = await client.put(PATH, json={"egress": egress}, headers=ana)
    assert r.status_code == status, r.text
    assert r.json()["code"] == code and named in r.text, r.text
    assert (await client.get(PATH, headers=ana)).json()["egress"]["mode"] == "off"


async def test_the_settings_page_sets_egress(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("ana")
    ana = bearer(await make.token("ana", "repo:write"))
    await client.post("/api/v1/user/repos", json={"name": "app"}, headers=ana)
    assert (await sign_in(client, "ana", "correct horse battery")).status_code in (302, 303)
    page = await client.get("/ana/app/settings/tasks/")
    assert page.status_code == 200 and 'id="egress-settings"' in page.text
    assert "files.pythonhosted.org:443" in page.text  # the presets say what they allow
    token = csrf_from(page.text[page.text.index('id="task-settings"') :])
    form = {
        "csrf_token": token,
        "egress_mode": "allow-list",
        "egress_rules": "pypi.org\r\n\r\nGET http://mirror.example/debian/\r\n",
        "egress_preset_pypi": "1",
    }
    r = await client.post("/ana/app/settings/tasks/", data=form)
    assert r.status_code == 200 and "Saved." in r.text, r.text
    assert '<option value="allow-list" selected>' in r.text and "GET http://mirror.example/debian/" in r.text
    saved = (await client.get(PATH, headers=ana)).json()["egress"]
    assert saved == {
        "mode": "allow-list",
        "rules": ["pypi.org", "GET http://mirror.example/debian/"],
        "presets": ["pypi"],
    }
    r = await client.post("/ana/app/settings/tasks/", data={**form, "egress_rules": "GET https://x.example/"})
    assert r.status_code == 422 and 'role="alert"' in r.text and "plain http" in r.text
    assert (await client.get(PATH, headers=ana)).json()["egress"] == saved


def test_operator_settings_are_checked_at_start(settings: Settings, db: Database) -> None:
    for env, named in (
        ({"FORGEHAND_EGRESS_ALLOWED_HOSTS": "127.0.0.1, not a host"}, "FORGEHAND_EGRESS_ALLOWED_HOSTS: 'not a host'"),
        ({"FORGEHAND_EGRESS_PRESETS": "pypi,cargo"}, "FORGEHAND_EGRESS_PRESETS: 'cargo'"),
    ):
        bad = load_settings(environ=env, data_dir=settings.data_dir, database_url=settings.database_url)
        with pytest.raises(SettingsError, match=named):
            TaskSystem(db, bad, RepoStore(settings.data_dir / "repos"), EventBus())


def test_operator_presets_apply_to_every_allow_list(settings: Settings) -> None:
    operator = msgspec.structs.replace(settings, egress_presets="debian", egress_allowed_hosts="10.0.0.0/8")
    assert plan(EgressSettings(mode="off", presets=["pypi"]), operator) is None
    run = plan(EgressSettings(mode="allow-list", rules=["x.example"], presets=["pypi", "debian"]), operator)
    assert run is not None
    assert run.presets == ("debian", "pypi") and run.repo_rules == ("x.example",)
    assert run.rules.allows_connect("deb.debian.org", 443) and run.rules.allows_connect("pypi.org", 443)
    assert run.allowed_hosts and not run.rules.allows_connect("registry.npmjs.org", 443)


async def test_the_settings_page_declares_removes_and_rebuilds_the_environment(
    client: AsyncTestClient[Any], make: Accounts
) -> None:
    await make.user("ana")
    ana = bearer(await make.token("ana", "repo:write"))
    await client.post("/api/v1/user/repos", json={"name": "app"}, headers=ana)
    assert (await sign_in(client, "ana", "correct horse battery")).status_code in (302, 303)
    page = await client.get("/ana/app/settings/tasks/")
    token = csrf_from(page.text[page.text.index('id="environment-settings"') :])
    url = "/ana/app/settings/tasks/environment"
    declared = "image: sandbox\r\nsetup: echo ready\r\n"
    r = await client.post(url, data={"csrf_token": token, "action": "save", "declaration": declared})
    assert r.status_code == 200 and "Environment saved." in r.text, r.text
    env = "/api/v1/repos/ana/app/environment"
    assert (await client.get(env, headers=ana)).json()["declaration"] == "image: sandbox\nsetup: echo ready\n"
    typed = "image: sandbox\nmounts: [/]\n"
    r = await client.post(url, data={"csrf_token": token, "action": "save", "declaration": typed})
    assert r.status_code == 422 and 'role="alert"' in r.text and "`mounts`" in r.text
    assert "mounts: [/]" in r.text  # what was typed is kept
    r = await client.post(url, data={"csrf_token": token, "action": "rebuild"})
    assert "generation 1" in r.text
    r = await client.post(url, data={"csrf_token": token, "action": "remove"})
    assert "the repository&#39;s file applies" in r.text or "the repository's file applies" in r.text
    assert (await client.get(env, headers=ana)).json() == {"declaration": None, "generation": 1}
