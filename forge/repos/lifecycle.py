"""Repositories' life in the database and on disk together: create, import, change settings
(rename, visibility, default branch, archive), transfer to another owner, delete. Each use case checks everything first,
then writes the row, then the bare repository (through `forge.git.RepoStore`), so a refusal or a
database error leaves nothing half-done."""

from collections.abc import Callable
from typing import Annotated

import msgspec
from sqlalchemy import delete as sa_delete
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from forge.accounts import accounts
from forge.core.access import INSTANCE, Action, Visibility, can, require
from forge.core.error_codes import Code
from forge.core.errors import Conflict, Forbidden, InvalidInput
from forge.core.text import require_no_nul
from forge.db import audit
from forge.db.audit import Actor
from forge.db.events import EventBus
from forge.db.models import Account, Collaborator, Repository
from forge.git import Identity, InvalidName, RepoStore, list_branches, validate_branch_name, validate_repo_name
from forge.git.bare import default_branch as storage_default_branch
from forge.git.bare import set_default_branch
from forge.repos.repositories import RepoResource, VisibilityName, find


class RepoCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=100)]
    description: Annotated[str, msgspec.Meta(max_length=1000)] = ""
    visibility: VisibilityName = "private"
    auto_init: bool = False
    default_branch: Annotated[str, msgspec.Meta(min_length=1, max_length=255)] = "main"


class RepoUpdate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str | None = None
    description: str | None = None
    visibility: VisibilityName | None = None
    default_branch: str | None = None
    archived: bool | None = None
    protect_default_branch: bool | None = None
    # An issue opened by someone without write access may be handed to an agent (docs/issues.md).
    untrusted_issues_to_agents: bool | None = None


def _check_visibility(visibility: str) -> None:
    if visibility not in {v.value for v in Visibility}:
        raise InvalidInput("visibility is private, internal or public", code=Code.INVALID_VISIBILITY)


def _check_name(validate: Callable[[str], object], name: str) -> None:
    """A name the git layer accepts, or 422 `invalid_name` with its reason."""
    try:
        validate(name)
    except InvalidName as exc:
        raise InvalidInput(str(exc), code=Code.INVALID_NAME) from None


async def _new_row(
    session: AsyncSession, owner: Account, name: str, visibility: str, description: str, default_branch: str | None
) -> Repository:
    """Validate a new repository and add its row (flushed, not committed: git comes next)."""
    _check_name(validate_repo_name, name)
    if default_branch is not None:
        _check_name(validate_branch_name, default_branch)
    _check_visibility(visibility)
    full_name = f"{owner.login}/{name}"
    if await find(session, owner.login, name) is not None:
        raise Conflict(f"{full_name} already exists", code=Code.REPO_EXISTS)
    repo = Repository(
        owner_id=owner.id,
        name=name,
        name_key=name.lower(),
        description=require_no_nul(description[:1000], "a description"),
        visibility=visibility,
    )
    if default_branch is not None:
        repo.default_branch = default_branch
    session.add(repo)
    # Two concurrent creates of one name: the unique constraint decides (PostgreSQL does not
    # serialise writers the way SQLite's BEGIN IMMEDIATE does).
    try:
        await session.flush()
    except IntegrityError:
        raise Conflict(f"{full_name} already exists", code=Code.REPO_EXISTS) from None
    return repo


async def create(
    session: AsyncSession,
    store: RepoStore,
    bus: EventBus,
    actor: Actor,
    owner: Account,
    name: str,
    *,
    description: str = "",
    visibility: str = Visibility.PRIVATE,
    default_branch: str = "main",
    auto_init: bool = False,
) -> Repository:
    principal = actor.principal
    if principal.account_id != owner.id and not can(principal, Action.INSTANCE_ADMIN, INSTANCE):
        raise Forbidden("you can only create repositories for yourself", code=Code.FORBIDDEN)
    repo = await _new_row(session, owner, name, visibility, description, default_branch)
    key = (owner.login.lower(), name.lower())
    author = Identity(name=owner.display_name or owner.login, email=f"{owner.login}@users.noreply.forgehand")
    # The row is flushed but not committed: if git fails, the transaction rolls back with it.
    await store.create(
        key, default_branch=default_branch, description=description, readme_author=author if auto_init else None
    )
    audit.record(session, actor, "repo.create", f"{owner.login}/{name}", visibility=visibility, auto_init=auto_init)
    await session.refresh(repo, ["owner"])
    return repo


async def create_own(
    session: AsyncSession, store: RepoStore, bus: EventBus, actor: Actor, spec: RepoCreate
) -> Repository:
    """Create a repository owned by the caller (REST and the web form)."""
    owner = await accounts.require_by_login(session, actor.principal.login)
    return await create(
        session,
        store,
        bus,
        actor,
        owner,
        spec.name,
        description=spec.description,
        visibility=spec.visibility,
        default_branch=spec.default_branch,
        auto_init=spec.auto_init,
    )


async def import_existing(
    session: AsyncSession,
    store: RepoStore,
    actor: Actor,
    owner: Account,
    name: str,
    source: str,
    *,
    visibility: str = Visibility.PRIVATE,
    description: str = "",
) -> Repository:
    """Import every branch and tag of a repository on this machine (a path or a file:// URL)."""
    repo = await _new_row(session, owner, name, visibility, description, None)
    key = (owner.login.lower(), name.lower())
    await store.import_from(key, source)
    repo.default_branch = await store.read(key, storage_default_branch) or "main"
    audit.record(session, actor, "repo.import", f"{owner.login}/{name}", source=source)
    await session.refresh(repo, ["owner"])
    return repo


async def update(
    session: AsyncSession, store: RepoStore, actor: Actor, res: RepoResource, change: RepoUpdate
) -> RepoResource:
    """Apply a settings change: every check first, then the row, then the disk (so a refused
    change leaves nothing half-applied)."""
    require(actor.principal, Action.REPO_ADMIN, res)
    repo = res.repo
    if change.description is not None:
        require_no_nul(change.description, "a description")
    if change.visibility is not None:
        _check_visibility(change.visibility)
    new_branch = change.default_branch if change.default_branch not in (None, repo.default_branch) else None
    if new_branch is not None:
        _check_name(validate_branch_name, new_branch)
        names = {b.name for b in await store.read(res.key, list_branches)}
        if names and new_branch not in names:
            raise InvalidInput(f"there is no branch {new_branch!r}", code=Code.BRANCH_NOT_FOUND)
    new_name = change.name if change.name not in (None, repo.name) else None
    if new_name is not None:
        _check_name(validate_repo_name, new_name)
        if new_name.lower() != repo.name_key and await find(session, repo.owner.login, new_name) is not None:
            raise Conflict(f"{repo.owner.login}/{new_name} already exists", code=Code.REPO_EXISTS)

    changed: dict[str, object] = {}
    if change.description is not None and change.description != repo.description:
        repo.description = change.description[:1000]
        changed["description"] = True
    if change.visibility is not None and change.visibility != repo.visibility:
        repo.visibility = change.visibility
        changed["visibility"] = change.visibility
    if change.archived is not None and change.archived != repo.archived:
        repo.archived = change.archived
        changed["archived"] = change.archived
    if change.protect_default_branch is not None and change.protect_default_branch != repo.protect_default_branch:
        repo.protect_default_branch = change.protect_default_branch
        changed["protect_default_branch"] = change.protect_default_branch
    untrusted = change.untrusted_issues_to_agents
    if untrusted is not None and untrusted != repo.untrusted_issues_to_agents:
        repo.untrusted_issues_to_agents = untrusted
        changed["untrusted_issues_to_agents"] = untrusted
    old_key = res.key
    if new_branch is not None:
        repo.default_branch = new_branch
        changed["default_branch"] = new_branch
    if new_name is not None:
        changed["renamed_from"] = repo.name
        repo.name = new_name
        repo.name_key = new_name.lower()
    await session.flush()
    # The disk last: a database error above leaves git untouched.
    if new_branch is not None:
        await store.write(old_key, set_default_branch, new_branch)
    if new_name is not None and old_key != res.key:
        await store.rename(old_key, res.key)
    if changed:
        audit.record(session, actor, "repo.update", res.full_name, **changed)
    return res


def require_confirmation(res: RepoResource, confirm: str) -> None:
    """What cannot be undone (delete, transfer, rename) needs the repository's full name typed."""
    if confirm.strip() != res.full_name:
        raise InvalidInput(f"type {res.full_name!r} to confirm", code=Code.CONFIRMATION_REQUIRED)


class RepoTransfer(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    new_owner: Annotated[str, msgspec.Meta(min_length=1, max_length=100)]
    confirm: Annotated[str, msgspec.Meta(max_length=300)] = ""


async def transfer(
    session: AsyncSession, store: RepoStore, actor: Actor, res: RepoResource, new_owner: str, confirm: str
) -> RepoResource:
    """Give the repository to another account (its owner or an instance admin, after typing its
    full name). Tasks, webhooks, collaborators and history go with it; the new owner is its admin
    and the previous owner keeps no role (add them as a collaborator first to keep one)."""
    require(actor.principal, Action.REPO_TRANSFER, res)
    require_confirmation(res, confirm)
    target = await accounts.require_by_login(session, new_owner.strip())
    repo = res.repo
    if target.id == repo.owner_id:
        raise InvalidInput(f"{target.login} owns {res.full_name} already", code=Code.INVALID_TRANSFER)
    if target.disabled:
        raise InvalidInput(f"{target.login} is disabled", code=Code.INVALID_TRANSFER)
    if await find(session, target.login, repo.name) is not None:
        raise Conflict(f"{target.login}/{repo.name} already exists", code=Code.REPO_EXISTS)
    old_key, old_full_name = res.key, res.full_name
    # The new owner is admin by ownership: an explicit role of theirs would only linger.
    await session.execute(
        sa_delete(Collaborator).where(Collaborator.repo_id == repo.id, Collaborator.account_id == target.id)
    )
    res.roles.pop(target.id, None)
    repo.owner = target
    try:
        await session.flush()
    except IntegrityError:
        raise Conflict(f"{target.login}/{repo.name} already exists", code=Code.REPO_EXISTS) from None
    await store.rename(old_key, res.key)  # the disk last: a database error above leaves git untouched
    audit.record(session, actor, "repo.transfer", res.full_name, transferred_from=old_full_name)
    return res


async def remove(session: AsyncSession, store: RepoStore, actor: Actor, res: RepoResource, confirm: str) -> None:
    """Delete a repository (instance admins only) after the caller typed its full name."""
    if not can(actor.principal, Action.INSTANCE_ADMIN, INSTANCE):
        raise Forbidden("only instance admins delete repositories; archive it instead", code=Code.FORBIDDEN)
    require_confirmation(res, confirm)
    audit.record(session, actor, "repo.delete", res.full_name)
    await session.delete(res.repo)
    await session.flush()
    await store.delete(res.key)
