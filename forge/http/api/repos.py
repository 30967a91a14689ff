"""REST: repositories, collaborators, branch rules, and browsing (same services as the web UI)."""

from typing import Annotated, Any

import msgspec
from litestar import Controller, Response, delete, get, patch, post, put
from litestar.params import FromPath, FromQuery, JSONBody, Parameter
from litestar.response import Stream

from forge.core.access import Action, Scope
from forge.core.error_codes import Code
from forge.core.errors import Forbidden, InvalidInput, Unauthenticated
from forge.git import (
    BranchInfo,
    CommitDiff,
    CommitPage,
    Comparison,
    NotATree,
    TagInfo,
    TreeListing,
    commit_diff,
    compare,
    list_branches,
    list_tags,
    list_tree,
    log,
    raw_file,
    read_blob,
    stream_blob,
)
from forge.git.schemas import BlobInfo
from forge.http.auth import signed_in
from forge.http.deps import ActorDep, BaseUrlDep, BusDep, DbSession, PathRepoDep, StoreDep
from forge.repos import branch_rules, collaborators, lifecycle, repositories
from forge.repos.branch_rules import BranchRuleRead
from forge.repos.collaborators import CollaboratorRead
from forge.repos.lifecycle import RepoCreate, RepoTransfer, RepoUpdate
from forge.repos.repositories import RepoRead, RoleName

REPO = "/api/v1/repos/{owner:str}/{name:str}"


class RepoDelete(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # The full name, typed again: deleting is irreversible.
    confirm: str


class CollaboratorPut(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    role: RoleName


class BranchRuleCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pattern: Annotated[str, msgspec.Meta(min_length=1, max_length=255)]
    allow_force_push: bool = False
    allow_deletion: bool = False
    # Status contexts (`ci/build`) that must be `success` on a head before it merges here.
    required_checks: Annotated[list[Annotated[str, msgspec.Meta(max_length=255)]], msgspec.Meta(max_length=20)] = []
    # Pull requests into a matching branch (docs/pulls.md).
    require_pull_request: bool = False
    required_approvals: Annotated[int, msgspec.Meta(ge=0, le=10)] = 0
    dismiss_stale_approvals: bool = True
    require_code_owner_review: bool = False
    block_on_requested_changes: bool = True
    # Who may merge pull requests into a matching branch (logins; empty: anyone with write access).
    merge_allowlist: Annotated[list[Annotated[str, msgspec.Meta(max_length=41)]], msgspec.Meta(max_length=50)] = []


class RepoController(Controller):
    tags = ["repositories"]

    @post("/api/v1/user/repos", summary="Create a repository owned by the caller", guards=[signed_in])
    async def create(
        self,
        db_session: DbSession,
        actor: ActorDep,
        store: StoreDep,
        bus: BusDep,
        forge_url: BaseUrlDep,
        data: JSONBody[RepoCreate],
    ) -> RepoRead:
        principal = actor.principal
        if principal.account_id is None:
            raise Unauthenticated("sign in or send a token")
        if not principal.has_scope(Scope.REPO_WRITE):
            raise Forbidden("this token lacks the 'repo:write' scope", code=Code.INSUFFICIENT_SCOPE)
        repo = await lifecycle.create_own(db_session, store, bus, actor, data)
        res = await repositories.resource_for(db_session, repo, principal)
        return repositories.to_read(res, principal, forge_url)

    @get("/api/v1/repos", summary="Repositories the caller can read")
    async def list_repos(
        self, db_session: DbSession, actor: ActorDep, forge_url: BaseUrlDep, owner: FromQuery[str | None] = None
    ) -> list[RepoRead]:
        found = await repositories.list_visible(db_session, actor.principal, owner=owner)
        return [repositories.to_read(r, actor.principal, forge_url) for r in found]

    @get(REPO, summary="A repository")
    async def get_repo(self, path_repo: PathRepoDep, actor: ActorDep, forge_url: BaseUrlDep) -> RepoRead:
        return repositories.to_read(await path_repo.load(), actor.principal, forge_url)

    @patch(REPO, summary="Rename, describe, change visibility, default branch or archive")
    async def update_repo(
        self,
        db_session: DbSession,
        actor: ActorDep,
        store: StoreDep,
        forge_url: BaseUrlDep,
        path_repo: PathRepoDep,
        data: JSONBody[RepoUpdate],
    ) -> RepoRead:
        res = await path_repo.load(Action.REPO_ADMIN)
        res = await lifecycle.update(db_session, store, actor, res, data)
        return repositories.to_read(res, actor.principal, forge_url)

    @delete(REPO, summary="Delete a repository (instance admins; body {confirm: 'owner/name'})", status_code=204)
    async def delete_repo(
        self,
        db_session: DbSession,
        actor: ActorDep,
        store: StoreDep,
        path_repo: PathRepoDep,
        data: JSONBody[RepoDelete],
    ) -> None:
        res = await path_repo.load(Action.REPO_ADMIN)
        await lifecycle.remove(db_session, store, actor, res, data.confirm)

    @post(
        REPO + "/transfer",
        summary="Transfer a repository to another account (its owner or instance admins; body {new_owner, confirm})",
        status_code=200,
    )
    async def transfer_repo(
        self,
        db_session: DbSession,
        actor: ActorDep,
        store: StoreDep,
        forge_url: BaseUrlDep,
        path_repo: PathRepoDep,
        data: JSONBody[RepoTransfer],
    ) -> RepoRead:
        res = await path_repo.load(Action.REPO_READ)
        res = await lifecycle.transfer(db_session, store, actor, res, data.new_owner, data.confirm)
        return repositories.to_read(res, actor.principal, forge_url)

    @get(REPO + "/collaborators", summary="Collaborators and their roles")
    async def collaborators(self, db_session: DbSession, path_repo: PathRepoDep) -> list[CollaboratorRead]:
        # Who has access is for collaborators with write access, not for every reader.
        return await collaborators.list_collaborators(db_session, await path_repo.load(Action.REPO_WRITE))

    @put(REPO + "/collaborators/{login:str}", summary="Add a collaborator or change its role")
    async def put_collaborator(
        self,
        db_session: DbSession,
        actor: ActorDep,
        path_repo: PathRepoDep,
        login: FromPath[str],
        data: JSONBody[CollaboratorPut],
    ) -> CollaboratorRead:
        res = await path_repo.load(Action.REPO_ADMIN)
        return await collaborators.set_collaborator(db_session, actor, res, login, data.role)

    @delete(REPO + "/collaborators/{login:str}", summary="Remove a collaborator", status_code=204)
    async def delete_collaborator(
        self, db_session: DbSession, actor: ActorDep, path_repo: PathRepoDep, login: FromPath[str]
    ) -> None:
        await collaborators.remove_collaborator(db_session, actor, await path_repo.load(Action.REPO_ADMIN), login)

    @get(REPO + "/branch-rules", summary="Branch protection rules")
    async def get_branch_rules(self, db_session: DbSession, path_repo: PathRepoDep) -> list[BranchRuleRead]:
        return await branch_rules.list_rules(db_session, await path_repo.load())

    @post(REPO + "/branch-rules", summary="Protect branches matching a pattern")
    async def add_branch_rule(
        self, db_session: DbSession, actor: ActorDep, path_repo: PathRepoDep, data: JSONBody[BranchRuleCreate]
    ) -> BranchRuleRead:
        res = await path_repo.load(Action.REPO_ADMIN)
        return await branch_rules.add_branch_rule(
            db_session,
            actor,
            res,
            data.pattern,
            allow_force_push=data.allow_force_push,
            allow_deletion=data.allow_deletion,
            required=data.required_checks,
            pulls=branch_rules.PullRules(
                require_pull_request=data.require_pull_request,
                required_approvals=data.required_approvals,
                dismiss_stale_approvals=data.dismiss_stale_approvals,
                require_code_owner_review=data.require_code_owner_review,
                block_on_requested_changes=data.block_on_requested_changes,
                merge_allowlist=data.merge_allowlist,
            ),
        )

    @delete(REPO + "/branch-rules/{rule_id:int}", summary="Remove a branch rule", status_code=204)
    async def delete_branch_rule(
        self, db_session: DbSession, actor: ActorDep, path_repo: PathRepoDep, rule_id: FromPath[int]
    ) -> None:
        await branch_rules.remove_branch_rule(db_session, actor, await path_repo.load(Action.REPO_ADMIN), rule_id)


class BrowseController(Controller):
    """Read-only views of a repository's git data."""

    path = REPO
    tags = ["browse"]

    @get("/branches", summary="Branches")
    async def branches(self, path_repo: PathRepoDep, store: StoreDep) -> list[BranchInfo]:
        res = await path_repo.load()
        return await store.read(res.key, list_branches)

    @get("/tags", summary="Tags")
    async def tags_(self, path_repo: PathRepoDep, store: StoreDep) -> list[TagInfo]:
        res = await path_repo.load()
        return await store.read(res.key, list_tags)

    @get("/commits", summary="Commit log, newest first")
    async def commits(
        self,
        path_repo: PathRepoDep,
        store: StoreDep,
        sha: Annotated[str | None, Parameter(max_length=255)] = None,
        path: Annotated[str | None, Parameter(max_length=4096)] = None,
        page: Annotated[int, Parameter(ge=1, le=100_000)] = 1,
        per_page: Annotated[int, Parameter(ge=1, le=100)] = 30,
    ) -> CommitPage:
        res = await path_repo.load()
        return await store.read(res.key, log, sha, page=page, per_page=per_page, path=path)

    @get("/commits/{sha:str}", summary="One commit with its diff against its first parent")
    async def commit(self, path_repo: PathRepoDep, store: StoreDep, sha: FromPath[str]) -> CommitDiff:
        res = await path_repo.load()
        return await store.read(res.key, commit_diff, sha)

    @get(["/contents", "/contents/{path:path}"], summary="A directory listing or a file")
    async def contents(
        self,
        path_repo: PathRepoDep,
        store: StoreDep,
        path: FromPath[str] = "/",
        ref: Annotated[str | None, Parameter(max_length=255)] = None,
    ) -> TreeListing | BlobInfo:
        res = await path_repo.load()
        rel = path.strip("/")
        try:
            return await store.read(res.key, list_tree, ref, rel)
        except NotATree:  # a file, not a directory
            return await store.read(res.key, read_blob, ref, rel)

    @get("/raw/{ref:str}/{path:path}", summary="A file's bytes, with a safe content type")
    async def raw(
        self, path_repo: PathRepoDep, store: StoreDep, ref: FromPath[str], path: FromPath[str]
    ) -> Response[Any]:
        res = await path_repo.load()
        found = await store.read(res.key, raw_file, ref, path.strip("/"))
        headers = {**found.headers, "Content-Length": str(found.size)}
        if found.data is not None:
            return Response(found.data, headers=headers, media_type=found.content_type)
        # Large blobs are streamed from git, never held in memory.
        return Stream(stream_blob(store.path(res.key), found.sha), headers=headers, media_type=found.content_type)

    @get("/compare/{spec:path}", summary="Compare base...head (merge base, commits, per-file diff, diffstat)")
    async def compare_refs(self, path_repo: PathRepoDep, store: StoreDep, spec: FromPath[str]) -> Comparison:
        res = await path_repo.load()
        base, sep, head = spec.strip("/").partition("...")
        if not sep or not base or not head:
            raise InvalidInput("compare needs base...head", code=Code.INVALID_COMPARE)
        return await store.read(res.key, compare, base, head)
