"""Web pages for repositories: list, create, home (README), tree, file, commits, commit, branches,
compare and settings. Same services as the REST API; forms work without JavaScript."""

from collections.abc import Awaitable
from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, get, post
from litestar.params import FromPath, Parameter, QueryParameter, URLEncodedBody
from litestar.response import Redirect, Template

from forge import accounts, repositories
from forge.access import Action, can
from forge.deps import ActorDep, BusDep, DbSession, SettingsDep, StoreDep
from forge.errors import ForgeError
from forge.git import (
    PathNotFound,
    commit_diff,
    compare,
    find_readme,
    is_markdown,
    list_branches,
    list_tags,
    list_tree,
    log,
    read_blob,
)
from forge.git.errors import RepoError
from forge.pages import page
from forge.render import highlight_async, markdown_async
from forge.repositories import RepoResource, RepoUpdate

REPO = "/{owner:str}/{name:str}"


def _ctx(res: RepoResource, principal: Any, base_url: str, **extra: Any) -> dict[str, Any]:
    return {
        "repo": repositories.to_read(res, principal, base_url),
        "can_admin": can(principal, Action.REPO_ADMIN, res),
        "can_write": can(principal, Action.REPO_WRITE, res),
        **extra,
    }


class NewRepoForm(msgspec.Struct, kw_only=True):
    name: str = ""
    description: str = ""
    visibility: str = "private"
    auto_init: str = ""
    csrf_token: str = ""


class RepoListPages(Controller):
    include_in_schema = False

    @get("/repos")
    async def list_page(
        self, request: Request[Any, Any, Any], db_session: DbSession, actor: ActorDep, settings: SettingsDep
    ) -> Template:
        found = await repositories.list_visible(db_session, actor.principal)
        repos = [repositories.to_read(r, actor.principal, settings.effective_base_url) for r in found]
        return page(request, "repos/list.html", repos=repos)

    @get("/repos/new")
    async def new_form(self, request: Request[Any, Any, Any], actor: ActorDep) -> Template | Redirect:
        if not actor.principal.is_authenticated:
            return Redirect("/signin?next=/repos/new", status_code=303)
        return page(request, "repos/new.html", error=None, form=NewRepoForm())

    @post("/repos/new")
    async def create(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        store: StoreDep,
        bus: BusDep,
        data: URLEncodedBody[NewRepoForm],
    ) -> Template | Redirect:
        if not actor.principal.is_authenticated:
            return Redirect("/signin", status_code=303)
        try:
            owner = await accounts.require_by_login(db_session, actor.principal.login)
            repo = await repositories.create(
                db_session,
                store,
                bus,
                actor,
                owner,
                data.name.strip(),
                description=data.description.strip(),
                visibility=data.visibility,
                auto_init=bool(data.auto_init),
            )
        except ForgeError as exc:
            return page(request, "repos/new.html", status_code=exc.status, error=exc.detail, form=data)
        return Redirect(f"/{owner.login}/{repo.name}", status_code=303)


class RepoPages(Controller):
    path = REPO
    include_in_schema = False

    @get("/")
    async def home(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        store: StoreDep,
        settings: SettingsDep,
        owner: FromPath[str],
        name: FromPath[str],
    ) -> Template:
        res = await repositories.load(db_session, actor.principal, owner, name)
        tree = await store.read(res.key, list_tree, None, "")
        readme = await store.read(res.key, find_readme, None)
        readme_html = None
        if readme is not None and readme.text is not None:
            readme_html = (
                await markdown_async(readme.text)
                if is_markdown(readme.path)
                else await highlight_async("x.txt", readme.text)
            )
        return page(
            request,
            "repos/home.html",
            **_ctx(
                res, actor.principal, settings.effective_base_url, tree=tree, readme=readme, readme_html=readme_html
            ),
        )

    @get(["/tree", "/tree/{path:path}"])
    async def tree(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        store: StoreDep,
        settings: SettingsDep,
        owner: FromPath[str],
        name: FromPath[str],
        path: FromPath[str] = "/",
        ref: Annotated[str | None, Parameter(max_length=255)] = None,
    ) -> Template:
        res = await repositories.load(db_session, actor.principal, owner, name)
        listing = await store.read(res.key, list_tree, ref, path.strip("/"))
        return page(
            request, "repos/tree.html", **_ctx(res, actor.principal, settings.effective_base_url, tree=listing, ref=ref)
        )

    @get("/blob/{path:path}")
    async def blob(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        store: StoreDep,
        settings: SettingsDep,
        owner: FromPath[str],
        name: FromPath[str],
        path: FromPath[str],
        ref: Annotated[str | None, Parameter(max_length=255)] = None,
    ) -> Template:
        res = await repositories.load(db_session, actor.principal, owner, name)
        info = await store.read(res.key, read_blob, ref, path.strip("/"))
        code = await highlight_async(info.name, info.text) if info.text is not None else None
        rendered = await markdown_async(info.text) if info.text is not None and is_markdown(info.path) else None
        return page(
            request,
            "repos/blob.html",
            **_ctx(res, actor.principal, settings.effective_base_url, blob=info, code=code, rendered=rendered, ref=ref),
        )

    @get("/commits")
    async def commits(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        store: StoreDep,
        settings: SettingsDep,
        owner: FromPath[str],
        name: FromPath[str],
        ref: Annotated[str | None, Parameter(max_length=255)] = None,
        page_: Annotated[int, QueryParameter(name="page", ge=1, le=100_000)] = 1,
    ) -> Template:
        res = await repositories.load(db_session, actor.principal, owner, name)
        found = await store.read(res.key, log, ref, page=page_, per_page=30)
        return page(
            request,
            "repos/commits.html",
            **_ctx(res, actor.principal, settings.effective_base_url, commits=found, ref=ref),
        )

    @get("/commit/{sha:str}")
    async def commit(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        store: StoreDep,
        settings: SettingsDep,
        owner: FromPath[str],
        name: FromPath[str],
        sha: FromPath[str],
    ) -> Template:
        res = await repositories.load(db_session, actor.principal, owner, name)
        diff = await store.read(res.key, commit_diff, sha)
        return page(request, "repos/commit.html", **_ctx(res, actor.principal, settings.effective_base_url, diff=diff))

    @get("/branches")
    async def branches(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        store: StoreDep,
        settings: SettingsDep,
        owner: FromPath[str],
        name: FromPath[str],
    ) -> Template:
        res = await repositories.load(db_session, actor.principal, owner, name)
        return page(
            request,
            "repos/branches.html",
            **_ctx(
                res,
                actor.principal,
                settings.effective_base_url,
                branches=await store.read(res.key, list_branches),
                tags=await store.read(res.key, list_tags),
            ),
        )

    @get("/compare/{spec:path}")
    async def compare_page(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        store: StoreDep,
        settings: SettingsDep,
        owner: FromPath[str],
        name: FromPath[str],
        spec: FromPath[str],
    ) -> Template:
        res = await repositories.load(db_session, actor.principal, owner, name)
        base, sep, head = spec.strip("/").partition("...")
        comparison = None
        error = None
        if sep and base and head:
            try:
                comparison = await store.read(res.key, compare, base, head)
            except (RepoError, PathNotFound) as exc:
                error = str(exc)
        else:
            error = "compare needs base...head"
        return page(
            request,
            "repos/compare.html",
            **_ctx(
                res, actor.principal, settings.effective_base_url, cmp=comparison, error=error, spec=spec.strip("/")
            ),
        )


class SettingsForm(msgspec.Struct, kw_only=True):
    description: str = ""
    visibility: str = "private"
    default_branch: str = ""
    archived: str = ""
    csrf_token: str = ""


class CollaboratorForm(msgspec.Struct, kw_only=True):
    login: str = ""
    role: str = "read"
    csrf_token: str = ""


class RuleForm(msgspec.Struct, kw_only=True):
    pattern: str = ""
    allow_force_push: str = ""
    allow_deletion: str = ""
    csrf_token: str = ""


class RepoSettingsPages(Controller):
    path = REPO + "/settings"
    include_in_schema = False

    async def _render(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        res: RepoResource,
        actor: ActorDep,
        base_url: str,
        status_code: int = 200,
        **extra: Any,
    ) -> Template:
        return page(
            request,
            "repos/settings.html",
            status_code=status_code,
            **_ctx(
                res,
                actor.principal,
                base_url,
                collaborators=await repositories.list_collaborators(db_session, res),
                rules=await repositories.branch_rules(db_session, res.repo),
                **extra,
            ),
        )

    async def _apply(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        res: RepoResource,
        actor: ActorDep,
        base_url: str,
        change: Awaitable[object],
    ) -> Template:
        """Run one settings change and show the page again, with the refusal when there is one."""
        try:
            await change
        except ForgeError as exc:
            return await self._render(
                request, db_session, res, actor, base_url, status_code=exc.status, error=exc.detail
            )
        return await self._render(request, db_session, res, actor, base_url, notice="saved")

    @get("/")
    async def index(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        settings: SettingsDep,
        owner: FromPath[str],
        name: FromPath[str],
    ) -> Template:
        res = await repositories.load(db_session, actor.principal, owner, name, Action.REPO_ADMIN)
        return await self._render(request, db_session, res, actor, settings.effective_base_url)

    @post("/")
    async def update(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        store: StoreDep,
        settings: SettingsDep,
        owner: FromPath[str],
        name: FromPath[str],
        data: URLEncodedBody[SettingsForm],
    ) -> Template:
        res = await repositories.load(db_session, actor.principal, owner, name, Action.REPO_ADMIN)
        fields = {
            "description": data.description,
            "visibility": data.visibility,
            "default_branch": data.default_branch or None,
            "archived": bool(data.archived),
        }
        try:
            change = msgspec.convert(fields, RepoUpdate)
        except msgspec.ValidationError as exc:
            return await self._render(
                request, db_session, res, actor, settings.effective_base_url, status_code=422, error=str(exc)
            )
        base_url = settings.effective_base_url
        return await self._apply(
            request, db_session, res, actor, base_url, repositories.update(db_session, store, actor, res, change)
        )

    @post("/collaborators")
    async def collaborator(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        settings: SettingsDep,
        owner: FromPath[str],
        name: FromPath[str],
        data: URLEncodedBody[CollaboratorForm],
    ) -> Template:
        res = await repositories.load(db_session, actor.principal, owner, name, Action.REPO_ADMIN)
        login = data.login.strip()
        change = (
            repositories.remove_collaborator(db_session, actor, res, login)
            if data.role == "remove"
            else repositories.set_collaborator(db_session, actor, res, login, data.role)  # type: ignore[arg-type]
        )
        return await self._apply(request, db_session, res, actor, settings.effective_base_url, change)

    @post("/rules")
    async def rule(
        self,
        request: Request[Any, Any, Any],
        db_session: DbSession,
        actor: ActorDep,
        settings: SettingsDep,
        owner: FromPath[str],
        name: FromPath[str],
        data: URLEncodedBody[RuleForm],
    ) -> Template:
        res = await repositories.load(db_session, actor.principal, owner, name, Action.REPO_ADMIN)
        change = repositories.add_branch_rule(
            db_session,
            actor,
            res,
            data.pattern,
            allow_force_push=bool(data.allow_force_push),
            allow_deletion=bool(data.allow_deletion),
        )
        return await self._apply(request, db_session, res, actor, settings.effective_base_url, change)
