"""Who may do what to a task (tasks.services.rules), as a matrix: principal x decision, on a
private repository and on a public one (a public repository shows its code, not its tasks)."""

import pytest

from forge.core.access import ANONYMOUS, Principal, Role
from forge.core.errors import Forbidden, ForgeError, NotFound
from forge.db.models import Repository
from forge.repos.repositories import RepoResource
from tasks.core.models import Task
from tasks.services import rules

OWNER, STARTER, WRITER, AGENT, READER, STRANGER, ADMIN = 1, 2, 3, 4, 5, 6, 7


def user(account_id: int, *, bot: bool = False, is_admin: bool = False) -> Principal:
    return Principal(
        account_id=account_id, login=f"u{account_id}", type="Bot" if bot else "User", is_admin=is_admin, via="session"
    )


PRINCIPALS = {
    "owner": user(OWNER),
    "starter": user(STARTER),
    "writer": user(WRITER),
    "agent": user(AGENT, bot=True),
    "reader": user(READER),
    "stranger": user(STRANGER),
    "instance admin": user(ADMIN, is_admin=True),
    "anonymous": ANONYMOUS,
    "internal": Principal(account_id=None, login="forgehand", type="Bot", via="internal"),
}


def resource(visibility: str = "private") -> RepoResource:
    repo = Repository(owner_id=OWNER, name="demo", visibility=visibility, archived=False, default_branch="main")
    roles = {STARTER: Role.WRITE, WRITER: Role.WRITE, AGENT: Role.WRITE, READER: Role.READ}
    return RepoResource(repo=repo, roles=roles)


TASK = Task(agent_id=AGENT, started_by_id=STARTER)

# decision -> who may (everyone else may not), on the private repository. `internal` is forgehand
# itself (the CLI, the worker): everything but starting, which needs an account.
MATRIX: dict[str, set[str]] = {
    "read": {"owner", "starter", "writer", "agent", "instance admin", "internal"},
    "start": {"owner", "starter", "writer", "agent", "instance admin"},
    "act": {"owner", "starter", "writer", "agent", "instance admin", "internal"},
    "stop": {"owner", "starter", "agent", "instance admin", "internal"},
    "decide": {"owner", "starter", "writer", "instance admin", "internal"},
    "review": {"owner", "starter", "writer", "instance admin", "internal"},
    "merge": {"owner", "starter", "writer", "instance admin", "internal"},
    "configure": {"owner", "instance admin", "internal"},
}

MAY = {
    "read": lambda p, r: rules.may_read(p, r),
    "start": lambda p, r: rules.may_start(p, r),
    "act": lambda p, r: rules.may_act(p, r),
    "stop": lambda p, r: rules.may_stop(p, r, TASK),
    "decide": lambda p, r: rules.may_decide(p, r, TASK),
    "review": lambda p, r: rules.may_review(p, r, TASK),
    "merge": lambda p, r: rules.may_merge(p, r, TASK),
    "configure": lambda p, r: rules.may_configure(p, r),
}
REQUIRE = {
    "read": lambda p, r: rules.require_read(p, r),
    "start": lambda p, r: rules.require_start(p, r),
    "act": lambda p, r: rules.require_act(p, r),
    "stop": lambda p, r: rules.require_stop(p, r, TASK),
    "decide": lambda p, r: rules.require_decide(p, r, TASK),
    "review": lambda p, r: rules.require_review(p, r, TASK),
    "merge": lambda p, r: rules.require_merge(p, r, TASK),
    "configure": lambda p, r: rules.require_configure(p, r),
}


@pytest.mark.parametrize("decision", sorted(MATRIX))
@pytest.mark.parametrize("who", sorted(PRINCIPALS))
def test_matrix(decision: str, who: str) -> None:
    principal, res = PRINCIPALS[who], resource()
    allowed = who in MATRIX[decision]
    assert MAY[decision](principal, res) is allowed
    if allowed:
        REQUIRE[decision](principal, res)
    else:
        with pytest.raises((Forbidden, NotFound)):
            REQUIRE[decision](principal, res)


@pytest.mark.parametrize("who", ["reader", "stranger", "anonymous"])
def test_tasks_of_a_public_repository_stay_hidden_below_write(who: str) -> None:
    res = resource("public")
    principal = PRINCIPALS[who]
    assert not rules.may_read(principal, res)
    assert not rules.may_start(principal, res)
    with pytest.raises(ForgeError):
        rules.require_act(principal, res)


def test_the_agent_is_refused_with_its_own_codes() -> None:
    agent, res = PRINCIPALS["agent"], resource()
    codes = {}
    for decision in ("decide", "review", "merge"):
        with pytest.raises(Forbidden) as caught:
            REQUIRE[decision](agent, res)
        codes[decision] = caught.value.code
    assert codes == {"decide": "agent_cannot_decide", "review": "agent_cannot_review", "merge": "agent_cannot_merge"}


def test_approvals_count_unless_the_agents_or_by_rule_the_starters() -> None:
    assert rules.approval_counts(WRITER, TASK, not_by_starter=True)
    assert not rules.approval_counts(AGENT, TASK, not_by_starter=False)
    assert rules.approval_counts(STARTER, TASK, not_by_starter=False)
    assert not rules.approval_counts(STARTER, TASK, not_by_starter=True)


def test_a_bot_works_as_agent_with_write_access_only() -> None:
    res = resource()
    assert rules.may_work_as_agent(PRINCIPALS["agent"], res)
    assert not rules.may_work_as_agent(user(READER, bot=True), res)
    assert not rules.may_work_as_agent(user(STRANGER, bot=True), res)
