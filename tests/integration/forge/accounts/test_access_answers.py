"""What a caller who may not see something is answered, as a matrix: a private repository that
exists and one that does not answer exactly alike (status, code, message) on the API and the
pages, anonymous or outsider; below the write role tasks answer 404 everywhere (API and pages,
reading, starting, reviewing), as `forge.core.access.require` says."""

from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from forge.core.settings import Settings
from forge.db.engine import Database
from tests.support.accounts import Accounts
from tests.support.task_world import TASKS, World, build_task_world

pytestmark = pytest.mark.db

HTML = {"Accept": "text/html"}
# Every kind of place a repository name leads to: the API (repository, tasks, one task, its
# transcript, a start) and the pages (home, tree, tasks, a task, its review, the start form).
PLACES: list[tuple[str, str, dict[str, Any] | None, dict[str, str]]] = [
    ("GET", "/api/v1/repos/{repo}", None, {}),
    ("GET", "/api/v1/repos/{repo}/branches", None, {}),
    ("GET", "/api/v1/repos/{repo}/tasks", None, {}),
    ("GET", "/api/v1/repos/{repo}/tasks/1", None, {}),
    ("GET", "/api/v1/repos/{repo}/tasks/1/transcript", None, {}),
    ("POST", "/api/v1/repos/{repo}/tasks", {"goal": "g", "agent": "fixer", "command": "true"}, {}),
    ("POST", "/api/v1/repos/{repo}/tasks/1/reviews", {"verdict": "approve"}, {}),
    ("GET", "/{repo}", None, HTML),
    ("GET", "/{repo}/commits", None, HTML),
    ("GET", "/{repo}/tasks/", None, HTML),
    ("GET", "/{repo}/tasks/1", None, HTML),
    ("GET", "/{repo}/tasks/1/review", None, HTML),
]


@pytest.fixture
async def world(db: Database, settings: Settings) -> World:
    return await build_task_world(db, settings)


def problem(r: Any) -> tuple[int, str, str]:
    """Status, code and detail of a problem, from JSON or from the error page (request id cut)."""
    if r.headers.get("content-type", "").startswith("application/problem+json"):
        body = r.json()
        return r.status_code, body["code"], body["detail"]
    page = r.text
    return r.status_code, "", page.replace(r.headers.get("x-request-id", "-"), "")


async def test_a_private_repository_answers_as_one_that_does_not_exist(
    client: AsyncTestClient[Litestar], world: World, make: Accounts
) -> None:
    r = await client.post(TASKS, json={"goal": "g", "agent": "fixer", "command": "true"}, headers=world.h("ana"))
    assert r.status_code == 201, r.text
    await make.user("ursula")
    outsider = {"Authorization": f"Bearer {await make.token('ursula', 'repo:write', 'tasks:write', 'reviews:write')}"}
    for who, auth in (("anonymous", {}), ("outsider", outsider)):
        for method, path, body, extra in PLACES:
            answers = []
            for repo in ("ana/demo", "ana/nothing"):
                r = await client.request(method, path.format(repo=repo), json=body, headers={**auth, **extra})
                answers.append(problem(r))
            hidden, missing = answers
            assert hidden[0] in (401, 404), (who, path, hidden)
            assert hidden == missing, (who, method, path)
            if hidden[1]:
                assert hidden[1] == "repo_not_found" and hidden[2] == "repository not found", (who, path, hidden)


async def test_below_the_write_role_tasks_are_404_on_the_api_and_the_pages(
    client: AsyncTestClient[Litestar], world: World
) -> None:
    r = await client.post(TASKS, json={"goal": "g", "agent": "fixer", "command": "true"}, headers=world.h("ana"))
    assert r.status_code == 201, r.text
    reader = world.h("rita")  # a read collaborator: sees the repository, not its tasks
    for method, path, body, extra in PLACES:
        r = await client.request(method, path.format(repo="ana/demo"), json=body, headers={**reader, **extra})
        if "/tasks" not in path:
            assert r.status_code == 200, (path, r.status_code)
            continue
        assert r.status_code == 404, (method, path, r.status_code, r.text[:300])
        if not extra:
            assert r.json()["code"] == "not_found", r.text
    # A task that exists and one that does not look alike to the reader.
    one, none = [await client.get(f"{TASKS}/{n}", headers=reader) for n in (1, 99)]
    assert (one.status_code, one.json()["detail"]) == (none.status_code, none.json()["detail"])
    # The start form's submission too.
    r = await client.post("/ana/demo/tasks/", data={"goal": "g", "agent": "fixer"}, headers={**reader, **HTML})
    assert r.status_code == 404, r.text[:300]
