"""A refused form comes back as it was typed, with the refusal beside the field it concerns
(aria-describedby, aria-invalid, the first such field focused), and nothing saved, on every form
that can be refused: the repository's task settings, the task start form, webhook create and edit,
a new repository, Admin's new account, the repository's General settings, collaborators and branch
rules, the review page's forms (review, inline comment, merge), the task page's message, answer
and approval decision, a new token and a personal model key."""

from typing import Any

from litestar.testing import AsyncTestClient
from sqlalchemy import select

from forge.core.settings import Settings
from forge.db.engine import Database
from forge.db.models import Account, AuditEvent
from tasks.core.models import Task
from tests.support.accounts import PASSWORD, Accounts
from tests.support.forms import Form, read_form
from tests.support.task_world import TASKS, agent_commits, build_task_world
from tests.support.transcripts import ask, park
from tests.support.web import csrf_from, sign_in

SETTINGS = "/ana/app/settings/tasks/"


async def signed_in_with_repo(client: AsyncTestClient[Any], make: Accounts, *, auto_init: bool = False) -> str:
    """ana, signed in, with ana/app; returns her repo:write token."""
    await make.user("ana")
    token = await make.token("ana", "repo:write")
    r = await client.post(
        "/api/v1/user/repos", json={"name": "app", "auto_init": auto_init}, headers={"Authorization": f"Bearer {token}"}
    )
    assert r.status_code == 201, r.text
    assert (await sign_in(client, "ana", "correct horse battery")).status_code in (302, 303)
    return token


async def audit_actions(db: Database) -> list[str]:
    async with db.session() as s:
        return list((await s.execute(select(AuditEvent.action).order_by(AuditEvent.id))).scalars())


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


async def test_a_refused_new_account_keeps_the_form(client: AsyncTestClient[Any], make: Accounts, db: Database) -> None:
    await make.user("root", admin=True)
    await sign_in(client, "root", PASSWORD)
    typed = {
        "login": "helper",
        "kind": "bot",
        "owner": "nobody",
        "csrf_token": csrf_from((await client.get("/admin/")).text),
    }
    r = await client.post("/admin/accounts", data=typed)
    assert r.status_code == 404, r.text
    form = read_form(r.text)
    assert_refused_at(form, "owner", "no account 'nobody'")
    assert form.value("login") == "helper" and form.value("kind") == "bot" and form.value("owner") == "nobody"
    assert "Not created" in form["new-account-error"].text

    r = await client.post("/admin/accounts", data={**typed, "kind": "user", "login": "root", "is_admin": "1"})
    assert r.status_code == 409
    form = read_form(r.text)
    assert_refused_at(form, "login", "the login 'root' is taken")
    assert form.value("kind") == "user" and ("is_admin", "1") in form.checked and form.value("owner") == "nobody"
    r = await client.post("/admin/accounts", data={**typed, "kind": "user", "login": "bad login!"})
    assert r.status_code == 422
    assert_refused_at(read_form(r.text), "login", "a login is 1-39 letters")
    async with db.session() as s:
        logins = set((await s.execute(select(Account.login))).scalars())
    assert logins == {"root"}, logins

    # An account's own forms: a bot's token, a person's password, each open again at its row.
    await make.bot("helper")
    await make.user("carol")
    token = {"name": " ", "scopes": ["repo:read", "tasks:write"], "csrf_token": typed["csrf_token"]}
    r = await client.post("/admin/accounts/helper/tokens", data=token)
    assert r.status_code == 422, r.text
    form = read_form(r.text)
    assert_refused_at(form, "token-name-helper", "a token name is 1-100 characters")
    assert {("scopes", "repo:read"), ("scopes", "tasks:write")} <= form.checked
    assert "new-account-error" not in form and "<details open><summary>New token" in r.text
    r = await client.post(
        "/admin/accounts/carol/password", data={"password": "short1", "csrf_token": token["csrf_token"]}
    )
    assert r.status_code == 422
    form = read_form(r.text)
    assert_refused_at(form, "reset-carol", "at least")
    assert "short1" not in r.text and form.value("reset-carol") == ""


async def test_refused_general_settings_keep_what_was_typed(client: AsyncTestClient[Any], make: Accounts) -> None:
    token = await signed_in_with_repo(client, make, auto_init=True)
    page = await client.get("/ana/app/settings/")
    assert read_form(page.text).value("default_branch") == "main"
    typed = {
        "description": "new words",
        "visibility": "sideways",
        "default_branch": "main",
        "archived": "1",
        "csrf_token": csrf_from(page.text),
    }
    r = await client.post("/ana/app/settings/", data=typed)
    assert r.status_code == 422, r.text
    form = read_form(r.text)
    assert_refused_at(form, "visibility", "visibility is private, internal or public")
    assert "Expected" not in r.text and "$." not in r.text  # the service's words, not the schema's
    assert form.value("description") == "new words" and ("archived", "1") in form.checked
    assert "Not saved" in form["general-error"].text

    r = await client.post("/ana/app/settings/", data={**typed, "visibility": "public", "default_branch": "nope"})
    assert r.status_code == 422
    form = read_form(r.text)
    assert_refused_at(form, "default_branch", "there is no branch 'nope'")
    assert [form.value(f) for f in ("description", "visibility", "default_branch")] == ["new words", "public", "nope"]
    stored = (await client.get("/api/v1/repos/ana/app", headers={"Authorization": f"Bearer {token}"})).json()
    assert stored["description"] == "" and stored["visibility"] == "private" and stored["archived"] is False

    r = await client.post("/ana/app/settings/", data={**typed, "visibility": "internal"})
    assert r.status_code == 200 and "saved" in r.text
    saved = read_form(r.text)
    assert saved.value("visibility") == "internal" and saved.value("description") == "new words"
    assert not any(e.attrs.get("aria-invalid") for e in saved.by_id.values())


async def test_a_refused_collaborator_keeps_the_form(client: AsyncTestClient[Any], make: Accounts) -> None:
    await signed_in_with_repo(client, make)
    typed = {"login": "nobody", "role": "admin", "csrf_token": csrf_from((await client.get("/ana/app/settings/")).text)}
    r = await client.post("/ana/app/settings/collaborators", data=typed)
    assert r.status_code == 404, r.text
    form = read_form(r.text)
    assert_refused_at(form, "collab-login", "no account 'nobody'")
    assert form.value("collab-login") == "nobody" and form.value("collab-role") == "admin"
    assert "Not saved" in form["collaborator-error"].text
    r = await client.post("/ana/app/settings/collaborators", data={**typed, "login": "ana"})
    assert r.status_code == 422
    form = read_form(r.text)
    assert_refused_at(form, "collab-login", "the owner is always an admin")
    assert "nobody" not in form["collaborators"].text and "admin (owner)" in form["collaborators"].text


async def test_a_refused_branch_rule_keeps_the_form(client: AsyncTestClient[Any], make: Accounts) -> None:
    token = await signed_in_with_repo(client, make)
    page = await client.get("/ana/app/settings/")
    blank = read_form(page.text)
    assert ("dismiss_stale_approvals", "1") in blank.checked and blank.value("required_approvals") == "0"
    assert ("require_pull_request", "1") not in blank.checked
    typed = {
        "pattern": "release/*",
        "allow_deletion": "1",
        "required_checks": "ci/build, lint",
        "require_pull_request": "1",
        "required_approvals": "11",
        "csrf_token": csrf_from(page.text),
    }
    r = await client.post("/ana/app/settings/rules", data=typed)
    assert r.status_code == 422, r.text
    form = read_form(r.text)
    assert_refused_at(form, "required_approvals", "from 0 to 10")
    assert [form.value(f) for f in ("pattern", "required_checks", "required_approvals")] == [
        "release/*",
        "ci/build, lint",
        "11",
    ]
    assert {("allow_deletion", "1"), ("require_pull_request", "1")} <= form.checked
    assert ("dismiss_stale_approvals", "1") not in form.checked  # unticked, as sent
    assert "Not saved" in form["rule-error"].text

    r = await client.post("/ana/app/settings/rules", data={**typed, "required_approvals": "two"})
    assert r.status_code == 422
    assert_refused_at(read_form(r.text), "required_approvals", "a whole number from 0 to 10")
    r = await client.post("/ana/app/settings/rules", data={**typed, "required_approvals": "1", "pattern": "a b"})
    assert r.status_code == 422
    assert_refused_at(read_form(r.text), "pattern", "without spaces")
    rules = await client.get("/api/v1/repos/ana/app/branch-rules", headers={"Authorization": f"Bearer {token}"})
    assert rules.json() == []


async def test_the_branch_rule_form_stores_what_it_asks_of_pull_requests(
    client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    token = await signed_in_with_repo(client, make)
    page = await client.get("/ana/app/settings/")
    rule = {
        "pattern": "main",
        "require_pull_request": "1",
        "required_approvals": "2",
        "csrf_token": csrf_from(page.text),
    }  # "dismiss_stale_approvals" unticked
    r = await client.post("/ana/app/settings/rules", data=rule)
    assert r.status_code == 200 and "saved" in r.text, r.text
    assert "pull request required, 2 approvals, approvals kept when the head moves" in r.text
    after = read_form(r.text)  # a blank form again, with its defaults
    assert after.value("pattern") == "" and ("dismiss_stale_approvals", "1") in after.checked
    [stored] = (
        await client.get("/api/v1/repos/ana/app/branch-rules", headers={"Authorization": f"Bearer {token}"})
    ).json()
    assert (stored["pattern"], stored["require_pull_request"], stored["required_approvals"]) == ("main", True, 2)
    assert stored["dismiss_stale_approvals"] is False
    async with db.session() as s:
        row = (await s.execute(select(AuditEvent).where(AuditEvent.action == "repo.branch_rule.set"))).scalar_one()
    assert row.target == "ana/app" and row.actor_login == "ana"
    assert row.detail["require_pull_request"] is True and row.detail["required_approvals"] == 2
    assert row.detail["dismiss_stale_approvals"] is False


async def test_refused_review_forms_keep_what_was_typed(
    client: AsyncTestClient[Any], db: Database, settings: Settings
) -> None:
    world = await build_task_world(db, settings)
    body = {"goal": "greet", "agent": "fixer", "command": "true", "title": "Greet"}
    assert (await client.post(TASKS, json=body, headers=world.h("ana"))).status_code == 201
    head = await agent_commits(db, settings, 1, {"hello.txt": b"hello\n"}, "greet")
    assert (await sign_in(client, "wendy", "correct horse battery")).status_code in (302, 303)
    page = "/ana/demo/tasks/1/review"
    token = csrf_from((await client.get(page)).text)

    # The review: nothing to say for a change request is refused at its text, the verdict kept.
    typed = {"verdict": "request_changes", "body": "  ", "commit_sha": head, "csrf_token": token}
    r = await client.post("/ana/demo/tasks/1/reviews", data=typed)
    assert r.status_code == 422, r.text
    form = read_form(r.text)
    assert_refused_at(form, "review-body", "say something")
    assert ("verdict", "request_changes") in form.checked and "Not submitted" in form["review-error"].text
    # On a head that moved, the text stays; the verdict is chosen again on the new changes.
    stale = {**typed, "verdict": "approve", "body": "Looks right.", "commit_sha": "0" * 40}
    r = await client.post("/ana/demo/tasks/1/reviews", data=stale)
    assert r.status_code == 409
    form = read_form(r.text)
    assert form.value("review-body") == "Looks right." and ("verdict", "comment") in form.checked
    assert "the task's head is" in form["review-error"].text

    # An inline comment comes back in its own line's form, open, with the reason at it.
    line = {"verdict": "comment", "path": "hello.txt", "side": "head", "line": "1", "mode": "draft"}
    r = await client.post("/ana/demo/tasks/1/reviews", data={**line, "comment": "x" * 20_001, "csrf_token": token})
    assert r.status_code == 422, r.text
    form = read_form(r.text)
    assert_refused_at(form, "inline-comment", "length <= 20000")
    assert form.value("inline-comment") == "x" * 20_001 and "Not added" in form["review-error"].text
    assert 'class="add-comment" open' in r.text

    # The merge form keeps its strategy; the reason is the merge rules' (no approval yet).
    merge = {"strategy": "squash", "expected_head_sha": head, "csrf_token": token}
    r = await client.post("/ana/demo/tasks/1/merge", data=merge)
    assert r.status_code == 409, r.text
    form = read_form(r.text)
    assert "approval(s) of the current head needed" in form["review-error"].text
    assert form["review-error"].attrs.get("role") == "alert" and '<option value="squash" selected>' in r.text
    reviews = await client.get(f"{TASKS}/1/reviews", headers=world.h("wendy"))
    draft = await client.get(f"{TASKS}/1/review-draft", headers=world.h("wendy"))
    assert reviews.json() == [] and draft.json() == {"comments": []}


async def test_a_refused_message_or_answer_keeps_the_text(
    client: AsyncTestClient[Any], db: Database, settings: Settings
) -> None:
    world = await build_task_world(db, settings)
    body = {"goal": "greet", "agent": "fixer", "command": "true", "title": "Greet"}
    assert (await client.post(TASKS, json=body, headers=world.h("ana"))).status_code == 201
    await agent_commits(db, settings, 1, {"hello.txt": b"hello\n"}, "greet")
    assert (await sign_in(client, "ana", "correct horse battery")).status_code in (302, 303)
    token = csrf_from((await client.get("/ana/demo/tasks/1")).text)
    before = await audit_actions(db)

    long = "line one\r\n" + "x" * 20_000
    r = await client.post("/ana/demo/tasks/1/messages", data={"body": long, "csrf_token": token})
    assert r.status_code == 422, r.text
    form = read_form(r.text)
    assert_refused_at(form, "body", "at most 20,000 characters")
    assert form.value("body") == long.replace("\r\n", "\n") and "Not sent" in form["act-error"].text
    r = await client.post("/ana/demo/tasks/1/messages", data={"body": " \r\n ", "csrf_token": token})
    assert r.status_code == 422
    assert_refused_at(read_form(r.text), "body", "the message is empty")
    # An answer with no question pending: the reason above, the text kept in the message form.
    r = await client.post("/ana/demo/tasks/1/answer", data={"body": "Use the blue one.", "csrf_token": token})
    assert r.status_code == 409, r.text
    form = read_form(r.text)
    assert "no pending question" in form["act-error"].text and form.value("body") == "Use the blue one."
    assert not any(e.attrs.get("aria-invalid") for e in form.by_id.values())

    assert await audit_actions(db) == before
    async with db.session() as s:
        task = (await s.execute(select(Task).where(Task.number == 1))).scalar_one()
    assert task.state == "awaiting_review" and not task.queued_message


async def test_a_refused_answer_or_decision_keeps_the_text(
    client: AsyncTestClient[Any], db: Database, settings: Settings
) -> None:
    world = await build_task_world(db, settings)
    body = {"goal": "greet", "agent": "fixer", "command": "true", "title": "Greet"}
    assert (await client.post(TASKS, json=body, headers=world.h("ana"))).status_code == 201
    await ask(db, 1)
    assert (await sign_in(client, "ana", "correct horse battery")).status_code in (302, 303)
    token = csrf_from((await client.get("/ana/demo/tasks/1")).text)
    r = await client.post("/ana/demo/tasks/1/answer", data={"body": "\t", "csrf_token": token})
    assert r.status_code == 422, r.text
    form = read_form(r.text)
    assert_refused_at(form, "body", "the answer is empty")
    assert "Or answer in your own words" in form["field-body"].text and form.value("body") == "\t"

    # A parked call: a decision on an input other than the one shown is refused, the reason kept.
    r = await client.post(
        "/ana/demo/tasks/1/answer", data={"body": "blue", "csrf_token": token}, follow_redirects=False
    )
    assert r.status_code == 303, r.text
    approval = await park(db, 1)
    before = await audit_actions(db)
    typed = {"decision": "deny", "reason": "not on main", "input_hash": "0" * 64, "csrf_token": token}
    r = await client.post(f"/ana/demo/tasks/1/approvals/{approval}", data=typed)
    assert r.status_code == 409, r.text
    form = read_form(r.text)
    assert "input_hash differs" in form["act-error"].text and form.value("approval-reason") == "not on main"
    assert await audit_actions(db) == before
    pending = await client.get(f"{TASKS}/1", headers=world.h("ana"))
    assert pending.json()["pending_approval"]["state"] == "pending"


async def test_a_refused_token_places_the_error_at_its_field(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("ana")
    await sign_in(client, "ana", PASSWORD)
    typed = {
        "name": "ci",
        "scopes": ["repo:read", "tasks:write"],
        "expires_days": "99999",
        "csrf_token": csrf_from((await client.get("/settings/tokens/")).text),
    }
    r = await client.post("/settings/tokens/", data=typed)
    assert r.status_code == 422, r.text
    form = read_form(r.text)
    assert_refused_at(form, "expires_days", "expiry is 1-3650 days")
    assert form.value("name") == "ci" and form.value("expires_days") == "99999"
    assert {("scopes", "repo:read"), ("scopes", "tasks:write")} <= form.checked
    assert "Not created" in form["token-error"].text

    r = await client.post("/settings/tokens/", data={**typed, "name": "", "expires_days": "30"})
    assert r.status_code == 422
    assert_refused_at(read_form(r.text), "name", "a token name is 1-100 characters")
    r = await client.post("/settings/tokens/", data={"name": "ci", "csrf_token": typed["csrf_token"]})
    assert r.status_code == 422
    form = read_form(r.text)
    assert "field-scopes-error" not in form and form.error_of("field-scopes")  # the fieldset's error
    assert "No tokens yet." in r.text


async def test_a_refused_model_key_places_the_error_at_its_field(client: AsyncTestClient[Any], make: Accounts) -> None:
    await make.user("ana")
    await sign_in(client, "ana", PASSWORD)
    typed = {
        "api_key": "sk-short",
        "base_url": "https://llm.example/v1",
        "model": "my model",
        "csrf_token": csrf_from((await client.get("/settings/model-keys/")).text),
    }
    r = await client.post("/settings/model-keys/openai", data={**typed, "api_key": "short"})
    assert r.status_code == 422, r.text
    form = read_form(r.text)
    assert_refused_at(form, "api_key_openai", "a model key is 8-4096 printable characters")
    assert "The key you typed was not saved" in form["api_key_openai-hint"].text
    assert form.value("base_url_openai") == "https://llm.example/v1" and form.value("model_openai") == "my model"

    r = await client.post("/settings/model-keys/openai", data={**typed, "api_key": "sk-long-enough-key"})
    assert r.status_code == 422
    form = read_form(r.text)
    assert_refused_at(form, "model_openai", "a model name is printable characters without spaces")
    assert "sk-long-enough-key" not in r.text  # a key is never echoed back
    assert form.value("base_url_openai") == "https://llm.example/v1"
    assert form.value("base_url_anthropic") == ""  # the other card is untouched

    r = await client.post(
        "/settings/model-keys/openai",
        data={**typed, "api_key": "sk-long-enough-key", "base_url": "ftp://x", "model": ""},
    )
    assert r.status_code == 422
    form = read_form(r.text)
    assert_refused_at(form, "base_url_openai", "http(s) URL")
    assert "Not saved" in form["model-key-openai-error"].text
    assert r.text.count("No key is set.") == 2
