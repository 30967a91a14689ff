"""An agent's proposal of a custom tool (`propose_tool`, docs/tools.md "Proposals"): a draft of a
repository tool, or a new draft version of the repository tool of that name, written as the task's
agent with the task recorded as its proposer. Always `approval` mode, never read-only, never
active: nothing an agent proposes runs before a repository admin reviews and activates it. Only a
run whose task's starter is an admin of the repository is offered the tool (`may_propose`)."""

from typing import Any

from sqlalchemy import select

from forge.core.access import Action, Principal, can
from forge.core.errors import Conflict
from forge.db import audit
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.models import Account, Repository
from forge.repos.repositories import resource_for
from tasks.core.custom_tool_schemas import TIMEOUT_DEFAULT
from tasks.core.custom_tools import Definition, add_version, check_definition, check_name, check_parameters
from tasks.core.models import Task
from tasks.core.tool_models import CustomTool


def _definition(args: dict[str, Any]) -> Definition:
    parameters = args.get("parameters")
    return check_definition(
        Definition(
            description=str(args.get("description") or "").strip(),
            parameters=check_parameters(parameters if isinstance(parameters, dict) else {}),
            script=str(args.get("script") or ""),
            interpreter=str(args.get("interpreter") or "sh"),
            mode="approval",
            read_only=False,
            timeout_seconds=TIMEOUT_DEFAULT,
        )
    )


async def starter_is_admin(db: Database, task_id: int) -> bool:
    """May this task's agent propose tools: its starter is an admin of the repository."""
    async with db.session() as s:
        task = await s.get(Task, task_id)
        starter = await s.get(Account, task.started_by_id) if task and task.started_by_id else None
        repo = await s.get(Repository, task.repo_id) if task else None
        if starter is None or repo is None or starter.is_bot:
            return False
        # As the starter acting in person (an internal principal would pass every check).
        principal = Principal(account_id=starter.id, login=starter.login, type="User", is_admin=starter.is_admin,
                              via="session")  # fmt: skip
        return can(principal, Action.REPO_ADMIN, await resource_for(s, repo, principal))


async def propose(db: Database, task_id: int, args: dict[str, Any]) -> tuple[str, int]:
    """Save the proposal; (the tool's name, the draft's version)."""
    name = check_name(str(args.get("name") or ""))
    d = _definition(args)
    async with db.session(write=True) as s:
        task = await s.get(Task, task_id)
        assert task is not None
        agent = await s.get(Account, task.agent_id)
        actor = Actor(principal=Principal(account_id=task.agent_id, login=agent.login if agent else "", type="Bot",
                                          via="internal"))  # fmt: skip
        scope = f"repo:{task.repo_id}"
        tool = await s.scalar(select(CustomTool).where(CustomTool.scope == scope, CustomTool.name == name))
        if tool is None:
            count = len((await s.scalars(select(CustomTool.id).where(CustomTool.scope == scope))).all())
            if count >= 100:
                raise Conflict("the repository has as many tools as it may; ask an admin", code="conflict")
            tool = CustomTool(scope=scope, repo_id=task.repo_id, name=name, enabled=True, last_version=0,
                              created_by_id=task.agent_id)  # fmt: skip
            s.add(tool)
            await s.flush()
        tool.last_version += 1
        add_version(s, tool, tool.last_version, d, task.agent_id, task.id)
        await s.flush()
        repo = await s.get(Repository, task.repo_id)
        target = f"{repo.owner.login}/{repo.name}:tool:{name}" if repo else f"tool:{name}"
        audit.record(s, actor, "tool.propose", target, version=tool.last_version, task=task.number)
        return name, tool.last_version
