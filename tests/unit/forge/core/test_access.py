"""The access rule as a matrix: role x scope x visibility x archived, and 404-below-read."""

from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from forge.core.access import (
    ANONYMOUS,
    INSTANCE,
    AccountRef,
    Action,
    Principal,
    Role,
    Scope,
    Visibility,
    can,
    expand_scopes,
    parse_scopes,
    require,
)
from forge.core.errors import Forbidden, InvalidInput, NotFound

OWNER, ANA, BOB = 1, 2, 3


@dataclass
class Repo:
    owner_id: int = OWNER
    visibility: str = Visibility.PRIVATE
    archived: bool = False
    roles: dict[int, Role] = field(default_factory=dict)

    def role_of(self, account_id: int) -> Role | None:
        return self.roles.get(account_id)


def session(account_id: int, *, admin: bool = False) -> Principal:
    return Principal(account_id=account_id, login=f"u{account_id}", type="User", is_admin=admin, via="session")


def token(account_id: int, *scopes: Scope, admin: bool = False) -> Principal:
    return Principal(
        account_id=account_id,
        login=f"u{account_id}",
        type="User",
        is_admin=admin,
        via="token",
        token_id=9,
        scopes=expand_scopes(scopes),
    )


# What each role may do through a browser session (all scopes).
ROLE_MATRIX = {
    None: set(),
    Role.READ: {Action.REPO_READ, Action.ISSUE_WRITE},  # anyone who reads may open issues and comment
    Role.WRITE: {
        Action.REPO_READ,
        Action.REPO_WRITE,
        Action.TASK_READ,
        Action.TASK_WRITE,
        Action.REVIEW_WRITE,
        Action.PULL_WRITE,
        Action.PULL_REVIEW,
        Action.ISSUE_WRITE,
        Action.ISSUE_TRIAGE,
    },
    Role.ADMIN: {
        Action.REPO_READ,
        Action.REPO_WRITE,
        Action.REPO_ADMIN,
        Action.TASK_READ,
        Action.TASK_WRITE,
        Action.REVIEW_WRITE,
        Action.PULL_WRITE,
        Action.PULL_REVIEW,
        Action.ISSUE_WRITE,
        Action.ISSUE_TRIAGE,
        Action.WEBHOOKS_ADMIN,
    },
}
REPO_ACTIONS = [a for a in Action if a not in {Action.INSTANCE_ADMIN, Action.ACCOUNT_MANAGE}]


@pytest.mark.parametrize("role", list(ROLE_MATRIX))
@pytest.mark.parametrize("action", REPO_ACTIONS)
def test_role_matrix_for_sessions(role: Role | None, action: Action) -> None:
    repo = Repo(roles={ANA: role} if role else {})
    assert can(session(ANA), action, repo) == (action in ROLE_MATRIX[role])


SCOPE_GRANTS = {
    Scope.REPO_READ: {Action.REPO_READ},
    Scope.REPO_WRITE: {
        Action.REPO_READ,
        Action.REPO_WRITE,
        Action.REPO_ADMIN,
        Action.REPO_TRANSFER,
        Action.PULL_WRITE,
        Action.ISSUE_WRITE,
        Action.ISSUE_TRIAGE,
    },
    Scope.TASKS_READ: {Action.TASK_READ},
    Scope.TASKS_WRITE: {Action.TASK_READ, Action.TASK_WRITE},
    Scope.REVIEWS_WRITE: {Action.REVIEW_WRITE, Action.PULL_REVIEW, Action.TASK_READ, Action.REPO_READ},
    Scope.WEBHOOKS_ADMIN: {Action.WEBHOOKS_ADMIN, Action.REPO_READ},
    Scope.NOTIFICATIONS: set(),  # an account's inbox, no repository action
    Scope.ADMIN: set(REPO_ACTIONS),
}


@pytest.mark.parametrize("role", [Role.READ, Role.WRITE, Role.ADMIN])
@pytest.mark.parametrize("scope", list(Scope))
@pytest.mark.parametrize("action", REPO_ACTIONS)
def test_token_never_exceeds_role_nor_scope(role: Role, scope: Scope, action: Action) -> None:
    repo = Repo(roles={ANA: role})
    allowed = action in ROLE_MATRIX[role] and action in SCOPE_GRANTS[scope]
    assert can(token(ANA, scope), action, repo) == allowed


def test_owner_and_instance_admin_are_repo_admins() -> None:
    repo = Repo()
    for action in REPO_ACTIONS:
        assert can(session(OWNER), action, repo)
        assert can(session(BOB, admin=True), action, repo)
    # ...but an admin's token is still bounded by its scopes
    assert not can(token(BOB, Scope.REPO_READ, admin=True), Action.REPO_WRITE, repo)


@pytest.mark.parametrize(
    ("visibility", "anon", "signed_in"),
    [(Visibility.PRIVATE, False, False), (Visibility.INTERNAL, False, True), (Visibility.PUBLIC, True, True)],
)
def test_visibility_gives_read_only(visibility: str, anon: bool, signed_in: bool) -> None:
    repo = Repo(visibility=visibility)
    assert can(ANONYMOUS, Action.REPO_READ, repo) == anon
    assert can(session(ANA), Action.REPO_READ, repo) == signed_in
    assert not can(ANONYMOUS, Action.REPO_WRITE, repo)
    assert not can(session(ANA), Action.REPO_WRITE, repo)
    assert not can(session(ANA), Action.TASK_READ, repo)


def test_archived_refuses_content_writes_but_not_admin() -> None:
    repo = Repo(archived=True, roles={ANA: Role.ADMIN})
    assert can(session(ANA), Action.REPO_READ, repo)
    assert can(session(ANA), Action.REPO_ADMIN, repo)  # to unarchive
    for action in (Action.REPO_WRITE, Action.TASK_WRITE, Action.REVIEW_WRITE):
        assert not can(session(ANA), action, repo)
    with pytest.raises(Forbidden) as exc:
        require(session(ANA), Action.REPO_WRITE, repo)
    assert exc.value.code == "repo_archived"


def test_require_answers_404_below_read_and_403_above() -> None:
    private = Repo(roles={ANA: Role.READ})
    with pytest.raises(NotFound):
        require(session(BOB), Action.REPO_READ, private)
    with pytest.raises(NotFound):
        require(ANONYMOUS, Action.REPO_WRITE, private)
    with pytest.raises(Forbidden):
        require(session(ANA), Action.REPO_WRITE, private)
    # tasks are invisible below write
    with pytest.raises(NotFound):
        require(session(ANA), Action.TASK_READ, private)
    writer = Repo(roles={ANA: Role.WRITE})
    with pytest.raises(Forbidden) as exc:
        require(token(ANA, Scope.REPO_READ), Action.REPO_WRITE, writer)
    assert exc.value.code == "insufficient_scope"


def test_instance_admin_needs_flag_and_admin_scope() -> None:
    assert can(session(ANA, admin=True), Action.INSTANCE_ADMIN, INSTANCE)
    assert not can(session(ANA), Action.INSTANCE_ADMIN, INSTANCE)
    assert not can(token(ANA, Scope.REPO_WRITE, admin=True), Action.INSTANCE_ADMIN, INSTANCE)
    assert can(token(ANA, Scope.ADMIN, admin=True), Action.INSTANCE_ADMIN, INSTANCE)
    assert not can(token(ANA, Scope.ADMIN), Action.INSTANCE_ADMIN, INSTANCE)
    assert not can(ANONYMOUS, Action.INSTANCE_ADMIN, INSTANCE)


def test_account_management() -> None:
    assert can(session(ANA), Action.ACCOUNT_MANAGE, AccountRef(ANA))
    assert not can(session(ANA), Action.ACCOUNT_MANAGE, AccountRef(BOB))
    assert can(session(ANA), Action.ACCOUNT_MANAGE, AccountRef(BOB, owner_id=ANA))  # ana's bot
    # a token cannot mint tokens (a leaked token must not become a stronger one)
    assert not can(token(ANA, Scope.REPO_WRITE), Action.ACCOUNT_MANAGE, AccountRef(ANA))
    assert can(token(BOB, Scope.ADMIN, admin=True), Action.ACCOUNT_MANAGE, AccountRef(ANA))
    assert not can(ANONYMOUS, Action.ACCOUNT_MANAGE, AccountRef(ANA))


def test_write_scopes_imply_read() -> None:
    assert expand_scopes([Scope.REPO_WRITE]) == {Scope.REPO_WRITE, Scope.REPO_READ}
    assert expand_scopes([Scope.TASKS_WRITE]) == {Scope.TASKS_WRITE, Scope.TASKS_READ}
    assert expand_scopes([Scope.ADMIN]) == set(Scope)


def test_parse_scopes_rejects_unknown_and_empty() -> None:
    assert parse_scopes(["repo:read", " tasks:write "]) == {Scope.REPO_READ, Scope.TASKS_WRITE}
    with pytest.raises(InvalidInput):
        parse_scopes(["repo:everything"])
    with pytest.raises(InvalidInput):
        parse_scopes([])


@given(
    role=st.sampled_from([None, Role.READ, Role.WRITE, Role.ADMIN]),
    scopes=st.sets(st.sampled_from(list(Scope))),
    visibility=st.sampled_from(list(Visibility)),
    archived=st.booleans(),
    action=st.sampled_from(REPO_ACTIONS),
)
def test_a_token_is_never_stronger_than_its_session(
    role: Role | None, scopes: set[Scope], visibility: str, archived: bool, action: Action
) -> None:
    repo = Repo(visibility=visibility, archived=archived, roles={ANA: role} if role else {})
    if can(token(ANA, *scopes), action, repo):
        assert can(session(ANA), action, repo)


def test_only_the_owner_or_an_instance_admin_may_transfer() -> None:
    repo = Repo(roles={ANA: Role.ADMIN}, archived=True)
    assert can(session(OWNER), Action.REPO_TRANSFER, repo)
    assert can(token(OWNER, Scope.REPO_WRITE), Action.REPO_TRANSFER, repo)
    assert not can(token(OWNER, Scope.REPO_READ), Action.REPO_TRANSFER, repo)
    assert can(session(BOB, admin=True), Action.REPO_TRANSFER, repo)
    assert not can(token(BOB, Scope.REPO_WRITE, admin=True), Action.REPO_TRANSFER, repo)
    assert not can(session(ANA), Action.REPO_TRANSFER, repo)  # a collaborator admin could take it over
    with pytest.raises(Forbidden) as exc:
        require(session(ANA), Action.REPO_TRANSFER, repo)
    assert "owner or an instance admin" in exc.value.detail
    with pytest.raises(Forbidden) as exc:
        require(token(OWNER, Scope.REPO_READ), Action.REPO_TRANSFER, repo)
    assert exc.value.code == "insufficient_scope"
    with pytest.raises(NotFound):
        require(session(BOB), Action.REPO_TRANSFER, repo)
