"""Git smart HTTP at `/{owner}/{name}.git/...`: `info/refs`, `git-upload-pack`, `git-receive-pack`.

git runs as `upload-pack`/`receive-pack --stateless-rpc`; request and response bodies stream
through (never held whole). Access is the one rule of `forge.core.access`: anonymous callers may
clone public repositories; otherwise HTTP Basic with a token as password. A caller that cannot
read gets 404 (anonymous callers get 401 with `WWW-Authenticate`, so git asks for a token).
Pushes are checked against the push rules before git runs and again in the pre-receive hook."""

from typing import Any

from litestar import Request, Response, get, post
from litestar.params import FromPath, FromQuery
from litestar.response import Stream

from forge.core.access import Action, Role, Scope, can
from forge.core.errors import Forbidden, NotFound, Unauthenticated
from forge.git import PushSession, RepoStore, advertise_refs, decode_request_body
from forge.git.service_process import GitServiceProcess
from forge.git.smart_http import (
    NO_CACHE_HEADERS,
    RECEIVE_PACK,
    UPLOAD_PACK,
    GitHttpConfig,
    advertisement_content_type,
    check_service,
    result_content_type,
)
from forge.http.auth import actor_of
from forge.http.deps import DbSession
from forge.repos import pushes, repositories
from forge.repos.repositories import RepoResource

GIT_OPT = {"git": True}


def _repo_name(name: str) -> str:
    return name.removesuffix(".git")


async def _authorize(
    request: Request[Any, Any, Any], db_session: Any, owner: str, name: str, service: str
) -> RepoResource:
    actor = actor_of(request)
    principal = actor.principal
    action = Action.REPO_WRITE if service == RECEIVE_PACK else Action.REPO_READ
    try:
        res = await repositories.load(db_session, principal, owner, _repo_name(name), Action.REPO_READ)
    except NotFound:
        if not principal.is_authenticated:
            # Ask for credentials instead of saying "not found": the repository may be private.
            raise Unauthenticated("authentication required", code="unauthenticated") from None
        raise
    if res.archived and action is Action.REPO_WRITE and can(principal, action, _Unarchived(res)):
        # Let the push through to the rules, which refuse it with a message git prints.
        return res
    if not can(principal, action, res):
        if not principal.is_authenticated:
            raise Unauthenticated("authentication required to push", code="unauthenticated")
        if res.archived and action is Action.REPO_WRITE:
            raise Forbidden("the repository is archived (read-only)", code="repo_archived")
        if not principal.has_scope(Scope.REPO_WRITE):
            raise Forbidden("this token lacks the 'repo:write' scope", code="insufficient_scope")
        raise Forbidden("you do not have write access to this repository", code="forbidden")
    return res


class _Unarchived:
    """The same repository as if it were not archived (to tell "archived" from "no access")."""

    def __init__(self, res: RepoResource) -> None:
        self._res = res
        self.owner_id = res.owner_id
        self.visibility = res.visibility
        self.archived = False

    def role_of(self, account_id: int) -> Role | None:
        return self._res.role_of(account_id)


def _config(request: Request[Any, Any, Any]) -> GitHttpConfig:
    config: GitHttpConfig = request.app.state.git_config
    return config


@get("/{owner:str}/{name:str}/info/refs", include_in_schema=False, opt=GIT_OPT)
async def info_refs(
    request: Request[Any, Any, Any],
    db_session: DbSession,
    owner: FromPath[str],
    name: FromPath[str],
    service: FromQuery[str] = "",
) -> Response[Any]:
    if not service:
        # The "dumb" protocol is not served.
        raise NotFound("only the smart HTTP protocol is served", code="not_found")
    svc = check_service(service)
    res = await _authorize(request, db_session, owner, name, svc)
    store: RepoStore = request.app.state.repo_store
    body = advertise_refs(svc, store.path(res.key), request.headers.get("git-protocol"), config=_config(request))
    return Stream(body, media_type=advertisement_content_type(svc), headers=NO_CACHE_HEADERS)


@post(
    "/{owner:str}/{name:str}/git-upload-pack",
    include_in_schema=False,
    request_max_body_size=None,
    opt=GIT_OPT,
    status_code=200,  # Litestar's POST default is 201; libgit2, dulwich and JGit accept only 200
)
async def upload_pack(
    request: Request[Any, Any, Any], db_session: DbSession, owner: FromPath[str], name: FromPath[str]
) -> Response[Any]:
    res = await _authorize(request, db_session, owner, name, UPLOAD_PACK)
    store: RepoStore = request.app.state.repo_store
    config = _config(request)
    body = decode_request_body(
        request.stream(), request.headers.get("content-encoding"), max_bytes=config.max_request_bytes
    )
    # Feed the whole request first, then stream the answer: Litestar's Stream watches the
    # request channel for disconnects while it sends, which would eat request body chunks.
    proc = await GitServiceProcess.start(
        UPLOAD_PACK, store.path(res.key), git_protocol=request.headers.get("git-protocol"), config=config
    )
    try:
        await proc.feed(body)
    except BaseException:
        await proc.aclose()
        raise
    return Stream(proc.output(), media_type=result_content_type(UPLOAD_PACK), headers=NO_CACHE_HEADERS)


@post(
    "/{owner:str}/{name:str}/git-receive-pack",
    include_in_schema=False,
    request_max_body_size=None,
    opt=GIT_OPT,
    status_code=200,
)
async def receive_pack(
    request: Request[Any, Any, Any], db_session: DbSession, owner: FromPath[str], name: FromPath[str]
) -> Response[Any]:
    res = await _authorize(request, db_session, owner, name, RECEIVE_PACK)
    actor = actor_of(request)
    ctx = await pushes.push_context(db_session, res, actor.principal, request.app.state.settings.effective_base_url)
    store: RepoStore = request.app.state.repo_store
    config = _config(request)
    body = decode_request_body(
        request.stream(), request.headers.get("content-encoding"), max_bytes=config.max_request_bytes
    )
    push = await PushSession.open(
        store.path(res.key), body, ctx, config=config, git_protocol=request.headers.get("git-protocol")
    )
    if push.refused:
        await push.discard_rest()
        rejection = push.rejection()
        push.close()
        return Response(rejection, media_type=result_content_type(RECEIVE_PACK), headers=NO_CACHE_HEADERS)
    recorder: pushes.PushRecorder = request.app.state.push_recorder
    entry = await recorder.begin(push, res, actor)  # journaled before git may move a ref
    try:
        proc = await push.start()  # consumes the body; PushTooLarge before any output
    except BaseException:
        recorder.abandon(entry, push)
        raise
    body = recorder.stream(entry, push, proc)
    return Stream(body, media_type=result_content_type(RECEIVE_PACK), headers=NO_CACHE_HEADERS)


GIT_ROUTES = [info_refs, upload_pack, receive_pack]
