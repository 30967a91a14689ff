"""Web pages of a repository's labels and milestones: list them (with each milestone's progress),
and, for the write role, create, change and delete them. Same services as the REST API
(forge/repos/labels.py); a refused form comes back as typed with the reason beside its field."""

from collections.abc import Awaitable
from typing import Any

import msgspec
from litestar import Controller, get, post
from litestar.params import FromPath, URLEncodedBody
from litestar.response import Redirect, Template

from forge.core.access import Action, can
from forge.core.errors import ForgeError
from forge.http.deps import ActorDep, LabelsDep
from forge.http.pages.browse_render import ago, exact
from forge.http.pages.common import WebForm, or_form_error
from forge.http.pages.forms import NO_ERRORS, FormErrors, form_errors, invalid_input
from forge.http.pages.repos import REPO, VIEWS, RepoView, ViewsDep
from forge.repos.issue_shapes import LabelCreate, LabelUpdate, MilestoneCreate, MilestoneUpdate
from forge.repos.labels import Labels


class LabelForm(WebForm):
    name: str = ""
    color: str = "#ededed"
    description: str = ""


class MilestoneForm(WebForm):
    title: str = ""
    description: str = ""
    due_on: str = ""  # YYYY-MM-DD


class StateForm(WebForm):
    state: str = "closed"


def _spec(raw: dict[str, Any], shape: type[msgspec.Struct]) -> Any:
    try:
        return msgspec.convert(raw, shape, strict=False)
    except msgspec.ValidationError as exc:
        raise invalid_input(exc) from None


def _due(raw: str) -> str | None:
    return f"{raw.strip()}T00:00:00Z" if raw.strip() else None


class LabelPages(Controller):
    path = REPO
    include_in_schema = False
    dependencies = VIEWS

    async def _labels_page(
        self,
        view: RepoView,
        repo_labels: Labels,
        *,
        status: int = 200,
        typed: LabelForm | None = None,
        errors: FormErrors = NO_ERRORS,
    ) -> Template:
        return view.render(
            "repos/labels.html", status, tab="issues", labels=await repo_labels.all(view.res),
            can_triage=can(view.principal, Action.ISSUE_TRIAGE, view.res), form=typed or LabelForm(), errors=errors,
        )  # fmt: skip

    @get("/labels")
    async def labels_page(self, views: ViewsDep, repo_labels: LabelsDep) -> Template:
        return await self._labels_page(await views.load(), repo_labels)

    async def _answer(
        self, view: RepoView, repo_labels: Labels, act: Awaitable[Any], typed: LabelForm
    ) -> Template | Redirect:
        async def again(exc: ForgeError) -> Template:
            await repo_labels.session.rollback()
            await repo_labels.session.refresh(view.res.repo)
            await repo_labels.session.refresh(view.res.repo.owner)
            errors = form_errors(
                exc, ("name", "color", "description"), {"label_exists": "name", "invalid_label": "name"}
            )
            return await self._labels_page(view, repo_labels, status=exc.status, typed=typed, errors=errors)

        done = await or_form_error(act, again, raise_404=False)
        return done if isinstance(done, Template) else Redirect(f"/{view.res.full_name}/labels", status_code=303)

    @post("/labels")
    async def create_label(
        self, views: ViewsDep, repo_labels: LabelsDep, actor: ActorDep, data: URLEncodedBody[LabelForm]
    ) -> Template | Redirect:
        view = await views.load()
        raw = {"name": data.name, "color": data.color, "description": data.description}

        async def act() -> Any:
            return await repo_labels.create(actor, view.res, _spec(raw, LabelCreate))

        return await self._answer(view, repo_labels, act(), data)

    @post("/labels/{label:str}/edit")
    async def edit_label(
        self,
        views: ViewsDep,
        repo_labels: LabelsDep,
        actor: ActorDep,
        label: FromPath[str],
        data: URLEncodedBody[LabelForm],
    ) -> Template | Redirect:
        view = await views.load()
        raw = {"new_name": data.name, "color": data.color, "description": data.description}

        async def act() -> Any:
            return await repo_labels.update(actor, view.res, label, _spec(raw, LabelUpdate))

        return await self._answer(view, repo_labels, act(), data)

    @post("/labels/{label:str}/delete")
    async def delete_label(
        self,
        views: ViewsDep,
        repo_labels: LabelsDep,
        actor: ActorDep,
        label: FromPath[str],
        data: URLEncodedBody[WebForm],
    ) -> Template | Redirect:
        view = await views.load()
        return await self._answer(view, repo_labels, repo_labels.delete(actor, view.res, label), LabelForm())

    # -- milestones ------------------------------------------------------------------------

    async def _milestones_page(
        self,
        view: RepoView,
        repo_labels: Labels,
        *,
        status: int = 200,
        typed: MilestoneForm | None = None,
        errors: FormErrors = NO_ERRORS,
    ) -> Template:
        found = await repo_labels.milestone_reads(view.res, await repo_labels.milestones(view.res, "all"))
        return view.render(
            "repos/milestones.html", status, tab="issues", milestones=found,
            can_triage=can(view.principal, Action.ISSUE_TRIAGE, view.res), form=typed or MilestoneForm(),
            errors=errors, ago=ago, exact=exact,
        )  # fmt: skip

    @get("/milestones")
    async def milestones_page(self, views: ViewsDep, repo_labels: LabelsDep) -> Template:
        return await self._milestones_page(await views.load(), repo_labels)

    @post("/milestones")
    async def create_milestone(
        self, views: ViewsDep, repo_labels: LabelsDep, actor: ActorDep, data: URLEncodedBody[MilestoneForm]
    ) -> Template | Redirect:
        view = await views.load()
        raw = {"title": data.title, "description": data.description, "due_on": _due(data.due_on)}

        async def again(exc: ForgeError) -> Template:
            await repo_labels.session.rollback()
            await repo_labels.session.refresh(view.res.repo)
            await repo_labels.session.refresh(view.res.repo.owner)
            errors = form_errors(exc, ("title", "description", "due_on"), {"milestone_exists": "title"})
            return await self._milestones_page(view, repo_labels, status=exc.status, typed=data, errors=errors)

        done = await or_form_error(repo_labels.create_milestone(actor, view.res, _spec(raw, MilestoneCreate)), again)
        return done if isinstance(done, Template) else Redirect(f"/{view.res.full_name}/milestones", status_code=303)

    @post("/milestones/{number:int}/state")
    async def milestone_state(
        self,
        views: ViewsDep,
        repo_labels: LabelsDep,
        actor: ActorDep,
        number: FromPath[int],
        data: URLEncodedBody[StateForm],
    ) -> Redirect:
        view = await views.load()
        await repo_labels.update_milestone(actor, view.res, number, _spec({"state": data.state}, MilestoneUpdate))
        return Redirect(f"/{view.res.full_name}/milestones", status_code=303)
