"""What a start form offers: the bots that may work on a repository's tasks (the same rule the
start checks, `rules.may_work_as_agent`), the runtimes of this instance, and whether the builtin
runtime has a model to talk to."""

from collections.abc import Iterable

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.access import Principal
from forge.models import Account, AccountType
from forge.repositories import RepoResource, resource_for
from forge.settings import Settings
from tasks.core import repo_settings
from tasks.services import rules

MAX_BOTS = 500


class StartOptions(msgspec.Struct, kw_only=True):
    agents: list[str]
    runtimes: list[str]
    model_configured: bool


async def eligible_agents(session: AsyncSession, res: RepoResource) -> list[str]:
    """Active bots with write access to the repository, by login."""
    bots = (
        await session.scalars(
            select(Account)
            .where(Account.type == AccountType.BOT, Account.disabled.is_(False))
            .order_by(Account.login_key)
            .limit(MAX_BOTS)
        )
    ).all()
    out = []
    for bot in bots:
        principal = Principal(account_id=bot.id, login=bot.login, type="Bot", via="session")
        if rules.may_work_as_agent(principal, await resource_for(session, res.repo, principal)):
            out.append(bot.login)
    return out


async def start_options(
    session: AsyncSession, settings: Settings, res: RepoResource, runtimes: Iterable[str]
) -> StartOptions:
    effective = await repo_settings.effective(session, settings, res.repo.id)
    return StartOptions(
        agents=await eligible_agents(session, res),
        runtimes=sorted(runtimes),
        model_configured=bool(effective.model_base_url and effective.model_name),
    )


def self_merge_warning(bots: list[str], merge: repo_settings.MergeRules) -> str | None:
    """Whether the merge rules let one bot start a task (for another bot to work on), approve it
    and merge it, with no person involved: it takes two bots with write access, and rules that
    one starter's approval satisfies (the agent never reviews or merges its own work)."""
    if len(bots) < 2:
        return None
    if merge.required_approvals > 1 or (merge.required_approvals == 1 and merge.approval_not_by_starter):
        return None
    starter, agent = bots[0], bots[1]
    steps = "and merge it without any approval" if merge.required_approvals == 0 else ", approve it and merge it"
    return (
        f"One bot could start, approve and merge its own task with no person involved: {starter} could start "
        f"a task for {agent}{' ' if merge.required_approvals == 0 else ''}{steps} ({len(bots)} bots have write "
        f"access: {', '.join(bots[:10])}). Require the approval of someone other than the person who started "
        "the task, or more approvals."
    )
