"""Web pages for repositories: list, create and settings, and how every repository page loads its
repository (`RepoViews`) and renders (`RepoView`); the browsing pages are in `forge.pages_browse`.
Same services as the REST API; forms work without JavaScript."""

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import Parameter, URLEncodedBody
from litestar.response import Redirect, Template
from sqlalchemy.ext.asyncio import AsyncSession

from forge import branch_rules, repo_collaborators, repo_lifecycle, repositories
from forge.access import Action, Principal, can
from forge.deps import ActorDep, BaseUrlDep, BusDep, DbSession, PathRepo, StoreDep
from forge.errors import ForgeError
from forge.forms import NO_ERRORS, form_errors
from forge.pages import WebForm, page
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
    request: Request[Any, Any, Any], path_repo: NamedDependency[PathRepo], forge_url: NamedDependency[str]
) -> RepoViews:
    return RepoViews(request, path_repo, forge_url)


VIEWS = {"views": Provide(provide_views, sync_to_thread=False)}
ViewsDep = NamedDependency[RepoViews]


class NewRepoForm(WebForm):
    name: str = ""
    description: str = ""
    visibility: str = "private"
    auto_init: str = ""


# The create service's refusals (their codes) -> the field they concern.
NEW_REPO_ALIASES = {"invalid_name": "name", "repo_exists": "name", "invalid_visibility": "visibility"}


class RepoListPages(Controller):
    include_in_schema = False

    @get("/repos")
    async def list_page(
        self, request: Request[Any, Any, Any], db_session: DbSession, actor: ActorDep, forge_url: BaseUrlDep
    ) -> Template:
        found = await repositories.list_visible(db_session, actor.principal)
        repos = [repositories.to_read(r, actor.principal, forge_url) for r in found]
        return page(request, "repos/list.html", repos=repos)

    @get("/repos/new")
    async def new_form(self, request: Request[Any, Any, Any], actor: ActorDep) -> Template | Redirect:
        if not actor.principal.is_authenticated:
            return Redirect("/signin?next=/repos/new", status_code=303)
        return page(request, "repos/new.html", errors=NO_ERRORS, form=NewRepoForm(auto_init="1"))

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
            errors = form_errors(exc, NewRepoForm.__struct_fields__, NEW_REPO_ALIASES)
            return page(request, "repos/new.html", status_code=exc.status, errors=errors, form=data)
        return Redirect(f"/{repo.owner.login}/{repo.name}", status_code=303)


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
