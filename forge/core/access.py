"""The one access rule. Web, REST, SSE and git smart HTTP all ask `can(principal, action, resource)`.

A principal's power on a repository is the lesser of two things:
- the account's role there (`read < write < admin`; owners and instance admins are `admin`;
  `public` repositories give everyone `read`, `internal` ones every signed-in account), and
- for a token, its scopes (a token never exceeds its owner's role nor its scopes).

Below read access a repository answers 404 (see `require`), so its existence does not leak.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import IntEnum, StrEnum
from typing import Literal, Protocol

import msgspec

from forge.core.error_codes import Code
from forge.core.errors import Forbidden, InvalidInput, NotFound, Unauthenticated


class Scope(StrEnum):
    REPO_READ = "repo:read"
    REPO_WRITE = "repo:write"
    TASKS_READ = "tasks:read"
    TASKS_WRITE = "tasks:write"
    REVIEWS_WRITE = "reviews:write"
    WEBHOOKS_ADMIN = "webhooks:admin"
    NOTIFICATIONS = "notifications"  # the account's inbox and what it watches (GitHub's name)
    ADMIN = "admin"


# A granted scope implies these (write implies read; `admin` implies everything).
_IMPLIES: dict[Scope, frozenset[Scope]] = {
    Scope.REPO_READ: frozenset({Scope.REPO_READ}),
    Scope.REPO_WRITE: frozenset({Scope.REPO_WRITE, Scope.REPO_READ}),
    Scope.TASKS_READ: frozenset({Scope.TASKS_READ}),
    Scope.TASKS_WRITE: frozenset({Scope.TASKS_WRITE, Scope.TASKS_READ}),
    Scope.REVIEWS_WRITE: frozenset({Scope.REVIEWS_WRITE, Scope.TASKS_READ, Scope.REPO_READ}),
    Scope.WEBHOOKS_ADMIN: frozenset({Scope.WEBHOOKS_ADMIN, Scope.REPO_READ}),
    Scope.NOTIFICATIONS: frozenset({Scope.NOTIFICATIONS}),
    Scope.ADMIN: frozenset(Scope),
}


def parse_scopes(names: Iterable[str]) -> frozenset[Scope]:
    """Validate scope names as given by a user; raises InvalidInput naming the bad one."""
    result: set[Scope] = set()
    for name in names:
        try:
            result.add(Scope(name.strip()))
        except ValueError:
            valid = ", ".join(s.value for s in Scope)
            raise InvalidInput(f"unknown scope {name!r} (valid: {valid})", code=Code.INVALID_SCOPE) from None
    if not result:
        raise InvalidInput("a token needs at least one scope", code=Code.INVALID_SCOPE)
    return frozenset(result)


def expand_scopes(granted: Iterable[Scope]) -> frozenset[Scope]:
    out: set[Scope] = set()
    for scope in granted:
        out |= _IMPLIES[scope]
    return frozenset(out)


class Role(IntEnum):
    READ = 1
    WRITE = 2
    ADMIN = 3


class Visibility(StrEnum):
    PRIVATE = "private"
    INTERNAL = "internal"
    PUBLIC = "public"


class Principal(msgspec.Struct, frozen=True, kw_only=True):
    """Who is asking. `scopes` is None for a browser session (an account acts with all its rights)."""

    account_id: int | None
    login: str = ""
    type: Literal["User", "Bot", "Anonymous"] = "Anonymous"
    is_admin: bool = False
    via: Literal["session", "token", "anonymous", "internal"] = "anonymous"
    token_id: int | None = None
    scopes: frozenset[Scope] | None = None
    # Profile as read at authentication, so `GET /api/v1/user` needs no second query.
    display_name: str = ""
    created_at: datetime | None = None

    @property
    def is_authenticated(self) -> bool:
        return self.account_id is not None

    def has_scope(self, scope: Scope) -> bool:
        return self.scopes is None or scope in self.scopes


ANONYMOUS = Principal(account_id=None)


class Action(StrEnum):
    REPO_READ = "repo.read"
    REPO_WRITE = "repo.write"  # push, branch changes
    REPO_ADMIN = "repo.admin"  # settings, collaborators, archive
    REPO_TRANSFER = "repo.transfer"  # give the repository to another account: its owner or an instance admin
    TASK_READ = "task.read"  # tasks and transcripts (they show command output)
    TASK_WRITE = "task.write"  # start, message, answer, retry, stop, close
    REVIEW_WRITE = "review.write"  # review, merge
    PULL_WRITE = "pull.write"  # open, edit, close, reopen a pull request, update its branch
    PULL_REVIEW = "pull.review"  # review, comment on, request reviewers of and merge a pull request
    ISSUE_WRITE = "issue.write"  # open an issue, comment; edit and close what one wrote oneself
    ISSUE_TRIAGE = "issue.triage"  # labels, assignees, milestones; edit and close anyone's issue
    WEBHOOKS_ADMIN = "webhooks.admin"  # repository webhook endpoints
    INSTANCE_ADMIN = "instance.admin"  # users, bots, instance webhooks, audit log
    ACCOUNT_MANAGE = "account.manage"  # an account's own tokens and settings


# action -> (role needed on the repository, scope needed on a token)
_REPO_RULES: dict[Action, tuple[Role, Scope]] = {
    Action.REPO_READ: (Role.READ, Scope.REPO_READ),
    Action.REPO_WRITE: (Role.WRITE, Scope.REPO_WRITE),
    Action.REPO_ADMIN: (Role.ADMIN, Scope.REPO_WRITE),
    Action.TASK_READ: (Role.WRITE, Scope.TASKS_READ),
    Action.TASK_WRITE: (Role.WRITE, Scope.TASKS_WRITE),
    Action.REVIEW_WRITE: (Role.WRITE, Scope.REVIEWS_WRITE),
    # Pull requests are visible to readers (REPO_READ); taking part needs the write role, and a
    # reader is told so (403), unlike tasks, which do not exist below write.
    Action.PULL_WRITE: (Role.WRITE, Scope.REPO_WRITE),
    Action.PULL_REVIEW: (Role.WRITE, Scope.REVIEWS_WRITE),
    # Anyone who can read a repository may open an issue and comment (as on GitHub), with a
    # token that may write; sorting the work out (labels, assignees, milestones, closing someone
    # else's issue) needs the write role.
    Action.ISSUE_WRITE: (Role.READ, Scope.REPO_WRITE),
    Action.ISSUE_TRIAGE: (Role.WRITE, Scope.REPO_WRITE),
    Action.WEBHOOKS_ADMIN: (Role.ADMIN, Scope.WEBHOOKS_ADMIN),
}
# Task actions: below the write role tasks do not exist for the caller (404, never 403).
_TASK_ACTIONS = {Action.TASK_READ, Action.TASK_WRITE, Action.REVIEW_WRITE}
# What a repository the caller cannot read answers, exactly as one that does not exist.
REPO_NOT_FOUND = "repository not found"
TASKS_HIDDEN = "task not found (tasks are visible to collaborators with write access)"
# Actions that change repository content: refused on archived repositories.
_CONTENT_WRITES = {
    Action.REPO_WRITE,
    Action.TASK_WRITE,
    Action.REVIEW_WRITE,
    Action.PULL_WRITE,
    Action.PULL_REVIEW,
    Action.ISSUE_WRITE,
    Action.ISSUE_TRIAGE,
}


class RepoLike(Protocol):
    """What the access rule needs of a repository. `role_of` answers the explicit collaborator role."""

    @property
    def owner_id(self) -> int: ...
    @property
    def visibility(self) -> str: ...
    @property
    def archived(self) -> bool: ...
    def role_of(self, account_id: int) -> Role | None: ...


@dataclass(frozen=True)
class Instance:
    """The instance itself, as the resource of instance-wide actions."""


INSTANCE = Instance()


@dataclass(frozen=True)
class AccountRef:
    """An account as the resource of account actions (its tokens, its settings)."""

    account_id: int
    owner_id: int | None = None  # a bot's responsible person may manage it


Resource = RepoLike | Instance | AccountRef


def effective_role(principal: Principal, repo: RepoLike) -> Role | None:
    """The account's role on the repository, before token scopes are applied."""
    roles: list[Role] = []
    if principal.account_id is not None:
        # An instance admin is admin everywhere only with the `admin` scope (or in a session):
        # a narrower token of an admin stays as narrow as its owner's own roles.
        if (principal.is_admin and principal.has_scope(Scope.ADMIN)) or principal.account_id == repo.owner_id:
            return Role.ADMIN
        explicit = repo.role_of(principal.account_id)
        if explicit is not None:
            roles.append(explicit)
        if repo.visibility == Visibility.INTERNAL:
            roles.append(Role.READ)
    if repo.visibility == Visibility.PUBLIC:
        roles.append(Role.READ)
    return max(roles) if roles else None


def _may_transfer(principal: Principal, repo: RepoLike) -> bool:
    """Giving a repository away is its owner's decision (or an instance admin's), never a
    collaborator admin's: they could otherwise take it over."""
    if principal.account_id is None:
        return False
    if principal.is_admin and principal.has_scope(Scope.ADMIN):
        return True
    return principal.account_id == repo.owner_id and principal.has_scope(Scope.REPO_WRITE)


def can(principal: Principal, action: Action, resource: Resource) -> bool:
    if principal.via == "internal":
        # forgehand itself (worker, CLI at the operator's shell) is not subject to roles.
        return True
    if isinstance(resource, Instance):
        if action is not Action.INSTANCE_ADMIN:
            return False
        return principal.is_admin and principal.has_scope(Scope.ADMIN)
    if isinstance(resource, AccountRef):
        if action is not Action.ACCOUNT_MANAGE or principal.account_id is None:
            return False
        if principal.is_admin and principal.has_scope(Scope.ADMIN):
            return True
        # Managing tokens through a token would let a leaked token mint stronger ones.
        if principal.via != "session":
            return False
        return principal.account_id in {resource.account_id, resource.owner_id}
    if action is Action.REPO_TRANSFER:
        return _may_transfer(principal, resource)
    rule = _REPO_RULES.get(action)
    if rule is None:
        return False
    needed_role, needed_scope = rule
    role = effective_role(principal, resource)
    if role is None or role < needed_role:
        return False
    if not principal.has_scope(needed_scope):
        return False
    return not (resource.archived and action in _CONTENT_WRITES)


def require(principal: Principal, action: Action, resource: Resource) -> None:
    """Raise unless allowed. Whoever cannot see the resource gets 404, not 403, so that its
    existence does not leak: below read, the very answer of a repository that does not exist
    (`repo_not_found`, same message); tasks (their transcripts, reviews, and starting one) are
    invisible below the write role, on the API and the pages alike."""
    if can(principal, action, resource):
        return
    if isinstance(resource, Instance | AccountRef):
        if not principal.is_authenticated:
            # Nothing is hidden by answering 401 here: instance actions exist on every server.
            raise Unauthenticated("sign in or send a token")
        if principal.is_admin and not principal.has_scope(Scope.ADMIN):
            # An admin's narrower token: the `admin` scope is what is missing, so say so.
            raise Forbidden(f"this token lacks the {Scope.ADMIN.value!r} scope", code=Code.INSUFFICIENT_SCOPE)
        if isinstance(resource, Instance):
            raise Forbidden("this needs an instance admin")
        if principal.account_id in {resource.account_id, resource.owner_id}:
            raise Forbidden("a token cannot manage tokens or account settings: use a signed-in browser session")
        raise Forbidden("you may manage only your own account and your bots")
    role = effective_role(principal, resource)
    if role is None:
        raise NotFound(REPO_NOT_FOUND, code=Code.REPO_NOT_FOUND, refused=True)
    if action is Action.REPO_TRANSFER:
        if principal.account_id == resource.owner_id:
            raise Forbidden(f"this token lacks the {Scope.REPO_WRITE.value!r} scope", code=Code.INSUFFICIENT_SCOPE)
        raise Forbidden("only the repository's owner or an instance admin may transfer it")
    needed_role, needed_scope = _REPO_RULES[action]
    if action in _TASK_ACTIONS and role < Role.WRITE:
        raise NotFound(TASKS_HIDDEN, refused=True)
    if role < needed_role:
        raise Forbidden(f"this needs the {needed_role.name.lower()} role on the repository")
    if not principal.has_scope(needed_scope):
        raise Forbidden(f"this token lacks the {needed_scope.value!r} scope", code=Code.INSUFFICIENT_SCOPE)
    raise Forbidden("the repository is archived (read-only)", code=Code.REPO_ARCHIVED)
