"""Dependencies shared by API routes and web pages (Litestar `Provide`).

Handlers name what they need (`db_session: DbSession`, `path_repo: PathRepoDep` ...) and get it here:
the request's transaction, who is asking, the app's shared objects, and the repository the path
names (`path_repo`), which the handler loads through the access rule."""

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from litestar import Request
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath
from sqlalchemy.ext.asyncio import AsyncSession

from forge.accounts.tokens import TokenCache
from forge.core.access import Action, Principal
from forge.core.settings import Settings
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.events import EventBus
from forge.git import RepoStore
from forge.http.auth import actor_of
from forge.repos import repositories
from forge.repos.issue_comments import IssueComments
from forge.repos.issues import Issues
from forge.repos.labels import Labels
from forge.repos.merge_policy import AllowAll, MergePolicy
from forge.repos.pull_merge import MergeRunner
from forge.repos.pull_tasks import TaskWork
from forge.repos.pulls import Pulls
from forge.repos.repositories import RepoResource

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


async def provide_db_session(request: Request[Any, Any, Any], state: State) -> AsyncGenerator[AsyncSession, None]:
    """One transaction per request: it commits when the handler returns and rolls back on error.
    Unsafe methods take SQLite's write lock up front."""
    db: Database = state.db
    # git's POSTs (fetch negotiation, pushes) only read here; pushes record their refs later.
    write = request.method not in SAFE_METHODS and not request.route_handler.opt.get("git")
    async with db.session(write=write) as session:
        yield session


def provide_actor(request: Request[Any, Any, Any]) -> Actor:
    return actor_of(request)


def provide_principal(request: Request[Any, Any, Any]) -> Principal:
    return actor_of(request).principal


def _from_state(*path: str) -> Provide:
    """A dependency that hands out one of the app's shared objects (`state.<path>`)."""

    def provide(state: State) -> Any:
        value: Any = state
        for attr in path:
            value = getattr(value, attr)
        return value

    return Provide(provide, sync_to_thread=False)


def provide_base_url(state: State) -> str:
    settings: Settings = state.settings
    return settings.effective_base_url


@dataclass
class PathRepo:
    """The repository the path names (`{owner}/{name}`), for the caller. The handler loads it
    (`await path_repo.load(action)`: find, then the access rule; below read access 404). Not in
    the dependency itself: a dependency that raises leaves the request's transaction open, since
    Litestar 2 does not clean up the generator dependencies resolved before it."""

    session: AsyncSession
    principal: Principal
    owner: str
    name: str

    async def load(self, action: Action = Action.REPO_READ) -> RepoResource:
        return await repositories.load(self.session, self.principal, self.owner, self.name, action)


def provide_path_repo(
    db_session: NamedDependency[AsyncSession], actor: NamedDependency[Actor], owner: FromPath[str], name: FromPath[str]
) -> PathRepo:
    return PathRepo(db_session, actor.principal, owner, name)


def provide_merge_runner(state: State) -> MergeRunner:
    """Merges of pull requests, asking the policy consumers the app was composed with."""
    settings: Settings = state.settings
    policy: MergePolicy = state.get("merge_policy") or AllowAll()
    return MergeRunner(
        state.db, state.repo_store, state.bus, settings.effective_base_url, policy, state.get("task_work")
    )


def provide_pulls(
    state: State, db_session: NamedDependency[AsyncSession], store: NamedDependency[RepoStore],
    bus: NamedDependency[EventBus], forge_url: NamedDependency[str],
) -> Pulls:  # fmt: skip
    """The pull requests of the request's transaction (with the agents a bot's mention asks)."""
    return Pulls(db_session, store, bus, forge_url, state.get("agent_work"))


def provide_issues(
    state: State, db_session: NamedDependency[AsyncSession], bus: NamedDependency[EventBus],
    forge_url: NamedDependency[str],
) -> Issues:  # fmt: skip
    """The issues of the request's transaction (with the agents a bot's assignment asks to work)."""
    return Issues(db_session, bus, forge_url, state.get("agent_work"))


def provide_issue_comments(
    state: State, db_session: NamedDependency[AsyncSession], bus: NamedDependency[EventBus],
    forge_url: NamedDependency[str],
) -> IssueComments:  # fmt: skip
    return IssueComments(db_session, bus, forge_url, state.get("agent_work"))


def provide_labels(db_session: NamedDependency[AsyncSession], forge_url: NamedDependency[str]) -> Labels:
    return Labels(db_session, forge_url)


def provide_task_work(state: State) -> TaskWork | None:
    """The tasks side of a task's pull request, when the app was composed with tasks."""
    found: TaskWork | None = state.get("task_work")
    return found


DEPENDENCIES = {
    "db_session": Provide(provide_db_session),
    "actor": Provide(provide_actor, sync_to_thread=False),
    "principal": Provide(provide_principal, sync_to_thread=False),
    "settings": _from_state("settings"),
    "forge_url": Provide(provide_base_url, sync_to_thread=False),
    "db": _from_state("db"),
    "token_cache": _from_state("auth", "token_cache"),
    "store": _from_state("repo_store"),
    "bus": _from_state("bus"),
    "path_repo": Provide(provide_path_repo, sync_to_thread=False),
    "merge_runner": Provide(provide_merge_runner, sync_to_thread=False),
    "task_work": Provide(provide_task_work, sync_to_thread=False),
    "pulls": Provide(provide_pulls, sync_to_thread=False),
    "issues": Provide(provide_issues, sync_to_thread=False),
    # Not `comments` and `labels`: request bodies have fields of those names.
    "issue_comments": Provide(provide_issue_comments, sync_to_thread=False),
    "repo_labels": Provide(provide_labels, sync_to_thread=False),
}

# Explicit markers for handler parameters (inferred dependencies go away in Litestar 3).
DbSession = NamedDependency[AsyncSession]
ActorDep = NamedDependency[Actor]
PrincipalDep = NamedDependency[Principal]
SettingsDep = NamedDependency[Settings]
# Named so no request body field shadows it (Litestar reads a body error on a field named like a
# dependency as a server error: a too long `base_url` answered 500).
BaseUrlDep = NamedDependency[str]
DatabaseDep = NamedDependency[Database]
TokenCacheDep = NamedDependency[TokenCache]
StoreDep = NamedDependency[RepoStore]
BusDep = NamedDependency[EventBus]
PathRepoDep = NamedDependency[PathRepo]
MergeRunnerDep = NamedDependency[MergeRunner]
TaskWorkDep = NamedDependency[TaskWork | None]
PullsDep = NamedDependency[Pulls]
IssuesDep = NamedDependency[Issues]
IssueCommentsDep = NamedDependency[IssueComments]
LabelsDep = NamedDependency[Labels]
