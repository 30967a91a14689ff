"""A team and its repository for the notification tests, and the events they drive the notifier
with (published on the app's bus, in a transaction of their own, as a change would)."""

from typing import Any

import msgspec
from litestar import Litestar
from litestar.testing import AsyncTestClient

from forge.db.engine import Database
from forge.db.events import AccountRef, Event, EventPayload
from forge.db.issue_payloads import CommentCreated, CommentTarget, IssueOpened
from tests.support.accounts import Accounts

BASE = "http://testserver.local"
REPO = "/api/v1/repos/ana/app"


class Team(msgspec.Struct):
    """ana owns `app`; bob writes, rita reads; eve has no access. Tokens carry `notifications`."""

    client: AsyncTestClient[Litestar]
    db: Database
    app: Litestar
    tokens: dict[str, str]
    repo_id: int = 0

    def h(self, login: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[login]}"}

    async def publish(self, data: EventPayload, actor: str | None) -> None:
        event = Event(
            repo_id=self.repo_id, repository="ana/app", actor=AccountRef(login=actor) if actor else None, data=data
        )
        async with self.db.session(write=True) as session:
            await self.app.state.bus.publish(session, event)

    async def inbox(self, login: str, **params: Any) -> list[dict[str, Any]]:
        r = await self.client.get("/api/v1/notifications", params=params, headers=self.h(login))
        assert r.status_code == 200, r.text
        found: list[dict[str, Any]] = r.json()
        return found


async def make_team(client: AsyncTestClient[Litestar], db: Database, app: Litestar) -> Team:
    make = Accounts(db=db)
    tokens: dict[str, str] = {}
    for login in ("ana", "bob", "rita", "eve"):
        await make.user(login)
        tokens[login] = await make.token(login, "repo:write", "notifications")
    team = Team(client=client, db=db, app=app, tokens=tokens)
    r = await client.post("/api/v1/user/repos", json={"name": "app"}, headers=team.h("ana"))
    assert r.status_code == 201, r.text
    team.repo_id = r.json()["id"]
    for login, role in (("bob", "write"), ("rita", "read")):
        r = await client.put(f"{REPO}/collaborators/{login}", json={"role": role}, headers=team.h("ana"))
        assert r.is_success, r.text
    return team


def comment(number: int, body: str, author: str, *, pull: bool = False, comment_id: int = 1) -> CommentCreated:
    kind = "pull" if pull else "issues"
    return CommentCreated(
        id=comment_id,
        body=body,
        html_url=f"{BASE}/ana/app/{kind}/{number}#comment-{comment_id}",
        author=AccountRef(login=author),
        issue=CommentTarget(
            number=number, title=f"Thread {number}", html_url=f"{BASE}/ana/app/{kind}/{number}", is_pull_request=pull
        ),
    )


def opened(number: int, body: str, author: str, assignees: tuple[str, ...] = ()) -> IssueOpened:
    return IssueOpened(
        number=number,
        title=f"Issue {number}",
        body=body,
        html_url=f"{BASE}/ana/app/issues/{number}",
        state="open",
        state_reason=None,
        author=AccountRef(login=author),
        labels=[],
        assignees=[AccountRef(login=a) for a in assignees],
        milestone=None,
    )
