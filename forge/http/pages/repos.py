"""Web pages for repositories: list and create, and how every repository page loads its repository
(`RepoViews`) and renders (`RepoView`); settings are in `forge.http.pages.repo_settings`, browsing
in `forge.http.pages.browse`.
Same services as the REST API; forms work without JavaScript."""

from dataclasses import dataclass
from typing import Annotated, Any

from litestar import Controller, Request, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import Parameter, URLEncodedBody
from litestar.response import Redirect, Template

from forge.core.access import Action, Principal, can
from forge.core.errors import ForgeError
from forge.http.deps import ActorDep, BaseUrlDep, BusDep, DbSession, PathRepo, StoreDep
from forge.http.pages.common import WebForm, or_form_error, page
from forge.http.pages.forms import NO_ERRORS, form_errors
from forge.repos import lifecycle, repositories
from forge.repos.lifecycle import RepoCreate
from forge.repos.repositories import RepoResource

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

        async def again(exc: ForgeError) -> Template:
            errors = form_errors(exc, NewRepoForm.__struct_fields__, NEW_REPO_ALIASES)
            return page(request, "repos/new.html", refused=exc, errors=errors, form=data)

        repo = await or_form_error(lifecycle.create_own(db_session, store, bus, actor, spec), again, raise_404=False)
        if isinstance(repo, Template):
            return repo
        return Redirect(f"/{repo.owner.login}/{repo.name}", status_code=303)
