"""Egress through a real task: the repository's setting turns the proxy on for its runs; the
run's command reaches an allowed host through HTTP_PROXY, a refusal is a transcript event and a
delivered `egress.blocked` notification, and the counts show on the run and the task page. With
the setting off, the sandbox has no proxy and reaches nothing."""

import json
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest

from forge.core.settings import Settings
from tests.support.accounts import LiveServer, make_account_with_token, run_sync
from tests.support.egress import origin_server
from tests.support.waiting import until_sync
from tests.support.webhooks import Receiver, receiver


@pytest.fixture
def settings(settings: Settings, sandbox_image: str) -> Settings:
    # The worker and the deliverer run in the server; loopback stands in for a package index
    # (the operator's egress allow-list) and for the notification consumer.
    return msgspec.structs.replace(
        settings, run_worker=True, webhooks_allowed_hosts="127.0.0.1", egress_allowed_hosts="127.0.0.1"
    )


@pytest.fixture
def consumer() -> Iterator[Receiver]:
    with receiver() as r:
        yield r


def wait_task(api: httpx.Client, number: int, *states: str) -> dict[str, Any]:
    body: dict[str, Any] = {}

    def there() -> bool:
        nonlocal body
        body = api.get(f"/api/v1/repos/ana/app/tasks/{number}").json()
        return body["state"] in states

    until_sync(there, timeout=120, what=f"task {number} to be {' or '.join(states)}", show=lambda: body)
    return body


def file_at(api: httpx.Client, branch: str, path: str) -> str:
    r = api.get(f"/api/v1/repos/ana/app/contents/{path}", params={"ref": branch})
    assert r.status_code == 200, r.text
    return str(r.json()["text"])


COMMAND = (
    "env | grep -i _proxy= | sort > proxy-env.txt; "
    "curl -sS --max-time 20 -o got.txt http://127.0.0.1:{port}/file; "
    "curl -sS --max-time 20 -o /dev/null -w '%{{http_code}}' http://example.com/ > refused.txt; "
    "true"
)


def test_a_task_reaches_only_what_its_repository_allows(live_server: LiveServer, consumer: Receiver) -> None:
    token = run_sync(
        make_account_with_token(live_server.settings, "ana", "repo:write", "tasks:write", "webhooks:admin")
    )
    api = httpx.Client(base_url=live_server.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert api.post("/api/v1/user/repos", json={"name": "app", "auto_init": True}).status_code == 201
    admin = run_sync(make_account_with_token(live_server.settings, "root-admin", "admin", admin=True))
    bots = httpx.post(
        f"{live_server.url}/api/v1/admin/bots", json={"login": "fixer"}, headers={"Authorization": f"Bearer {admin}"}
    )
    assert bots.status_code == 201
    assert api.put("/api/v1/repos/ana/app/collaborators/fixer", json={"role": "write"}).status_code == 200
    hook = api.post(
        "/api/v1/repos/ana/app/hooks", json={"url": consumer.url, "kind": "notify", "events": ["egress.blocked"]}
    )
    assert hook.status_code == 201, hook.text

    with origin_server({"/file": b"from the index\n"}) as index:
        egress = {"mode": "allow-list", "rules": [f"127.0.0.1:{index.port}"], "presets": ["pypi"]}
        put = api.put("/api/v1/repos/ana/app/task-settings", json={"egress": egress})
        assert put.status_code == 200, put.text
        assert put.json()["egress"] == egress
        started = api.post(
            "/api/v1/repos/ana/app/tasks",
            json={"goal": "fetch", "agent": "fixer", "runtime": "command", "command": COMMAND.format(port=index.port)},
        )
        assert started.status_code == 201, started.text
        task = wait_task(api, 1, "awaiting_review", "failed")
    assert task["state"] == "awaiting_review", task
    branch = task["branch"]
    assert file_at(api, branch, "got.txt") == "from the index\n"
    assert file_at(api, branch, "refused.txt") == "403"
    proxy = "http://127.0.0.1:3128"
    assert file_at(api, branch, "proxy-env.txt").splitlines() == [
        f"HTTPS_PROXY={proxy}",
        f"HTTP_PROXY={proxy}",
        "NO_PROXY=",
        f"http_proxy={proxy}",
        f"https_proxy={proxy}",
        "no_proxy=",
    ]
    assert [r for _, r, _ in index.requests] == ["/file"]
    assert task["egress"] == {"allowed": 1, "blocked": 1}
    assert task["runs"][0]["egress"] == {"allowed": 1, "blocked": 1}

    events = api.get("/api/v1/repos/ana/app/tasks/1/transcript", params={"limit": 1000}).json()["events"]
    [blocked] = [e for e in events if e["kind"] == "egress_blocked"]
    assert blocked["payload"]["host"] == "example.com" and blocked["payload"]["method"] == "GET"
    assert blocked["payload"]["rules"] == "allow-list"
    [phase] = [e for e in events if e["kind"] == "system" and e["payload"]["phase"] == "egress"]
    assert phase["payload"]["detail"] == {"rules": [f"127.0.0.1:{index.port}"], "presets": ["pypi"]}

    until_sync(lambda: consumer.seen, timeout=60, what="the egress.blocked notification")
    [note] = [json.loads(seen.body) for seen in consumer.seen]
    assert note["type"] == "egress.blocked" and note["meta"]["task"]["number"] == 1 and note["meta"]["run"]["seq"] == 1
    assert note["data"] == {
        "host": "example.com",
        "port": 80,
        "method": "GET",
        "rules": "allow-list",
        "reason": "no rule allows GET to example.com:80",
        "phase": "run",
    }

    page = httpx.get(f"{live_server.url}/ana/app/tasks/1", headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert "1 connection through the egress proxy · 1 refused" in page.text

    # The run's channel directory went with the run (the proxy had it to itself: no gateway).
    assert not any(live_server.settings.effective_run_channel_dir.glob("*/egress.sock"))

    # Off again: no proxy in the sandbox, and nothing reachable.
    assert api.put("/api/v1/repos/ana/app/task-settings", json={}).json()["egress"]["mode"] == "off"
    with origin_server({"/file": b"from the index\n"}) as index:
        started = api.post(
            "/api/v1/repos/ana/app/tasks",
            json={"goal": "fetch", "agent": "fixer", "runtime": "command", "command": COMMAND.format(port=index.port)},
        )
        assert started.status_code == 201, started.text
        task = wait_task(api, 2, "awaiting_review", "failed")
    assert file_at(api, task["branch"], "proxy-env.txt") == ""
    assert file_at(api, task["branch"], "refused.txt") == "000"  # curl could not connect at all
    assert index.requests == []
    assert task["egress"] == {"allowed": 0, "blocked": 0}
