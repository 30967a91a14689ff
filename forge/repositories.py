"""Repositories: the database side (ownership, visibility, collaborators, branch rules, pushes)
joined with the git side (`forge.git`, bare repositories on pygit2). Web, REST and git smart
HTTP all go through `load` + `forge.access.require`, so one rule decides every path."""

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import msgspec
from sqlalchemy import delete, func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from forge import accounts, audit
from forge.access import INSTANCE, Action, Principal, Role, Visibility, can, effective_role, require
from forge.audit import Actor
from forge.errors import Conflict, Forbidden, InvalidInput, NotFound
from forge.events import EventBus
from forge.git import (
    Identity,
    InvalidName,
    RepoStore,
    list_branches,
    validate_branch_name,
    validate_repo_name,
)
from forge.git.bare import default_branch as storage_default_branch
from forge.git.bare import set_default_branch
from forge.models import Account, BranchRule, Collaborator, Repository
from forge.text import NUL, require_no_nul

RoleName = Literal["read", "write", "admin"]
VisibilityName = Literal["private", "internal", "public"]


@dataclass
class RepoResource:
    """A repository as the access rule sees it, with the roles of the accounts that were loaded."""

    repo: Repository
    roles: dict[int, Role] = field(default_factory=dict)

    @property
    def owner_id(self) -> int:
        return self.repo.owner_id

    @property
    def visibility(self) -> str:
        return self.repo.visibility

    @property
    def archived(self) -> bool:
        return self.repo.archived

    def role_of(self, account_id: int) -> Role | None:
        return self.roles.get(account_id)

    @property
    def full_name(self) -> str:
        return f"{self.repo.owner.login}/{self.repo.name}"

    @property
    def key(self) -> tuple[str, str]:
        """The on-disk name for the git store."""
        return (self.repo.owner.login.lower(), self.repo.name.lower())


class RepoRead(msgspec.Struct, kw_only=True):
    id: int
    owner: str
    name: str
    full_name: str
    description: str
    visibility: VisibilityName
    default_branch: str
    archived: bool
    clone_url: str
    html_url: str
    created_at: datetime
    updated_at: datetime
    # The caller's effective role (null when anonymous read of a public repository).
    permission: RoleName | None = None


class CollaboratorRead(msgspec.Struct, kw_only=True):
    login: str
    type: Literal["User", "Bot"]
    role: RoleName


class BranchRuleRead(msgspec.Struct, kw_only=True):
    id: int
    pattern: str
    allow_force_push: bool
    allow_deletion: bool


def to_read(res: RepoResource, principal: Principal, base_url: str) -> RepoRead:
    repo = res.repo
    role = effective_role(principal, res)
    full = res.full_name
    return RepoRead(
        id=repo.id,
        owner=repo.owner.login,
        name=repo.name,
        full_name=full,
        description=repo.description,
        visibility=repo.visibility,  # type: ignore[arg-type]
        default_branch=repo.default_branch,
        archived=repo.archived,
        clone_url=f"{base_url}/{full}.git",
        html_url=f"{base_url}/{full}",
        created_at=repo.created_at,
        updated_at=repo.updated_at,
        permission=role.name.lower() if role is not None else None,  # type: ignore[arg-type]
    )


async def _flush_new(session: AsyncSession, full_name: str) -> None:
    # Two concurrent creates of one name: the unique constraint decides (PostgreSQL does not
    # serialise writers the way SQLite's BEGIN IMMEDIATE does).
    try:
        await session.flush()
    except IntegrityError:
        raise Conflict(f"{full_name} already exists", code="repo_exists") from None


def _invalid(exc: InvalidName) -> InvalidInput:
    return InvalidInput(str(exc), code="invalid_name")


async def _find(session: AsyncSession, owner: str, name: str) -> Repository | None:
    if NUL in owner or NUL in name or len(owner) > 100 or len(name) > 100:
        return None
    stmt = (
        select(Repository)
        .join(Account, Account.id == Repository.owner_id)
        .where(Account.login_key == owner.lower(), Repository.name_key == name.lower())
    )
    return (await session.execute(stmt)).scalar_one_or_none()


async def resource_for(session: AsyncSession, repo: Repository, principal: Principal) -> RepoResource:
    roles: dict[int, Role] = {}
    if principal.account_id is not None:
        row = (
            await session.execute(
                select(Collaborator.role).where(
                    Collaborator.repo_id == repo.id, Collaborator.account_id == principal.account_id
                )
            )
        ).scalar_one_or_none()
        if row is not None:
            roles[principal.account_id] = Role[row.upper()]
    return RepoResource(repo=repo, roles=roles)


async def load(
    session: AsyncSession, principal: Principal, owner: str, name: str, action: Action = Action.REPO_READ
) -> RepoResource:
    """Find `owner/name` and check `action`; below read access the answer is 404."""
    repo = await _find(session, owner, name)
    if repo is None:
        raise NotFound("repository not found", code="repo_not_found", refused=True)
    res = await resource_for(session, repo, principal)
    require(principal, action, res)
    return res


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
        raise Forbidden("you can only create repositories for yourself", code="forbidden")
    try:
        validate_repo_name(name)
        validate_branch_name(default_branch)
    except InvalidName as exc:
        raise _invalid(exc) from None
    if visibility not in {v.value for v in Visibility}:
        raise InvalidInput("visibility is private, internal or public", code="invalid_visibility")
    if await _find(session, owner.login, name) is not None:
        raise Conflict(f"{owner.login}/{name} already exists", code="repo_exists")
    repo = Repository(
        owner_id=owner.id,
        name=name,
        name_key=name.lower(),
        description=require_no_nul(description[:1000], "a description"),
        visibility=visibility,
        default_branch=default_branch,
    )
    session.add(repo)
    await _flush_new(session, f"{owner.login}/{name}")
    key = (owner.login.lower(), name.lower())
    author = Identity(name=owner.display_name or owner.login, email=f"{owner.login}@users.noreply.forgehand")
    # The row is flushed but not committed: if git fails, the transaction rolls back with it.
    await store.create(
        key, default_branch=default_branch, description=description, readme_author=author if auto_init else None
    )
    audit.record(session, actor, "repo.create", f"{owner.login}/{name}", visibility=visibility, auto_init=auto_init)
    await session.refresh(repo, ["owner"])
    return repo


class RepoUpdate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str | None = None
    description: str | None = None
    visibility: VisibilityName | None = None
    default_branch: str | None = None
    archived: bool | None = None
    protect_default_branch: bool | None = None


async def update(
    session: AsyncSession, store: RepoStore, actor: Actor, res: RepoResource, change: RepoUpdate
) -> RepoResource:
    """Apply a settings change: every check first, then the row, then the disk (so a refused
    change leaves nothing half-applied)."""
    require(actor.principal, Action.REPO_ADMIN, res)
    repo = res.repo
    if change.description is not None:
        require_no_nul(change.description, "a description")
    new_branch = change.default_branch if change.default_branch not in (None, repo.default_branch) else None
    if new_branch is not None:
        try:
            validate_branch_name(new_branch)
        except InvalidName as exc:
            raise _invalid(exc) from None
        names = {b.name for b in await store.read(res.key, list_branches)}
        if names and new_branch not in names:
            raise InvalidInput(f"there is no branch {new_branch!r}", code="branch_not_found")
    new_name = change.name if change.name not in (None, repo.name) else None
    if new_name is not None:
        try:
            validate_repo_name(new_name)
        except InvalidName as exc:
            raise _invalid(exc) from None
        if new_name.lower() != repo.name_key and await _find(session, repo.owner.login, new_name) is not None:
            raise Conflict(f"{repo.owner.login}/{new_name} already exists", code="repo_exists")

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


async def remove(session: AsyncSession, store: RepoStore, actor: Actor, res: RepoResource, confirm: str) -> None:
    """Delete a repository (instance admins only) after the caller typed its full name."""
    if not can(actor.principal, Action.INSTANCE_ADMIN, INSTANCE):
        raise Forbidden("only instance admins delete repositories; archive it instead", code="forbidden")
    if confirm != res.full_name:
        raise InvalidInput(f"type {res.full_name!r} to confirm", code="confirmation_required")
    audit.record(session, actor, "repo.delete", res.full_name)
    await session.delete(res.repo)
    await session.flush()
    await store.delete(res.key)


async def set_collaborator(
    session: AsyncSession, actor: Actor, res: RepoResource, login: str, role: RoleName
) -> CollaboratorRead:
    require(actor.principal, Action.REPO_ADMIN, res)
    account = await accounts.require_by_login(session, login)
    if account.id == res.repo.owner_id:
        raise InvalidInput("the owner is always an admin", code="owner_role")
    if role not in ("read", "write", "admin"):
        raise InvalidInput("role is read, write or admin", code="invalid_role")
    row = (
        await session.execute(
            select(Collaborator).where(Collaborator.repo_id == res.repo.id, Collaborator.account_id == account.id)
        )
    ).scalar_one_or_none()
    if row is None:
        session.add(Collaborator(repo_id=res.repo.id, account_id=account.id, role=role))
    else:
        row.role = role
    audit.record(session, actor, "repo.collaborator.set", res.full_name, login=account.login, role=role)
    return CollaboratorRead(login=account.login, type="Bot" if account.is_bot else "User", role=role)


async def remove_collaborator(session: AsyncSession, actor: Actor, res: RepoResource, login: str) -> None:
    require(actor.principal, Action.REPO_ADMIN, res)
    account = await accounts.require_by_login(session, login)
    result = await session.execute(
        delete(Collaborator).where(Collaborator.repo_id == res.repo.id, Collaborator.account_id == account.id)
    )
    if not result.rowcount:  # type: ignore[attr-defined]
        raise NotFound(f"{login} is not a collaborator", code="collaborator_not_found")
    audit.record(session, actor, "repo.collaborator.remove", res.full_name, login=account.login)


async def list_collaborators(session: AsyncSession, res: RepoResource) -> list[CollaboratorRead]:
    rows = await session.execute(
        select(Collaborator, Account)
        .join(Account, Account.id == Collaborator.account_id)
        .where(Collaborator.repo_id == res.repo.id)
        .order_by(Account.login_key)
    )
    owner = res.repo.owner
    out = [CollaboratorRead(login=owner.login, type="Bot" if owner.is_bot else "User", role="admin")]
    for collab, account in rows:
        kind: Literal["User", "Bot"] = "Bot" if account.is_bot else "User"
        out.append(CollaboratorRead(login=account.login, type=kind, role=collab.role))
    return out


async def branch_rules(session: AsyncSession, repo: Repository) -> Sequence[BranchRule]:
    return (
        (await session.execute(select(BranchRule).where(BranchRule.repo_id == repo.id).order_by(BranchRule.id)))
        .scalars()
        .all()
    )


async def add_branch_rule(
    session: AsyncSession,
    actor: Actor,
    res: RepoResource,
    pattern: str,
    *,
    allow_force_push: bool,
    allow_deletion: bool,
) -> BranchRuleRead:
    require(actor.principal, Action.REPO_ADMIN, res)
    pattern = pattern.strip()
    if not pattern or len(pattern) > 255 or any(c in pattern for c in "\x00\n\r "):
        raise InvalidInput("a pattern is 1-255 characters without spaces", code="invalid_pattern")
    existing = (
        await session.execute(
            select(BranchRule).where(BranchRule.repo_id == res.repo.id, BranchRule.pattern == pattern)
        )
    ).scalar_one_or_none()
    if existing is None:
        existing = BranchRule(repo_id=res.repo.id, pattern=pattern)
        session.add(existing)
    existing.allow_force_push = allow_force_push
    existing.allow_deletion = allow_deletion
    await session.flush()
    audit.record(
        session,
        actor,
        "repo.branch_rule.set",
        res.full_name,
        pattern=pattern,
        allow_force_push=allow_force_push,
        allow_deletion=allow_deletion,
    )
    return BranchRuleRead(
        id=existing.id, pattern=pattern, allow_force_push=allow_force_push, allow_deletion=allow_deletion
    )


async def remove_branch_rule(session: AsyncSession, actor: Actor, res: RepoResource, rule_id: int) -> None:
    require(actor.principal, Action.REPO_ADMIN, res)
    rule = await session.get(BranchRule, rule_id)
    if rule is None or rule.repo_id != res.repo.id:
        raise NotFound("no such branch rule", code="branch_rule_not_found")
    audit.record(session, actor, "repo.branch_rule.remove", res.full_name, pattern=rule.pattern)
    await session.delete(rule)


async def list_visible(session: AsyncSession, principal: Principal, *, owner: str | None = None) -> list[RepoResource]:
    """Repositories the principal can read, by name."""
    stmt = (
        select(Repository)
        .join(Account, Account.id == Repository.owner_id)
        .order_by(Account.login_key, Repository.name_key)
    )
    if owner is not None:
        stmt = stmt.where(Account.login_key == owner.lower())
    if not can(principal, Action.INSTANCE_ADMIN, INSTANCE):
        # Narrow in SQL to what could be readable; `can` below still decides each row.
        readable = [Repository.visibility == Visibility.PUBLIC]
        if principal.account_id is not None:
            readable += [
                Repository.visibility == Visibility.INTERNAL,
                Repository.owner_id == principal.account_id,
                Repository.id.in_(select(Collaborator.repo_id).where(Collaborator.account_id == principal.account_id)),
            ]
        stmt = stmt.where(or_(*readable))
    repos = (await session.execute(stmt)).scalars().all()
    roles: dict[int, Role] = {}
    if principal.account_id is not None:
        rows = await session.execute(
            select(Collaborator.repo_id, Collaborator.role).where(Collaborator.account_id == principal.account_id)
        )
        roles = {repo_id: Role[role.upper()] for repo_id, role in rows}
    out = []
    for repo in repos:
        res = RepoResource(repo=repo)
        if principal.account_id is not None and repo.id in roles:
            res.roles[principal.account_id] = roles[repo.id]
        if can(principal, Action.REPO_READ, res):
            out.append(res)
    return out


async def count(session: AsyncSession) -> int:
    return int((await session.execute(select(func.count(Repository.id)))).scalar_one())


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
    try:
        validate_repo_name(name)
    except InvalidName as exc:
        raise _invalid(exc) from None
    if visibility not in {v.value for v in Visibility}:
        raise InvalidInput("visibility is private, internal or public", code="invalid_visibility")
    if await _find(session, owner.login, name) is not None:
        raise Conflict(f"{owner.login}/{name} already exists", code="repo_exists")
    repo = Repository(
        owner_id=owner.id,
        name=name,
        name_key=name.lower(),
        description=require_no_nul(description[:1000], "a description"),
        visibility=visibility,
    )
    session.add(repo)
    await session.flush()
    key = (owner.login.lower(), name.lower())
    await store.import_from(key, source)
    repo.default_branch = await store.read(key, storage_default_branch) or "main"
    audit.record(session, actor, "repo.import", f"{owner.login}/{name}", source=source)
    await session.refresh(repo, ["owner"])
    return repo
