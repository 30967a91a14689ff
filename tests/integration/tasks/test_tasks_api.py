"""Tasks REST API without a worker: numbering under concurrency, the permission matrix, 404s,
the transcript pages and SSE resume (real database, real git, real HTTP)."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import func, select, text

from forge.accounts import accounts, tokens
from forge.core.settings import Settings
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.events import EventBus
from forge.db.models import AuditEvent
from forge.git import RepoStore
from forge.repos import collaborators, lifecycle, repositories
from tasks.core import transcript
from tasks.core.models import Task, TranscriptEvent
from tasks.core.policy import AllowAll
from tasks.core.schemas import TaskCreate
from tasks.core.states import TaskState
from tasks.core.transcript import Notice, Output, Pending
from tasks.services.tasks import TaskService
from tests.support.accounts import LiveServer

SYSTEM = Actor.system("test")
TASKS = "/api/v1/repos/ana/demo/tasks"


class World(msgspec.Struct):
    tokens: dict[str, str]
    repo_id: int


async def build_world(db: Database, settings: Settings) -> World:
    store = RepoStore(settings.data_dir / "repos")
    out: dict[str, str] = {}
    try:
        async with db.session(write=True) as s:
            ana = await accounts.create_user(s, SYSTEM, "ana", "correct horse battery")
            for login in ("wendy", "rita", "olga"):
                await accounts.create_user(s, SYSTEM, login, "correct horse battery")
            await accounts.create_bot(s, SYSTEM, "fixer")
            await accounts.create_user(s, SYSTEM, "human", "correct horse battery")
            repo = await lifecycle.create(s, store, EventBus(), SYSTEM, ana, "demo", auto_init=True)
            res = await repositories.resource_for(s, repo, SYSTEM.principal)
            for login, role in (("fixer", "write"), ("wendy", "write"), ("rita", "read"), ("human", "write")):
                await collaborators.set_collaborator(s, SYSTEM, res, login, role)  # type: ignore[arg-type]
            full = ["repo:write", "tasks:write"]
            for login in ("ana", "wendy", "rita", "olga"):
                owner = await accounts.require_by_login(s, login)
                out[login] = (await tokens.create(s, SYSTEM, owner, "t", full, None)).token
            out["ana-readonly"] = (await tokens.create(s, SYSTEM, ana, "ro", ["repo:read"], None)).token
            return World(tokens=out, repo_id=repo.id)
    finally:
        await store.close()


@pytest.fixture
async def world(db: Database, settings: Settings) -> World:
    return await build_world(db, settings)


def auth(world: World, who: str) -> dict[str, str]:
    return {} if who == "anonymous" else {"Authorization": f"Bearer {world.tokens[who]}"}


async def test_start_validates_and_numbers(client: AsyncTestClient[Litestar], world: World) -> None:
    h = auth(world, "ana")
    r = await client.post(TASKS, json={"goal": "  x ", "agent": "fixer", "command": "true"}, headers=h)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["number"] == 1 and body["goal"] == "x" and body["branch"] == "agent/1-x"
    assert body["runtime"] == "command" and body["base"] == "main" and body["queue_position"] == 1
    for bad, code in (
        ({"goal": " ", "agent": "fixer", "command": "true"}, "goal_required"),
        ({"goal": "g", "agent": "human", "command": "true"}, "invalid_agent"),
        ({"goal": "g", "agent": "nobody", "command": "true"}, "invalid_agent"),
        ({"goal": "g", "agent": "fixer", "command": "true", "base": "nope"}, "base_not_found"),
        ({"goal": "g", "agent": "fixer", "runtime": "command"}, "command_required"),
        ({"goal": "g", "agent": "fixer"}, "model_not_configured"),
        ({"goal": "g", "agent": "fixer", "runtime": "claude-code"}, "model_not_configured"),
        ({"goal": "g", "agent": "fixer", "runtime": "codex"}, "model_not_configured"),
    ):
        r = await client.post(TASKS, json=bad, headers=h)
        assert r.status_code == 422 and r.json()["code"] == code, (bad, r.text)
        if bad.get("runtime") == "codex":
            assert "FORGEHAND_MODEL_BASE_URL" in r.json()["detail"] and "Responses API" in r.json()["detail"]
    r = await client.post(TASKS, json={"goal": "second", "agent": "fixer", "command": ["true"]}, headers=h)
    assert r.json()["number"] == 2 and r.json()["queue_position"] == 2
    # An environment override: repository admins only, with an image an environment may use.
    override = {"goal": "g", "agent": "fixer", "command": "true", "environment_override": {"extra_setup": "echo x"}}
    r = await client.post(TASKS, json=override, headers=auth(world, "wendy"))
    assert r.status_code == 403 and r.json()["code"] == "environment_override_needs_admin", r.text
    bad_image = {**override, "environment_override": {"image": "rust:latest"}}
    r = await client.post(TASKS, json=bad_image, headers=h)
    assert r.status_code == 422 and r.json()["code"] == "invalid_environment" and "rust:latest" in r.text
    r = await client.post(TASKS, json=override, headers=h)
    assert r.status_code == 201 and r.json()["environment_override"] == {"image": "", "extra_setup": "echo x"}


async def test_concurrent_starts_get_consecutive_numbers(db: Database, settings: Settings, world: World) -> None:
    store = RepoStore(settings.data_dir / "repos")

    async def one(i: int) -> int:
        async with db.session(write=True) as s:
            res = await repositories.load(s, SYSTEM.principal, "ana", "demo")
            ana = await accounts.require_by_login(s, "ana")
            actor = Actor(
                principal=SYSTEM.principal.__class__(account_id=ana.id, login="ana", type="User", via="token")
            )
            svc = TaskService(s, bus=EventBus(), store=store, settings=settings, gate=AllowAll())
            task = await svc.start(actor, res, TaskCreate(goal=f"task {i}", agent="fixer", command="true"))
            return task.number

    try:
        numbers = await asyncio.gather(*(one(i) for i in range(12)))
    finally:
        await store.close()
    assert sorted(numbers) == list(range(1, 13))


async def test_concurrent_starts_over_http(client: AsyncTestClient[Litestar], world: World) -> None:
    h = auth(world, "ana")

    async def one(i: int) -> int:
        r = await client.post(TASKS, json={"goal": f"g{i}", "agent": "fixer", "command": "true"}, headers=h)
        assert r.status_code == 201, r.text
        number: int = r.json()["number"]
        return number

    assert sorted(await asyncio.gather(*(one(i) for i in range(8)))) == list(range(1, 9))


async def test_the_task_list_pages_newest_first(client: AsyncTestClient[Litestar], world: World) -> None:
    h = auth(world, "ana")
    for i in range(5):
        r = await client.post(TASKS, json={"goal": f"g{i}", "agent": "fixer", "command": "true"}, headers=h)
        assert r.status_code == 201, r.text

    async def numbers(**params: Any) -> list[int]:
        r = await client.get(TASKS, params=params, headers=h)
        assert r.status_code == 200, r.text
        return [t["number"] for t in r.json()]

    assert await numbers() == [5, 4, 3, 2, 1]
    assert await numbers(per_page=2) == [5, 4]
    assert await numbers(per_page=2, page=3) == [1]
    assert await numbers(per_page=2, page=4) == []
    assert await numbers(state="queued", per_page=1) == [5]
    for bad in ({"per_page": 0}, {"per_page": 101}, {"page": 0}):
        r = await client.get(TASKS, params=bad, headers=h)
        assert r.status_code == 422 and r.json()["code"] == "validation_failed", (bad, r.text)


@pytest.mark.parametrize("raw", ["0", "-1", "01", "abc", "1.0", "99999999999"])
async def test_bad_task_numbers_are_404(client: AsyncTestClient[Litestar], world: World, raw: str) -> None:
    h = auth(world, "ana")
    for path in ("", "/transcript", "/events"):
        assert (await client.get(f"{TASKS}/{raw}{path}", headers=h)).status_code == 404
    assert (await client.post(f"{TASKS}/{raw}/retry", headers=h)).status_code == 404


async def test_permission_matrix(client: AsyncTestClient[Litestar], world: World, db: Database) -> None:
    own = auth(world, "ana")
    r = await client.post(TASKS, json={"goal": "mine", "agent": "fixer", "command": "sleep 1"}, headers=own)
    assert r.status_code == 201
    expected_denied = {"rita": 404, "olga": 404, "anonymous": 404, "ana-readonly": 403}
    cases: list[tuple[str, str, dict[str, Any] | None, int]] = [
        ("GET", TASKS, None, 200),
        ("GET", f"{TASKS}/1", None, 200),
        ("GET", f"{TASKS}/1/transcript", None, 200),
        ("POST", f"{TASKS}/1/messages", {"body": "hi"}, 200),
        ("POST", f"{TASKS}/1/answer", {"body": "hi"}, 409),
        ("POST", f"{TASKS}/1/retry", None, 409),
        ("POST", f"{TASKS}/1/close", None, 409),
        ("POST", TASKS, {"goal": "g", "agent": "fixer", "command": "true"}, 201),
    ]
    for who in ("ana", "wendy", "rita", "olga", "anonymous", "ana-readonly"):
        for method, path, body, ok in cases:
            r = await client.request(method, path, json=body, headers=auth(world, who))
            want = expected_denied.get(who, ok)
            # A reader sees the repository but no task: starting one is 404 too (forge.core.access.require).
            assert r.status_code == want, (who, method, path, r.status_code, r.text)
    # Stop: the starter, the agent or an admin. wendy (write, not the starter) may not.
    assert (await client.post(f"{TASKS}/1/stop", headers=auth(world, "wendy"))).status_code == 403
    for who, code in expected_denied.items():
        assert (await client.post(f"{TASKS}/1/stop", headers=auth(world, who))).status_code == code
    r = await client.post(f"{TASKS}/1/stop", headers=own)
    assert r.status_code == 200 and r.json()["state"] == "stopped"  # queued: stops at once
    assert (await client.post(f"{TASKS}/1/stop", headers=own)).json()["state"] == "stopped"  # idempotent
    # A resting task's event stream replays and ends.
    r = await client.get(f"{TASKS}/1/events", headers=own)
    assert r.status_code == 200 and "event: end" in r.text and "event: prompt" in r.text
    for who, code in expected_denied.items():
        assert (await client.get(f"{TASKS}/1/events", headers=auth(world, who))).status_code == code
    r = await client.post(f"{TASKS}/1/retry", headers=own)
    assert r.status_code == 200 and r.json()["state"] == "queued" and r.json()["runs"][-1]["kind"] == "retry"
    mine = await client.get("/api/v1/user/tasks", headers=own)
    assert {t["number"] for t in mine.json()} >= {1}
    assert (await client.get("/api/v1/user/tasks", headers=auth(world, "olga"))).json() == []
    async with db.session() as s:
        actions = (await s.execute(select(AuditEvent.action, func.count()).group_by(AuditEvent.action))).all()
    counts = dict(actions)
    for action in ("task.start", "task.message", "task.stop", "task.retry"):
        assert counts.get(action, 0) >= 1, action


async def test_close_and_message_on_resting_tasks(client: AsyncTestClient[Litestar], world: World) -> None:
    h = auth(world, "ana")
    await client.post(TASKS, json={"goal": "g", "agent": "fixer", "command": "true"}, headers=h)
    await client.post(f"{TASKS}/1/stop", headers=h)
    r = await client.post(f"{TASKS}/1/messages", json={"body": "go again"}, headers=h)
    assert r.status_code == 200 and r.json()["state"] == "queued" and r.json()["runs"][-1]["kind"] == "message"
    await client.post(f"{TASKS}/1/stop", headers=h)
    r = await client.post(f"{TASKS}/1/close", headers=h)
    assert r.status_code == 200 and r.json()["state"] == "closed"
    r = await client.post(f"{TASKS}/1/messages", json={"body": "more"}, headers=h)
    assert r.status_code == 409
    assert (await client.get(TASKS, params={"state": "closed"}, headers=h)).json()[0]["number"] == 1
    assert (await client.get(TASKS, params={"state": "bogus"}, headers=h)).status_code == 422


@pytest.fixture
async def streaming(live_server: LiveServer, db: Database, settings: Settings) -> AsyncIterator[tuple[str, str, int]]:
    world = await build_world(db, settings)
    async with httpx.AsyncClient(base_url=live_server.url, headers=auth(world, "ana"), timeout=30) as c:
        r = await c.post(TASKS, json={"goal": "g", "agent": "fixer", "command": "true"}, headers=auth(world, "ana"))
        assert r.status_code == 201
    async with db.session() as s:
        task_id = (await s.execute(select(Task.id))).scalar_one()
    yield live_server.url, world.tokens["ana"], task_id


async def read_sse(resp: httpx.Response, stop_after: int | None = None) -> tuple[list[int], bool]:
    seqs: list[int] = []
    event = ""
    async for line in resp.aiter_lines():
        if line.startswith("id: "):
            seqs.append(int(line[4:]))
            if stop_after is not None and len(seqs) >= stop_after:
                return seqs, False
        elif line.startswith("event: "):
            event = line[7:]
        elif line == "" and event == "end":
            return seqs, True
    return seqs, False


async def test_sse_resume_loses_nothing_while_events_are_appended(
    streaming: tuple[str, str, int], db: Database
) -> None:
    url, token, task_id = streaming
    total_batches = 60

    async def append() -> None:
        for i in range(total_batches):
            async with db.session(write=True) as s:
                await transcript.append(
                    s,
                    task_id,
                    [Pending(kind="stdout", payload=Output(text=f"line {i}.{j}\n")) for j in range(5)],
                )
            await asyncio.sleep(0.01)  # an agent's pace: the events keep arriving while the stream is read
        async with db.session(write=True) as s:
            await transcript.append(s, task_id, [Pending(kind="notice", payload=Notice(text="done"))])
            task = await s.get(Task, task_id)
            assert task is not None
            task.state = TaskState.AWAITING_REVIEW

    writer = asyncio.create_task(append())
    headers = {"Authorization": f"Bearer {token}"}
    seen: list[int] = []
    ended = False
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as c:
        path = f"{TASKS}/1/events"
        async with c.stream("GET", path) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            got, ended = await read_sse(resp, stop_after=40)
            seen += got
        while not ended:
            async with c.stream("GET", path, headers={"Last-Event-ID": str(seen[-1])}) as resp:
                got, ended = await read_sse(resp, stop_after=70)
                seen += got
    await writer
    assert seen == list(range(1, 1 + 1 + total_batches * 5 + 1))
    # ?after= works too, and the JSON pages agree.
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as c:
        async with c.stream("GET", f"{TASKS}/1/events", params={"after": 300}) as resp:
            got, ended = await read_sse(resp)
        assert got == list(range(301, 1 + 1 + total_batches * 5 + 1)) and ended
        page = (await c.get(f"{TASKS}/1/transcript", params={"after": 10, "limit": 5})).json()
        assert [e["seq"] for e in page["events"]] == [11, 12, 13, 14, 15] and page["next_after"] == 15
        assert not page["complete"]


async def test_sse_frames_carry_exactly_the_transcript_json(streaming: tuple[str, str, int], db: Database) -> None:
    """The live stream sends each payload as the JSON the database holds, several events a chunk:
    what a client parses must be what the transcript API returns, whatever the text holds, and a
    stored payload with line breaks (written by something other than forgehand) stays one event."""
    url, token, task_id = streaming
    texts = ["two\nlines\r\nand CR\r", 'quotes " and \\ backslash', "unicode é ✓ 🙂 \u2028 sep", "data: fake\n\nid: 99"]
    async with db.session(write=True) as s:
        await transcript.append(s, task_id, [Pending(kind="notice", payload=Notice(text=t)) for t in texts])
        await transcript.append(s, task_id, [Pending(kind="stdout", payload=Output(text="x" * 70_000))])
        await transcript.append(s, task_id, [Pending(kind="notice", payload=Notice(text="pretty"))])
        last = int(await s.scalar(select(func.max(TranscriptEvent.seq)).where(TranscriptEvent.task_id == task_id)) or 0)
        # Pretty-printed JSON, as an operator's own tool might store it: line breaks in the text.
        pretty = '{\n  "text": "pretty",\n  "level": "info"\n}'
        sql = {
            "postgresql": "UPDATE transcript_events SET payload = CAST(:p AS JSON) WHERE task_id = :t AND seq = :q",
            "sqlite": "UPDATE transcript_events SET payload = :p WHERE task_id = :t AND seq = :q",
        }[s.bind.dialect.name]
        await s.execute(
            text(sql),
            {"p": pretty, "t": task_id, "q": last},
        )
        task = await s.get(Task, task_id)
        assert task is not None
        task.state = TaskState.AWAITING_REVIEW
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as c:
        page = (await c.get(f"{TASKS}/1/transcript", params={"limit": 500})).json()["events"]
        frames: list[tuple[str, str, str]] = []
        async with c.stream("GET", f"{TASKS}/1/events") as resp:
            event, ident, data = "", "", list[str]()
            async for line in resp.aiter_lines():
                if line == "":
                    if data:
                        frames.append((ident, event, "\n".join(data)))
                    if event == "end":
                        break
                    event, ident, data = "", "", []
                elif line.startswith("id: "):
                    ident = line[4:]
                elif line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    data.append(line[6:])
    streamed = [msgspec.json.decode(d) for i, e, d in frames if e not in ("state", "end")]
    assert streamed == page  # every field, every byte of every payload
    assert [int(i) for i, e, _ in frames if e not in ("state", "end")] == [ev["seq"] for ev in page]
    assert [ev["payload"]["text"] for ev in page if ev["kind"] == "notice"][-5:] == [*texts, "pretty"]


async def test_web_pages_start_and_show_a_task(client: AsyncTestClient[Litestar], world: World) -> None:
    from tests.support.web import csrf_from, sign_in

    assert (await sign_in(client, "ana", "correct horse battery")).status_code in (302, 303)
    page = await client.get("/ana/demo/tasks/")
    assert page.status_code == 200 and "Start a task" in page.text
    form = {
        "goal": "say hi",
        "agent": "fixer",
        "runtime": "command",
        "command": "echo hi",
        "csrf_token": csrf_from(page.text),
    }
    r = await client.post("/ana/demo/tasks/", data=form, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ana/demo/tasks/1"
    task_page = await client.get("/ana/demo/tasks/1")
    assert task_page.status_code == 200 and "say hi" in task_page.text and "agent/1-say-hi" in task_page.text
    token = csrf_from(task_page.text)
    r = await client.post("/ana/demo/tasks/1/stop", data={"csrf_token": token}, follow_redirects=False)
    assert r.status_code == 303
    assert "stopped" in (await client.get("/ana/demo/tasks/1")).text
    assert "ana/demo#1" in (await client.get("/tasks")).text
    assert (await client.get("/ana/demo/tasks/0")).status_code == 404
    bad = await client.post("/ana/demo/tasks/", data={**form, "agent": "nobody"}, follow_redirects=False)
    assert bad.status_code == 422 and "not an active bot" in bad.text


async def test_nul_in_what_reaches_the_sandbox_is_422(client: AsyncTestClient[Litestar], world: World) -> None:
    """A goal with NUL was stored and its run failed `internal` (the sandbox refuses NUL in argv and
    environment): every text a start or a message hands to a run is refused at the API."""
    h = auth(world, "ana")
    ok = {"goal": "g", "agent": "fixer", "command": "true"}
    for change, code in (
        ({"goal": "a\x00b"}, "invalid_characters"),
        ({"title": "t\x00"}, "invalid_characters"),
        ({"agent": "fix\x00er"}, "invalid_characters"),
        ({"base": "ma\x00in"}, "invalid_characters"),
        ({"command": "echo \x00"}, "invalid_command"),
        ({"command": ["echo", "\x00"]}, "invalid_command"),
        ({"command": None, "runtime": "acp", "agent_command": "x\x00"}, "invalid_characters"),
    ):
        r = await client.post(TASKS, json={**ok, **change}, headers=h)
        assert r.status_code == 422 and r.json()["code"] == code, (change, r.text)
    assert (await client.get(TASKS, headers=h)).json() == []
    assert (await client.post(TASKS, json=ok, headers=h)).status_code == 201
    await client.post(f"{TASKS}/1/stop", headers=h)
    for path in ("messages", "answer"):
        r = await client.post(f"{TASKS}/1/{path}", json={"body": "more\x00"}, headers=h)
        assert r.status_code == 422 and r.json()["code"] == "invalid_characters", r.text
