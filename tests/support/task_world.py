"""A task world without a worker (reviews, merges, prompt prechecks): users with different
roles, a bot, a repository with a base commit, tokens; and `agent_commits`, which stands in for a
run that ended well with a real commit on the task branch."""

from typing import Any

import msgspec
import pygit2
from sqlalchemy import select

from forge.accounts import accounts, tokens
from forge.core.settings import Settings
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.events import EventBus
from forge.git import RepoStore
from forge.git.bare import write_commit
from forge.git.schemas import Identity
from forge.repos import collaborators, lifecycle, repositories
from tasks.core.models import Task
from tasks.core.states import TaskState

SYSTEM = Actor.system("test")
TASKS = "/api/v1/repos/ana/demo/tasks"
AGENT = Identity(name="fixer", email="fixer@bots.local")
BASE_FILES = {"old.txt": b"one\ntwo\nthree\n", "keep.txt": b"keep\n"}


class World(msgspec.Struct):
    tokens: dict[str, str]
    store_root: str

    def h(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"}


async def build_task_world(db: Database, settings: Settings) -> World:
    store = RepoStore(settings.data_dir / "repos")
    out: dict[str, str] = {}
    try:
        async with db.session(write=True) as s:
            ana = await accounts.create_user(s, SYSTEM, "ana", "correct horse battery")
            for login in ("wendy", "olga", "rita"):
                await accounts.create_user(s, SYSTEM, login, "correct horse battery")
            await accounts.create_bot(s, SYSTEM, "fixer")
            repo = await lifecycle.create(s, store, EventBus(), SYSTEM, ana, "demo", auto_init=False)
            res = await repositories.resource_for(s, repo, SYSTEM.principal)
            for login, role in (("fixer", "write"), ("wendy", "write"), ("olga", "write"), ("rita", "read")):
                await collaborators.set_collaborator(s, SYSTEM, res, login, role)  # type: ignore[arg-type]
            everything = ["repo:write", "tasks:write", "reviews:write", "webhooks:admin"]
            for login in ("ana", "wendy", "olga", "rita", "fixer"):
                who = await accounts.require_by_login(s, login)
                out[login] = (await tokens.create(s, SYSTEM, who, "t", everything, None)).token
            out["ana-tasks-only"] = (
                await tokens.create(s, SYSTEM, ana, "t", ["repo:write", "tasks:write"], None)
            ).token
        await store.write(("ana", "demo"), write_commit, branch="main", files=BASE_FILES, message="base", author=AGENT)
        return World(tokens=out, store_root=str(settings.data_dir / "repos"))
    finally:
        await store.close()


def bare_repo(settings: Settings) -> pygit2.Repository:
    return pygit2.Repository(str(settings.data_dir / "repos" / "ana" / "demo.git"))


async def agent_commits(db: Database, settings: Settings, number: int, files: dict[str, bytes], msg: str) -> str:
    """Stand in for a run that ended well: commit onto the task branch, task awaiting review."""
    store = RepoStore(settings.data_dir / "repos")
    try:
        async with db.session(write=True) as s:
            task = (await s.execute(select(Task).where(Task.number == number))).scalar_one()
            branch, parent = task.branch, task.head_sha or task.base_sha
        repo = bare_repo(settings)
        tree = {e.name: repo[e.id].data for e in repo[parent].peel(pygit2.Tree) if e.type_str == "blob"}
        tree.update(files)
        repo.references.create(f"refs/heads/{branch}", parent, force=True)
        commit = await store.write(("ana", "demo"), write_commit, branch=branch, files=tree, message=msg, author=AGENT)
        async with db.session(write=True) as s:
            task = (await s.execute(select(Task).where(Task.number == number))).scalar_one()
            task.head_sha = commit
            task.state = TaskState.AWAITING_REVIEW
            task.summary = msg
            return task.head_sha
    finally:
        await store.close()


async def open_task_pull(db: Database, settings: Settings, base_url: str, number: int = 1) -> int:
    """What settling a run does for a task in review with changes: its pull request opened by its
    agent (returns the pull request's number)."""
    from forge.db.models import Repository
    from forge.repos.repositories import RepoResource
    from tasks.core import task_pulls
    from tasks.core.lifecycle import Lifecycle

    store = RepoStore(settings.data_dir / "repos")
    try:
        async with db.session(write=True) as s:
            task = (await s.execute(select(Task).where(Task.number == number))).scalar_one()
            repo = await s.get(Repository, task.repo_id)
            assert repo is not None
            await task_pulls.follow(
                Lifecycle(s, bus=EventBus(), base_url=base_url), store, task, RepoResource(repo=repo)
            )
            assert task.result_pull_number is not None
            return task.result_pull_number
    finally:
        await store.close()


async def open_login_pull(client: Any, world: World) -> None:
    """ana's pull request #1 of `feature/login` (a commit on main's tip) into main, over the API."""
    api = "/api/v1/repos/ana/demo"
    store = client.app.state.repo_store
    main = next(b["sha"] for b in (await client.get(f"{api}/branches", headers=world.h("ana"))).json())
    await store.write(("ana", "demo"), lambda repo: repo.references.create("refs/heads/feature/login", main))
    await store.write(("ana", "demo"), write_commit, branch="feature/login", files={"login.py": "pass\n"},
                      message="login stub", author=Identity(name="Ana", email="ana@example.org"))  # fmt: skip
    opened = {"title": "Login", "head": "feature/login", "base": "main"}
    assert (await client.post(f"{api}/pulls", json=opened, headers=world.h("ana"))).status_code == 201
