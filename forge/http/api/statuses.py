"""REST: commit statuses, at GitHub's and Gitea's paths and in their shapes (forge/repos/statuses.py)."""

from litestar import Controller, get, post
from litestar.params import FromPath, JSONBody

from forge.core.access import Action
from forge.http.deps import ActorDep, BaseUrlDep, BusDep, DbSession, PathRepoDep, StoreDep
from forge.repos import statuses
from forge.repos.statuses import CombinedStatus, StatusCreate, StatusRead

REPO = "/api/v1/repos/{owner:str}/{name:str}"


class StatusController(Controller):
    path = REPO
    tags = ["statuses"]

    @post("/statuses/{sha:str}", summary="Report a status on a commit (state, context, description, target_url)")
    async def create(
        self,
        db_session: DbSession,
        actor: ActorDep,
        bus: BusDep,
        store: StoreDep,
        path_repo: PathRepoDep,
        forge_url: BaseUrlDep,
        sha: FromPath[str],
        data: JSONBody[StatusCreate],
    ) -> StatusRead:
        res = await path_repo.load(Action.REPO_WRITE)
        full = await statuses.status_sha(store, res, sha)
        return await statuses.create(db_session, actor, bus, res, full, data, _api(forge_url, res.full_name))

    @get("/statuses/{sha:str}", summary="Every status of a commit (sha, branch or tag), newest first")
    async def list_by_sha(
        self, db_session: DbSession, store: StoreDep, path_repo: PathRepoDep, forge_url: BaseUrlDep, sha: FromPath[str]
    ) -> list[StatusRead]:
        return await _history(db_session, store, path_repo, forge_url, sha)

    @get("/commits/{ref:str}/statuses", summary="Every status of a commit (sha, branch or tag), newest first")
    async def list_by_ref(
        self, db_session: DbSession, store: StoreDep, path_repo: PathRepoDep, forge_url: BaseUrlDep, ref: FromPath[str]
    ) -> list[StatusRead]:
        return await _history(db_session, store, path_repo, forge_url, ref)

    @get("/commits/{ref:str}/status", summary="The combined status of a commit: the latest of each context")
    async def combined(
        self, db_session: DbSession, store: StoreDep, path_repo: PathRepoDep, forge_url: BaseUrlDep, ref: FromPath[str]
    ) -> CombinedStatus:
        res = await path_repo.load()
        full = await statuses.resolve_sha(store, res, ref)
        return await statuses.combined_status(db_session, res, full, _api(forge_url, res.full_name))


async def _history(
    db_session: DbSession, store: StoreDep, path_repo: PathRepoDep, forge_url: str, ref: str
) -> list[StatusRead]:
    res = await path_repo.load()
    full = await statuses.resolve_sha(store, res, ref)
    return await statuses.list_statuses(db_session, res, full, _api(forge_url, res.full_name))


def _api(forge_url: str, full_name: str) -> str:
    return f"{forge_url}/api/v1/repos/{full_name}"
