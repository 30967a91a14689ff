"""The dashboard (`/`): the pull requests and tasks awaiting the signed-in person's review and the
repositories they may see; anonymous visitors are sent to sign in."""

from typing import Any

from litestar import Controller, Request, get
from litestar.response import Redirect, Template

from forge.http.deps import DbSession, SettingsDep
from forge.http.pages.common import page
from forge.repos import repositories
from forge.repos.pull_lists import awaiting_review


class HomePages(Controller):
    include_in_schema = False

    @get("/")
    async def dashboard(
        self, request: Request[Any, Any, Any], db_session: DbSession, settings: SettingsDep
    ) -> Template | Redirect:
        principal = request.scope.get("user")
        if principal is None or not principal.is_authenticated:
            return Redirect("/signin", status_code=303)
        found = await repositories.list_visible(db_session, principal)
        repos = [repositories.to_read(r, principal, settings.effective_base_url) for r in found]
        pulls = await awaiting_review(db_session, principal, found, settings.effective_base_url)
        return page(request, "dashboard.html", repos=repos, pulls_awaiting=pulls)
