"""A refused form comes back as it was typed, with the refusal beside the field it concerns
(aria-describedby, aria-invalid, the first such field focused), on every form that can be refused:
the repository's task settings, the task start form, webhook create and edit, a new repository."""

from typing import Any

from litestar.testing import AsyncTestClient

from forge.core.settings import Settings
from forge.db.engine import Database
from tests.support.accounts import Accounts
from tests.support.forms import Form, read_form
from tests.support.task_world import build_task_world
from tests.support.web import csrf_from, sign_in

SETTINGS = "/ana/app/settings/tasks/"


async def signed_in_with_repo(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("ana")
    token = await make.token("ana", "repo:write")
    await client.post("/api/v1/user/repos", json={"name": "app"}, headers={"Authorization": f"Bearer {token}"})
    assert (await sign_in(client, "ana", "correct horse battery")).status_code in (302, 303)


def assert_refused_at(form: Form, control: str, *words: str) -> None:
    field = form[control]
    assert field.attrs.get("aria-invalid") == "true", field.attrs
    assert "autofocus" in field.attrs, "the refused field is focused"
    message = form.error_of(control)
    assert message and all(w in message for w in words), message
    invalid = [k for k, e in form.by_id.items() if e.attrs.get("aria-invalid") == "true"]
    assert invalid == [control], invalid


async def test_task_settings_keep_every_typed_value_and_place_the_error(
    client: AsyncTestClient[Any], make: Accounts
) -> None:
    await signed_in_with_repo(client, make)
    page = await client.get(SETTINGS)
    token = csrf_from(page.text[page.text.index('id="task-settings"') :])
    typed = {
        "csrf_token": token,
        "required_approvals": "2",
        "approval_not_by_starter": "1",
        "model_name": "local-model",
        "model_api_key": "sk-typed-secret",
        "turn_limit": "40",
        "subtask_runtimes": "codex",
        "egress_mode": "allow-list",
        "egress_rules": "pypi.org\r\nhttps://bad rule\r\nGET http://mirror.example/debian/",
        "egress_preset_pypi": "1",
        "egress_preset_debian": "1",
        "max_subtasks": "3",
    }
    r = await client.post(SETTINGS, data=typed)
    assert r.status_code == 422, r.text
    form = read_form(r.text)
    assert form.value("egress_mode") == "allow-list"
    assert form.value("egress_rules") == "pypi.org\nhttps://bad rule\nGET http://mirror.example/debian/"
    assert {
        ("egress_preset_pypi", "1"),
        ("egress_preset_debian", "1"),
        ("approval_not_by_starter", "1"),
    } <= form.checked
    assert ("egress_preset_npm", "1") not in form.checked
    assert [
        form.value(f) for f in ("required_approvals", "model_name", "turn_limit", "subtask_runtimes", "max_subtasks")
    ] == [
        "2",
        "local-model",
        "40",
        "codex",
        "3",
    ]
    assert_refused_at(form, "egress_rules", "'https://bad rule'", "a space after 'https://bad'", "expected host[:port]")
    assert "sk-typed-secret" not in r.text  # a key is never echoed back
    assert "The key you typed was not saved" in form["model_api_key-hint"].text
    assert form["form-error"].attrs.get("role") == "alert"

    # A bad number is placed at its own field.
    r = await client.post(SETTINGS, data={**typed, "egress_rules": "pypi.org", "max_subtasks": "500"})
    assert r.status_code == 422
    assert_refused_at(read_form(r.text), "max_subtasks", "<= 100")

    # Corrected, the rest as typed: saved, and shown as stored.
    r = await client.post(SETTINGS, data={**typed, "egress_rules": "pypi.org\r\nGET http://mirror.example/debian/"})
    assert r.status_code == 200 and "Saved." in r.text, r.text
    saved = read_form(r.text)
    assert saved.value("egress_rules") == "pypi.org\nGET http://mirror.example/debian/"
    assert saved.value("egress_mode") == "allow-list" and saved.value("turn_limit") == "40"
    assert not any(e.attrs.get("aria-invalid") for e in saved.by_id.values())


async def test_task_settings_place_an_endpoint_refusal_at_its_url(client: AsyncTestClient[Any], make: Accounts) -> None:
    await signed_in_with_repo(client, make)
    token = csrf_from((await client.get(SETTINGS)).text)
    r = await client.post(
        SETTINGS, data={"csrf_token": token, "anthropic_base_url": "ftp://x.example", "model_name": "m"}
    )
    assert r.status_code == 422
    form = read_form(r.text)
    assert_refused_at(form, "anthropic_base_url", "http(s) URL")
    assert form.value("anthropic_base_url") == "ftp://x.example" and form.value("model_name") == "m"


async def test_a_refused_start_keeps_the_form_and_names_the_field(
    client: AsyncTestClient[Any], db: Database, settings: Settings
) -> None:
    world = await build_task_world(db, settings)
    page = (await client.get("/ana/demo/tasks/", headers=world.h("ana"))).text
    typed = {
        "goal": "Greet\r\nthe world",
        "agent": "fixer",
        "runtime": "command",
        "command": "echo one\r\necho two",
        "base": "no-such-branch",
        "title": "",
        "csrf_token": csrf_from(page),
    }
    r = await client.post("/ana/demo/tasks/", data=typed, headers=world.h("ana"))
    assert r.status_code == 422, r.text
    form = read_form(r.text)
    assert_refused_at(form, "base", "'no-such-branch' does not exist")
    assert form.value("goal") == "Greet\nthe world" and form.value("command") == "echo one\necho two"
    assert form.value("agent") == "fixer" and form.value("base") == "no-such-branch"
    assert "Not started" in form["start-error"].text

    r = await client.post("/ana/demo/tasks/", data={**typed, "base": "", "command": ""}, headers=world.h("ana"))
    assert r.status_code == 422
    assert_refused_at(read_form(r.text), "command", "needs a command")


async def test_a_refused_new_repository_keeps_the_form(client: AsyncTestClient[Any], make: Accounts) -> None:
    await signed_in_with_repo(client, make)  # ana/app exists
    page = await client.get("/repos/new")
    assert ("auto_init", "1") in read_form(page.text).checked  # a README by default
    typed = {
        "name": "app",
        "description": "the same name",
        "visibility": "internal",
        "csrf_token": csrf_from(page.text),
    }
    r = await client.post("/repos/new", data=typed)
    assert r.status_code == 409, r.text
    form = read_form(r.text)
    assert_refused_at(form, "name", "already exists")
    assert form.value("description") == "the same name" and form.value("visibility") == "internal"
    assert ("auto_init", "1") not in form.checked  # unticked, as sent
