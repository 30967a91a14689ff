"""Web pages for repositories: list, create, home (README), tree, file, commits, commit, branches,
compare and settings. Same services as the REST API; forms work without JavaScript."""

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, Parameter, QueryParameter, URLEncodedBody
from litestar.response import Redirect, Template
from sqlalchemy.ext.asyncio import AsyncSession

from forge import branch_rules, repo_collaborators, repo_lifecycle, repositories
from forge.access import Action, Principal, can
from forge.deps import ActorDep, BaseUrlDep, BusDep, DbSession, PathRepo, StoreDep
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
from forge.pages import WebForm, page
from forge.render import highlight_async, markdown_async
from forge.repo_lifecycle import RepoCreate, RepoUpdate
from forge.repositories import RepoResource

REPO = "/{owner:str}/{name:str}"
Ref = Annotated[str | None, Parameter(max_length=255)]


@dataclass
class RepoView:
    """The repository of the path as the caller sees it, and how its pages render."""

    request: Request[Any, Any, Any]
    res: RepoResource
    principal: Principal
    base_url: str

    @property
    def key(self) -> tuple[str, str]:
        return self.res.key

    def render(self, template: str, status_code: int = 200, **extra: Any) -> Template:
        principal = self.principal
        return page(
            self.request,
            template,
            status_code=status_code,
            repo=repositories.to_read(self.res, principal, self.base_url),
            can_admin=can(principal, Action.REPO_ADMIN, self.res),
            can_write=can(principal, Action.REPO_WRITE, self.res),
            **extra,
        )


@dataclass
class RepoViews:
    """Loads the repository of the path for a page (`await views.load(action)`: the access rule
    decides, below read access 404)."""

    request: Request[Any, Any, Any]
    path_repo: PathRepo
    base_url: str

    async def load(self, action: Action = Action.REPO_READ) -> RepoView:
        res = await self.path_repo.load(action)
        return RepoView(self.request, res, self.path_repo.principal, self.base_url)


def provide_views(
    request: Request[Any, Any, Any], path_repo: NamedDependency[PathRepo], base_url: NamedDependency[str]
) -> RepoViews:
    return RepoViews(request, path_repo, base_url)


VIEWS = {"views": Provide(provide_views, sync_to_thread=False)}
ViewsDep = NamedDependency[RepoViews]


class NewRepoForm(WebForm):
    name: str = ""
    description: str = ""
    visibility: str = "private"
    auto_init: str = ""


class RepoListPages(Controller):
    include_in_schema = False

    @get("/repos")
    async def list_page(
        self, request: Request[Any, Any, Any], db_session: DbSession, actor: ActorDep, base_url: BaseUrlDep
    ) -> Template:
        found = await repositories.list_visible(db_session, actor.principal)
        repos = [repositories.to_read(r, actor.principal, base_url) for r in found]
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
        spec = RepoCreate(
            name=data.name.strip(),
            description=data.description.strip(),
            visibility=data.visibility,  # type: ignore[arg-type]  # checked by the service
            auto_init=bool(data.auto_init),
        )
        try:
            repo = await repo_lifecycle.create_own(db_session, store, bus, actor, spec)
        except ForgeError as exc:
            return page(request, "repos/new.html", status_code=exc.status, error=exc.detail, form=data)
        return Redirect(f"/{repo.owner.login}/{repo.name}", status_code=303)


class RepoPages(Controller):
    path = REPO
    include_in_schema = False
    dependencies = VIEWS

    @get("/")
    async def home(self, views: ViewsDep, store: StoreDep) -> Template:
        view = await views.load()
        tree = await store.read(view.key, list_tree, None, "")
        readme = await store.read(view.key, find_readme, None)
        readme_html = None
        if readme is not None and readme.text is not None:
            readme_html = (
                await markdown_async(readme.text)
                if is_markdown(readme.path)
                else await highlight_async("x.txt", readme.text)
            )
        return view.render("repos/home.html", tree=tree, readme=readme, readme_html=readme_html)

    @get(["/tree", "/tree/{path:path}"])
    async def tree(self, views: ViewsDep, store: StoreDep, path: FromPath[str] = "/", ref: Ref = None) -> Template:
        view = await views.load()
        listing = await store.read(view.key, list_tree, ref, path.strip("/"))
        return view.render("repos/tree.html", tree=listing, ref=ref)

    @get("/blob/{path:path}")
    async def blob(self, views: ViewsDep, store: StoreDep, path: FromPath[str], ref: Ref = None) -> Template:
        view = await views.load()
        info = await store.read(view.key, read_blob, ref, path.strip("/"))
        code = await highlight_async(info.name, info.text) if info.text is not None else None
        rendered = await markdown_async(info.text) if info.text is not None and is_markdown(info.path) else None
        return view.render("repos/blob.html", blob=info, code=code, rendered=rendered, ref=ref)

    @get("/commits")
    async def commits(
        self,
        views: ViewsDep,
        store: StoreDep,
        ref: Ref = None,
        page_: Annotated[int, QueryParameter(name="page", ge=1, le=100_000)] = 1,
    ) -> Template:
        view = await views.load()
        found = await store.read(view.key, log, ref, page=page_, per_page=30)
        return view.render("repos/commits.html", commits=found, ref=ref)

    @get("/commit/{sha:str}")
    async def commit(self, views: ViewsDep, store: StoreDep, sha: FromPath[str]) -> Template:
        view = await views.load()
        return view.render("repos/commit.html", diff=await store.read(view.key, commit_diff, sha))

    @get("/branches")
    async def branches(self, views: ViewsDep, store: StoreDep) -> Template:
        view = await views.load()
        return view.render(
            "repos/branches.html",
            branches=await store.read(view.key, list_branches),
            tags=await store.read(view.key, list_tags),
        )

    @get("/compare/{spec:path}")
    async def compare_page(self, views: ViewsDep, store: StoreDep, spec: FromPath[str]) -> Template:
        view = await views.load()
        base, sep, head = spec.strip("/").partition("...")
        comparison = None
        error = None
        if sep and base and head:
            try:
                comparison = await store.read(view.key, compare, base, head)
            except (RepoError, PathNotFound) as exc:
                error = str(exc)
        else:
            error = "compare needs base...head"
        return view.render("repos/compare.html", cmp=comparison, error=error, spec=spec.strip("/"))


class SettingsForm(WebForm):
    description: str = ""
    visibility: str = "private"
    default_branch: str = ""
    archived: str = ""


class CollaboratorForm(WebForm):
    login: str = ""
    role: str = "read"


class RuleForm(WebForm):
    pattern: str = ""
    allow_force_push: str = ""
    allow_deletion: str = ""


class RepoSettingsPages(Controller):
    path = REPO + "/settings"
    include_in_schema = False
    dependencies = VIEWS

    async def _render(self, db_session: AsyncSession, view: RepoView, status_code: int = 200, **extra: Any) -> Template:
        collaborators = await repo_collaborators.list_collaborators(db_session, view.res)
        rules = await repositories.branch_rules(db_session, view.res.repo)
        return view.render("repos/settings.html", status_code, collaborators=collaborators, rules=rules, **extra)

    async def _apply(self, db_session: AsyncSession, view: RepoView, change: Awaitable[object]) -> Template:
        """Run one settings change and show the page again, with the refusal when there is one."""
        try:
            await change
        except ForgeError as exc:
            return await self._render(db_session, view, status_code=exc.status, error=exc.detail)
        return await self._render(db_session, view, notice="saved")

    @get("/")
    async def index(self, db_session: DbSession, views: ViewsDep) -> Template:
        view = await views.load(Action.REPO_ADMIN)
        return await self._render(db_session, view)

    @post("/")
    async def update(
        self,
        db_session: DbSession,
        actor: ActorDep,
        store: StoreDep,
        views: ViewsDep,
        data: URLEncodedBody[SettingsForm],
    ) -> Template:
        view = await views.load(Action.REPO_ADMIN)
        fields = {
            "description": data.description,
            "visibility": data.visibility,
            "default_branch": data.default_branch or None,
            "archived": bool(data.archived),
        }
        try:
            change = msgspec.convert(fields, RepoUpdate)
        except msgspec.ValidationError as exc:
            return await self._render(db_session, view, status_code=422, error=str(exc))
        return await self._apply(db_session, view, repo_lifecycle.update(db_session, store, actor, view.res, change))

    @post("/collaborators")
    async def collaborator(
        self, db_session: DbSession, actor: ActorDep, views: ViewsDep, data: URLEncodedBody[CollaboratorForm]
    ) -> Template:
        view = await views.load(Action.REPO_ADMIN)
        login = data.login.strip()
        change = (
            repo_collaborators.remove_collaborator(db_session, actor, view.res, login)
            if data.role == "remove"
            else repo_collaborators.set_collaborator(db_session, actor, view.res, login, data.role)  # type: ignore[arg-type]
        )
        return await self._apply(db_session, view, change)

    @post("/rules")
    async def rule(
        self, db_session: DbSession, actor: ActorDep, views: ViewsDep, data: URLEncodedBody[RuleForm]
    ) -> Template:
        view = await views.load(Action.REPO_ADMIN)
        change = branch_rules.add_branch_rule(
            db_session,
            actor,
            view.res,
            data.pattern,
            allow_force_push=bool(data.allow_force_push),
            allow_deletion=bool(data.allow_deletion),
        )
        return await self._apply(db_session, view, change)
