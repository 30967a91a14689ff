"""Commit statuses over REST as a CI system reports them (GitHub's and Gitea's paths and shapes):
report, history, combined state, who may, what is refused, the audit row and the webhook."""

import json
from typing import Any

import msgspec
import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from forge.core.settings import Settings
from forge.db.engine import Database
from forge.db.models import AuditEvent
from forge.git import Identity
from forge.git.bare import write_commit
from forge.repos import statuses
from forge.repos.statuses import combine
from tests.support.accounts import PASSWORD, Accounts
from tests.support.web import sign_in
from webhooks.core.models import WebhookOutbox

API = "/api/v1/repos/ana/proj"


@pytest.fixture
def settings(settings: Settings) -> Settings:  # a notify endpoint on 127.0.0.1 (nothing listens)
    return msgspec.structs.replace(settings, webhooks_allowed_hosts="127.0.0.1")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def _project(client: AsyncTestClient[Any], make: Accounts) -> tuple[str, str, str, str]:
    """ana's private repository with two commits on main; tokens of ana (write), a reader, and CI's
    bot (a write collaborator). Returns (ana, reader, ci, the first commit's sha)."""
    await make.user("ana")
    await make.user("rita")
    await make.bot("ci")
    ana = await make.token("ana", "repo:write", "webhooks:admin")
    r = await client.post("/api/v1/user/repos", json={"name": "proj", "auto_init": True}, headers=bearer(ana))
    assert r.status_code == 201, r.text
    for login, role in (("rita", "read"), ("ci", "write")):
        r = await client.put(f"{API}/collaborators/{login}", json={"role": role}, headers=bearer(ana))
        assert r.status_code == 200, r.text
    first = await client.app.state.repo_store.write(
        ("ana", "proj"), write_commit, branch="main", files={"a.txt": "a\n"}, message="a",
        author=Identity(name="Ana", email="ana@example.org"),
    )  # fmt: skip
    await client.app.state.repo_store.write(
        ("ana", "proj"), write_commit, branch="main", files={"b.txt": "b\n"}, message="b",
        author=Identity(name="Ana", email="ana@example.org"),
    )  # fmt: skip
    return ana, await make.token("rita", "repo:read"), await make.token("ci", "repo:write"), str(first)


def test_the_combined_state_is_githubs_rule() -> None:
    assert combine([]) == "pending"
    assert combine(["success", "success"]) == "success"
    assert combine(["success", "pending"]) == "pending"
    assert combine(["pending", "error"]) == "failure"
    assert combine(["success", "failure"]) == "failure"


async def test_ci_reports_and_the_combined_status_reads_the_latest_of_each_context(
    client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    ana, reader, ci, first = await _project(client, make)
    hook = {"url": "http://127.0.0.1:9/hook", "kind": "notify", "events": ["status.created"]}
    assert (await client.post(f"{API}/hooks", json=hook, headers=bearer(ana))).status_code == 201
    head = (await client.get(f"{API}/branches", headers=bearer(ana))).json()[0]["sha"]
    empty = (await client.get(f"{API}/commits/main/status", headers=bearer(reader))).json()
    assert empty["state"] == "pending" and empty["total_count"] == 0 and empty["sha"] == head

    build = {"state": "pending", "context": "ci/build", "description": "queued", "target_url": "https://ci.example/1"}
    r = await client.post(f"{API}/statuses/{head}", json=build, headers=bearer(ci))
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["state"] == "pending" and made["context"] == "ci/build" and made["description"] == "queued"
    assert made["target_url"] == "https://ci.example/1" and made["creator"] == {"login": "ci", "type": "Bot"}
    assert made["url"].endswith(f"/api/v1/repos/ana/proj/statuses/{head}")
    # A branch name and an abbreviated id name the same commit; the context defaults to "default".
    r = await client.post(f"{API}/statuses/main", json={"state": "success"}, headers=bearer(ci))
    assert r.status_code == 201 and r.json()["context"] == "default", r.text
    r = await client.post(f"{API}/statuses/{head[:10]}", json={**build, "state": "success"}, headers=bearer(ci))
    assert r.status_code == 201, r.text

    combined = (await client.get(f"{API}/commits/{head}/status", headers=bearer(reader))).json()
    assert combined["state"] == "success" and combined["total_count"] == 2
    latest = [(s["context"], s["state"]) for s in combined["statuses"]]
    assert latest == [("ci/build", "success"), ("default", "success")]
    history = (await client.get(f"{API}/commits/main/statuses", headers=bearer(reader))).json()
    assert [(s["context"], s["state"]) for s in history] == [
        ("ci/build", "success"), ("default", "success"), ("ci/build", "pending"),
    ]  # fmt: skip
    assert (await client.get(f"{API}/statuses/{head}", headers=bearer(reader))).json() == history

    r = await client.post(f"{API}/statuses/{head}", json={"state": "error", "context": "lint"}, headers=bearer(ana))
    assert r.status_code == 201
    assert (await client.get(f"{API}/commits/{head}/status", headers=bearer(reader))).json()["state"] == "failure"
    # Another commit has statuses of its own.
    other = (await client.get(f"{API}/commits/{first}/status", headers=bearer(reader))).json()
    assert other["state"] == "pending" and other["statuses"] == [] and other["sha"] == first

    async with db.session() as s:
        audits = (await s.execute(select(AuditEvent).where(AuditEvent.action == "repo.status.create"))).scalars().all()
        rows = (await s.execute(select(WebhookOutbox).where(WebhookOutbox.event_type == "status.created"))).scalars()
        sent = [(json.loads(row.body), row.subject) for row in rows]
    bodies = [body for body, _ in sent]
    assert len(audits) == 4 and {a.target for a in audits} == {"ana/proj"}
    assert [(b["data"]["state"], b["data"]["combined"]) for b in bodies] == [
        ("pending", "pending"),
        ("success", "pending"),
        ("success", "success"),
        ("error", "failure"),
    ]  # fmt: skip  (the second: ci/build was still pending)
    assert bodies[0]["data"]["sha"] == head and bodies[0]["data"]["context"] == "ci/build"
    assert bodies[0]["meta"]["task"] is None and bodies[0]["meta"]["actor"] == {"login": "ci", "type": "Bot"}
    assert bodies[0]["meta"]["repository"] == "ana/proj"
    assert {subject for _, subject in sent} == {f"forgehand:repo:{bodies[0]['meta']['repository_uuid']}"}


async def test_who_may_report_and_read(client: AsyncTestClient[Any], make: Accounts) -> None:
    _ana, reader, ci, first = await _project(client, make)
    r = await client.post(f"{API}/statuses/{first}", json={"state": "success"}, headers=bearer(reader))
    assert r.status_code == 403, r.text  # read access reads, never reports
    read_only_ci = await make.token("ci", "repo:read")
    r = await client.post(f"{API}/statuses/{first}", json={"state": "success"}, headers=bearer(read_only_ci))
    assert r.status_code == 403 and r.json()["code"] == "insufficient_scope", r.text
    await make.user("olga")
    outsider = await make.token("olga", "repo:write")
    paths = (("POST", f"statuses/{first}"), ("GET", f"commits/{first}/status"), ("GET", f"statuses/{first}"))
    for method, path in paths:
        r = await client.request(method, f"{API}/{path}", json={"state": "success"}, headers=bearer(outsider))
        assert r.status_code == 404 and r.json()["code"] == "repo_not_found", (method, path, r.text)
    assert (await client.get(f"{API}/commits/{first}/status")).status_code == 404  # anonymous, private
    r = await client.post(f"{API}/statuses/{first}", json={"state": "success"}, headers=bearer(ci))
    assert r.status_code == 201


async def test_bad_reports_are_refused_with_a_code_that_names_the_fix(
    client: AsyncTestClient[Any], make: Accounts, monkeypatch: pytest.MonkeyPatch
) -> None:
    _ana, _reader, ci, first = await _project(client, make)
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("0" * 40, {"state": "success"}, "unknown_commit"),
        ("no-such-branch", {"state": "success"}, "unknown_commit"),
        (first, {"state": "green"}, "validation_failed"),
        (first, {"state": "success", "target_url": "javascript:alert(1)"}, "invalid_target_url"),
        (first, {"state": "success", "target_url": "ftp://ci.example/x"}, "invalid_target_url"),
        (first, {"state": "success", "target_url": "https://" + "x" * 2100}, "validation_failed"),
        (first, {"state": "success", "description": "d" * 1025}, "validation_failed"),
        (first, {"state": "success", "context": ""}, "validation_failed"),
        (first, {"state": "success", "context": "ci\nbuild"}, "validation_failed"),
        (first, {"state": "success", "extra": 1}, "validation_failed"),
    ]
    for sha, body, code in cases:
        r = await client.post(f"{API}/statuses/{sha}", json=body, headers=bearer(ci))
        assert r.status_code == 422 and r.json()["code"] == code, (sha, body, r.text)
    r = await client.get(f"{API}/commits/no-such-branch/status", headers=bearer(ci))
    assert r.status_code == 404 and r.json()["code"] == "ref_not_found"
    r = await client.get(f"{API}/commits/{first}/status", headers=bearer(ci))
    assert r.json()["total_count"] == 0  # nothing refused was recorded
    # A context's history is bounded (1000, as GitHub's; 3 here); other contexts still report.
    monkeypatch.setattr(statuses, "MAX_PER_CONTEXT", 3)
    for _ in range(3):
        assert (await client.post(f"{API}/statuses/{first}", json={"state": "pending"}, headers=bearer(ci))).is_success
    r = await client.post(f"{API}/statuses/{first}", json={"state": "success"}, headers=bearer(ci))
    assert r.status_code == 422 and r.json()["code"] == "too_many_statuses", r.text
    other = {"state": "success", "context": "ci/other"}
    r = await client.post(f"{API}/statuses/{first}", json=other, headers=bearer(ci))
    assert r.status_code == 201, r.text


async def test_the_commit_page_lists_each_contexts_latest_status(client: AsyncTestClient[Any], make: Accounts) -> None:
    _ana, _reader, ci, first = await _project(client, make)
    await sign_in(client, "rita", PASSWORD)  # a reader sees the checks
    page = await client.get(f"/ana/proj/commit/{first}")
    assert page.status_code == 200 and "Checks:" not in page.text  # none reported: no section
    for body in (
        {"state": "pending", "context": "ci/build"},
        {
            "state": "failure",
            "context": "ci/build",
            "description": "2 tests failed",
            "target_url": "https://ci.example/7",
        },
        {"state": "success", "context": "lint"},
    ):
        assert (await client.post(f"{API}/statuses/{first}", json=body, headers=bearer(ci))).status_code == 201
    html = (await client.get(f"/ana/proj/commit/{first}")).text
    section = html[html.index('id="checks-title"') :]
    section = section[: section.index("</section>")]
    assert "Checks: some failed" in section
    assert section.count("<li>") == 2  # the latest of each context, not the history
    assert "ci/build" in section and "2 tests failed" in section and 'href="https://ci.example/7"' in section
    assert ">failure<" in section and ">success<" in section and ">pending<" not in section


async def test_the_branches_page_shows_each_heads_combined_state(client: AsyncTestClient[Any], make: Accounts) -> None:
    _ana, _reader, ci, _first = await _project(client, make)
    await sign_in(client, "rita", PASSWORD)
    assert "checks:" not in (await client.get("/ana/proj/branches")).text  # none reported yet
    assert (await client.post(f"{API}/statuses/main", json={"state": "pending"}, headers=bearer(ci))).is_success
    html = (await client.get("/ana/proj/branches")).text
    row = html[html.index('id="branches"') :]
    assert ">checks: pending</a>" in row[: row.index("</tr>")]
