"""The review task's `submit_review` back-channel tool against a hostile agent: offered to review
tasks only; strict arguments (sizes, counts, lines the diff shows); the review posted as the
task's bot on its trigger's pull request (never another, whatever the arguments say), with its
line comments and `pull_request.review_submitted`; `approve` refused unless the repository lets
agents approve; the first review of a run kept, a second refused; a head that moved refused."""

from typing import Any

import msgspec
import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from forge.core.settings import Settings
from forge.db.engine import Database
from forge.db.events import PullRequestReviewSubmitted
from forge.db.models import Account, PullComment, PullRequest, PullReview
from forge.git import Identity
from forge.git.bare import write_commit
from tasks.run.backchannel import Backchannel, ToolRefused, call, tools_for
from tests.support.accounts import Accounts
from tests.support.backchannel import backchannel_for
from tests.support.review_requests import API, Team, bearer, request_review, review_team, tasks_of

pytestmark = pytest.mark.db


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # A model endpoint for the builtin runtime (nothing runs it: no worker here).
    return msgspec.structs.replace(settings, model_base_url="http://127.0.0.1:9/v1", model_name="scripted")


async def _review_task(client: AsyncTestClient[Any], make: Accounts, db: Database) -> tuple[Team, Backchannel]:
    """Bob's pull request #1, a second pull request #2, and demo-agent's review task of #1."""
    t = await review_team(client, make)
    store = client.app.state.repo_store
    main = (await client.get(f"{API}/branches", headers=bearer(t.ana))).json()[0]["sha"]
    await store.write(("ana", "proj"), lambda repo: repo.references.create("refs/heads/feature/y", main))
    await store.write(
        ("ana", "proj"), write_commit, branch="feature/y", files={"y.py": "y = 1\n"}, message="y",
        author=Identity(name="Bob", email="bob@example.org"),
    )  # fmt: skip
    pull = {"title": "Add y", "head": "feature/y", "base": "main"}
    assert (await client.post(f"{API}/pulls", json=pull, headers=bearer(t.bob))).status_code == 201
    await request_review(client, t.ana, "demo-agent")
    [task] = await tasks_of(client, t.ana)
    channel = await backchannel_for(client.app, db, task["number"], store=store, review_pull=1)
    return t, channel


async def _reviews(db: Database, number: int) -> list[tuple[str, str, str, list[tuple[str, int, str]]]]:
    """(author, verdict, body, line comments) of pull request `number`'s reviews."""
    async with db.session() as s:
        rows = (
            await s.execute(
                select(PullReview, Account.login)
                .join(Account, Account.id == PullReview.author_id)
                .where(PullReview.pull_id == (await _pull_id(s, number)))
                .order_by(PullReview.id)
            )
        ).all()
        out = []
        for review, login in rows:
            comments = (
                await s.execute(select(PullComment).where(PullComment.review_id == review.id).order_by(PullComment.id))
            ).scalars()
            out.append((login, review.verdict, review.body, [(c.path or "", c.line or 0, c.body) for c in comments]))
        return out


async def _pull_id(s: Any, number: int) -> int:
    return int((await s.execute(select(PullRequest.id).where(PullRequest.number == number))).scalar_one())


async def _refused(channel: Backchannel, args: dict[str, Any]) -> str:
    with pytest.raises(ToolRefused) as refused:
        await call(channel, "submit_review", args)
    return str(refused.value)


async def test_the_review_is_the_bots_on_its_own_pull_request_whatever_the_arguments(
    client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    t, channel = await _review_task(client, make, db)
    assert "submit_review" in {tool.name for tool in tools_for(channel)}
    args = {
        "verdict": "request_changes", "body": "Two things.", "pull_request": 2, "number": 2, "repository": "x/y",
        "comments": [{"path": "x.py", "line": 2, "body": "y is unused", "pull_request": 2}],
    }  # fmt: skip
    text = await call(channel, "submit_review", args)
    assert "posted on pull request #1" in text
    assert await _reviews(db, 1) == [("demo-agent", "request_changes", "Two things.", [("x.py", 2, "y is unused")])]
    assert await _reviews(db, 2) == []
    submitted = [e for e in t.seen if isinstance(e.data, PullRequestReviewSubmitted)]
    assert [(e.data.number, e.data.verdict, e.data.comments) for e in submitted] == [(1, "request_changes", 1)]
    assert submitted[0].actor is not None and submitted[0].actor.login == "demo-agent"

    # Only the first review of a run counts: a second call is refused and posts nothing.
    again = await _refused(channel, {"verdict": "comment", "body": "and another"})
    assert "already submitted" in again and len(await _reviews(db, 1)) == 1


async def test_hostile_arguments_are_refused_and_post_nothing(
    client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    t, channel = await _review_task(client, make, db)
    line = {"path": "x.py", "line": 1, "body": "ok"}
    for args, says in (
        ({"verdict": "merge", "body": "x"}, "verdict"),
        ({"body": "no verdict"}, "verdict"),
        ({"verdict": "comment", "body": "x" * 20_001}, "body"),
        ({"verdict": "comment", "body": "x", "comments": [line] * 51}, "comments"),
        ({"verdict": "comment", "body": "x", "comments": [{**line, "body": "x" * 5_001}]}, "body"),
        ({"verdict": "comment", "body": "x", "comments": [{**line, "side": "MIDDLE"}]}, "side"),
        ({"verdict": "comment", "body": "x", "comments": [{**line, "line": "1"}]}, "line"),
        ({"verdict": "comment", "body": "nul\x00"}, "NUL"),
        ({"verdict": "comment", "body": "x", "comments": [{**line, "path": "../../etc/passwd"}]}, "not in the diff"),
        ({"verdict": "comment", "body": "x", "comments": [{**line, "path": "y.py"}]}, "not in the diff"),
        ({"verdict": "comment", "body": "x", "comments": [{**line, "line": 40}]}, "not in the diff"),
        ({"verdict": "comment", "body": "   "}, "needs a body"),
        ({"verdict": "approve", "body": "LGTM"}, "may not approve"),
    ):
        assert says in await _refused(channel, args), args
    assert await _reviews(db, 1) == []  # nothing of a refused review is kept
    assert not [e for e in t.seen if isinstance(e.data, PullRequestReviewSubmitted)]
    # A refused review does not use up the run's one review.
    assert "posted" in await call(channel, "submit_review", {"verdict": "comment", "body": "fine"})


async def test_approve_where_the_repository_lets_agents_approve(
    client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    t, channel = await _review_task(client, make, db)
    r = await client.put(f"{API}/task-settings", json={"review_agents_may_approve": True}, headers=bearer(t.ana))
    assert r.status_code == 200, r.text
    assert r.json()["review_agents_may_approve"] is True
    assert "posted" in await call(channel, "submit_review", {"verdict": "approve", "body": "LGTM"})
    assert [(who, verdict) for who, verdict, _, _ in await _reviews(db, 1)] == [("demo-agent", "approve")]


async def test_a_head_that_moved_since_the_task_checked_it_out_is_refused(
    client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    _, channel = await _review_task(client, make, db)
    store = client.app.state.repo_store
    await store.write(
        ("ana", "proj"), write_commit, branch="feature/x", files={"x.py": "x = 3\n"}, message="x again",
        author=Identity(name="Bob", email="bob@example.org"),
    )  # fmt: skip
    tip = await store.read(("ana", "proj"), lambda repo: str(repo.references["refs/heads/feature/x"].target))
    async with db.session(write=True) as s:  # what a push records: the pull request follows its head
        pull = (await s.execute(select(PullRequest).where(PullRequest.number == 1))).scalar_one()
        pull.head_sha = tip
    assert "not posted" in await _refused(channel, {"verdict": "comment", "body": "old news"})
    assert await _reviews(db, 1) == []


async def test_a_task_that_is_not_a_review_has_no_review_tool(
    client: AsyncTestClient[Any], make: Accounts, db: Database
) -> None:
    t, review_channel = await _review_task(client, make, db)
    r = await client.post(f"{API}/tasks", json={"goal": "work", "agent": "demo-agent"}, headers=bearer(t.ana))
    assert r.status_code == 201, r.text
    channel = await backchannel_for(client.app, db, r.json()["number"], store=client.app.state.repo_store)
    assert "submit_review" not in {tool.name for tool in tools_for(channel)}
    assert "review tasks only" in await _refused(channel, {"verdict": "comment", "body": "sneaky"})
    # Even a channel that claims a pull request: the task's trigger decides, and it has none.
    forged = await backchannel_for(client.app, db, r.json()["number"], store=client.app.state.repo_store, review_pull=1)
    assert "review tasks only" in await _refused(forged, {"verdict": "comment", "body": "sneaky"})
    assert await _reviews(db, 1) == [] and review_channel.review is None
