"""A repository's settings pages: general (description, visibility, default branch), collaborators,
branch rules, and the danger zone (rename, transfer, delete). Forms work without JavaScript; a
refused form comes back as typed with the reason beside its field."""

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from litestar import Controller, get, post
from litestar.params import FromPath, Parameter, URLEncodedBody
from litestar.response import Redirect, Template
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import INSTANCE, Action, can
from forge.core.error_codes import Code
from forge.core.errors import ForgeError, InvalidInput, NotFound
from forge.db.models import Repository
from forge.http.deps import ActorDep, DbSession, StoreDep
from forge.http.pages.common import WebForm, or_form_error, page
from forge.http.pages.forms import NO_ERRORS, form_errors
from forge.http.pages.repos import REPO, VIEWS, RepoView, RepoViews, ViewsDep
from forge.repos import branch_rules, collaborators, lifecycle, repositories
from forge.repos.lifecycle import RepoUpdate
from forge.repos.repositories import RepoResource


class SettingsForm(WebForm):
    description: str = ""
    visibility: str = "private"
    default_branch: str = ""
    archived: str = ""
    untrusted_issues_to_agents: str = ""


def settings_form(repo: Repository) -> SettingsForm:
    """The stored settings as the General form shows them."""
    return SettingsForm(
        description=repo.description,
        visibility=repo.visibility,
        default_branch=repo.default_branch,
        archived="1" if repo.archived else "",
        untrusted_issues_to_agents="1" if repo.untrusted_issues_to_agents else "",
    )


class CollaboratorForm(WebForm):
    login: str = ""
    role: str = "read"


class DangerForm(WebForm):
    """Rename (`new_name`), transfer (`new_owner`) or delete: each needs the full name typed."""

    confirm: str = ""
    new_name: str = ""
    new_owner: str = ""


# Notices the settings page shows after a redirect (`?done=`): fixed texts, nothing reflected.
DONE_NOTICES = {
    "renamed": "Renamed. The old address no longer works: point your clones at the new one "
    "(git remote set-url origin NEW-URL).",
    "collaborator-removed": "Collaborator removed.",
}


class RuleForm(WebForm):
    pattern: str = ""
    allow_force_push: str = ""
    allow_deletion: str = ""
    required_checks: str = ""  # status contexts, separated by commas or spaces
    require_pull_request: str = ""
    required_approvals: str = ""
    dismiss_stale_approvals: str = ""
    require_code_owner_review: str = ""
    block_on_requested_changes: str = ""
    merge_allowlist: str = ""  # logins, separated by commas or spaces


def pull_rules(form: RuleForm) -> branch_rules.PullRules:
    """What the rule asks of pull requests; a count that is not a whole number is refused at its field."""
    raw = form.required_approvals.strip() or "0"
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 6:
        raise InvalidInput(
            f"required approvals is a whole number from 0 to {branch_rules.MAX_REQUIRED_APPROVALS}",
            code=Code.INVALID_REQUIRED_APPROVALS,
        )
    return branch_rules.PullRules(
        require_pull_request=bool(form.require_pull_request),
        required_approvals=int(raw),
        dismiss_stale_approvals=bool(form.dismiss_stale_approvals),
        require_code_owner_review=bool(form.require_code_owner_review),
        block_on_requested_changes=bool(form.block_on_requested_changes),
        merge_allowlist=form.merge_allowlist.replace(",", " ").split()[:100],
    )


@dataclass(frozen=True)
class SettingsSection:
    """One form of the settings page: its inputs (ids unique on the page) and the refusals (codes
    or wire names) that concern each."""

    name: str
    inputs: tuple[str, ...]
    aliases: Mapping[str, str]


GENERAL = SettingsSection(
    "general",
    ("description", "visibility", "default_branch", "archived"),
    {
        "invalid_characters": "description",
        "invalid_visibility": "visibility",
        "invalid_name": "default_branch",
        "branch_not_found": "default_branch",
    },
)
COLLABORATORS = SettingsSection(
    "collaborator",
    ("collab-login", "collab-role"),
    {
        "account_not_found": "collab-login",
        "owner_role": "collab-login",
        "invalid_role": "collab-role",
    },
)
RULES = SettingsSection(
    "rule",
    ("pattern", "required_checks", "required_approvals", "merge_allowlist"),
    {
        "invalid_pattern": "pattern",
        "invalid_required_checks": "required_checks",
        "invalid_required_approvals": "required_approvals",
        "invalid_mergers": "merge_allowlist",
    },
)


class RepoSettingsPages(Controller):
    path = REPO + "/settings"
    include_in_schema = False
    dependencies = VIEWS

    async def _render(
        self,
        db_session: AsyncSession,
        view: RepoView,
        status_code: int = 200,
        *,
        typed: Mapping[str, WebForm] | None = None,
        **extra: Any,
    ) -> Template:
        """The page; `typed`: a refused form as it was sent (by section name), shown in place of its
        stored or blank values."""
        members = await collaborators.list_collaborators(db_session, view.res)
        rules = await repositories.branch_rules(db_session, view.res.repo)
        forms: dict[str, WebForm] = {
            GENERAL.name: settings_form(view.res.repo),
            COLLABORATORS.name: CollaboratorForm(),
            RULES.name: RuleForm(required_approvals="0", dismiss_stale_approvals="1", block_on_requested_changes="1"),
            **(typed or {}),
        }
        return view.render(
            "repos/settings.html",
            status_code,
            collaborators=members,
            rules=rules,
            can_transfer=can(view.principal, Action.REPO_TRANSFER, view.res),
            can_delete=can(view.principal, Action.INSTANCE_ADMIN, INSTANCE),
            forms=forms,
            **{"danger": None, "danger_form": DangerForm(), "errors": NO_ERRORS, "refused_form": "", **extra},
        )

    def _refused(
        self,
        db_session: AsyncSession,
        views: RepoViews,
        view: RepoView,
        section: str,
        form: DangerForm,
        *,
        rollback: bool = True,
    ) -> Callable[[ForgeError], Awaitable[Template]]:
        """A refused danger-zone action: the page again, the reason inside that action's section
        (`rollback`: what the refused change flushed goes, the repository is read again)."""

        async def again(exc: ForgeError) -> Template:
            shown = view
            if rollback:
                await db_session.rollback()
                shown = await views.load(Action.REPO_ADMIN)
            return await self._render(db_session, shown, refused=exc, danger=section, danger_form=form)

        return again

    async def _submit(
        self,
        db_session: AsyncSession,
        view: RepoView,
        section: SettingsSection,
        form: WebForm,
        change: Callable[[], Awaitable[object]],
    ) -> Template:
        """Run one settings form's change and show the page again: saved, or the form as it was
        sent with the refusal beside the field it concerns (the services check before they write)."""

        async def again(exc: ForgeError) -> Template:
            errors = form_errors(exc, section.inputs, section.aliases)
            return await self._render(
                db_session, view, refused=exc, errors=errors, refused_form=section.name, typed={section.name: form}
            )

        changed = await or_form_error(change(), again, raise_404=False)
        if isinstance(changed, Template):
            return changed
        return await self._render(db_session, view, notice="saved")

    @get("/")
    async def index(
        self, db_session: DbSession, views: ViewsDep, done: Annotated[str, Parameter(max_length=40)] = ""
    ) -> Template:
        view = await views.load(Action.REPO_ADMIN)
        return await self._render(db_session, view, notice=DONE_NOTICES.get(done))

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
        change = RepoUpdate(
            description=data.description,
            visibility=data.visibility,  # type: ignore[arg-type]  # checked by the service
            default_branch=data.default_branch.strip() or None,
            archived=bool(data.archived),
            untrusted_issues_to_agents=bool(data.untrusted_issues_to_agents),
        )
        return await self._submit(
            db_session, view, GENERAL, data, lambda: lifecycle.update(db_session, store, actor, view.res, change)
        )

    @post("/collaborators")
    async def collaborator(
        self, db_session: DbSession, actor: ActorDep, views: ViewsDep, data: URLEncodedBody[CollaboratorForm]
    ) -> Template:
        view = await views.load(Action.REPO_ADMIN)

        async def change() -> object:
            role = data.role  # checked by the service
            return await collaborators.set_collaborator(db_session, actor, view.res, data.login.strip(), role)  # type: ignore[arg-type]

        return await self._submit(db_session, view, COLLABORATORS, data, change)

    @get("/collaborators/{login:str}/remove")
    async def confirm_remove_collaborator(
        self, db_session: DbSession, views: ViewsDep, login: FromPath[str]
    ) -> Template:
        view = await views.load(Action.REPO_ADMIN)
        found = [
            c for c in await collaborators.list_collaborators(db_session, view.res) if c.login.lower() == login.lower()
        ]
        if not found or found[0].login.lower() == view.res.repo.owner.login.lower():
            raise NotFound(
                f"{login} is not a collaborator (the owner is always an admin)", code=Code.COLLABORATOR_NOT_FOUND
            )
        return view.render("repos/collaborator_remove.html", collaborator=found[0])

    @post("/collaborators/{login:str}/remove")
    async def remove_collaborator(
        self, db_session: DbSession, actor: ActorDep, views: ViewsDep, login: FromPath[str]
    ) -> Redirect:
        view = await views.load(Action.REPO_ADMIN)
        await collaborators.remove_collaborator(db_session, actor, view.res, login)
        return Redirect(
            f"/{view.res.full_name}/settings/?done=collaborator-removed#collaborators-section", status_code=303
        )

    @post("/rename")
    async def rename(
        self, db_session: DbSession, actor: ActorDep, store: StoreDep, views: ViewsDep, data: URLEncodedBody[DangerForm]
    ) -> Template | Redirect:
        view = await views.load(Action.REPO_ADMIN)

        async def rename() -> RepoResource:
            lifecycle.require_confirmation(view.res, data.confirm)
            change = RepoUpdate(name=data.new_name.strip())
            return await lifecycle.update(db_session, store, actor, view.res, change)

        renamed = await or_form_error(rename(), self._refused(db_session, views, view, "rename", data), raise_404=False)
        if isinstance(renamed, Template):
            return renamed
        return Redirect(f"/{view.res.full_name}/settings/?done=renamed#danger-zone", status_code=303)

    @post("/transfer")
    async def transfer(
        self, db_session: DbSession, actor: ActorDep, store: StoreDep, views: ViewsDep, data: URLEncodedBody[DangerForm]
    ) -> Template:
        view = await views.load(Action.REPO_ADMIN)
        old_name = view.res.full_name
        res = await or_form_error(
            lifecycle.transfer(db_session, store, actor, view.res, data.new_owner, data.confirm),
            self._refused(db_session, views, view, "transfer", data),
            raise_404=False,
        )
        if isinstance(res, Template):
            return res
        still_reads = can(view.principal, Action.REPO_READ, res)
        return page(
            view.request,
            "repos/gone.html",
            old_name=old_name,
            new_name=res.full_name if still_reads else None,
            moved_to=res.repo.owner.login,
        )

    @post("/delete")
    async def delete_repo(
        self, db_session: DbSession, actor: ActorDep, store: StoreDep, views: ViewsDep, data: URLEncodedBody[DangerForm]
    ) -> Template:
        view = await views.load(Action.REPO_ADMIN)
        old_name = view.res.full_name
        removed = await or_form_error(
            lifecycle.remove(db_session, store, actor, view.res, data.confirm),
            self._refused(db_session, views, view, "delete", data, rollback=False),
            raise_404=False,
        )
        if isinstance(removed, Template):
            return removed
        return page(view.request, "repos/gone.html", old_name=old_name, deleted=True)

    @post("/rules")
    async def rule(
        self, db_session: DbSession, actor: ActorDep, views: ViewsDep, data: URLEncodedBody[RuleForm]
    ) -> Template:
        view = await views.load(Action.REPO_ADMIN)

        async def change() -> object:
            return await branch_rules.add_branch_rule(
                db_session,
                actor,
                view.res,
                data.pattern,
                allow_force_push=bool(data.allow_force_push),
                allow_deletion=bool(data.allow_deletion),
                required=data.required_checks.replace(",", " ").split()[:100],
                pulls=pull_rules(data),
            )

        return await self._submit(db_session, view, RULES, data, change)
