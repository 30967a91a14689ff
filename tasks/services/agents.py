"""What a start form offers: the bots that may work on a repository's tasks (the same rule the
start checks, `rules.may_work_as_agent`), the runtimes of this instance, and whether the builtin
runtime has a model to talk to."""

from collections.abc import Iterable

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Principal
from forge.core.errors import ForgeError
from forge.core.settings import Settings
from forge.db.models import Account, AccountType
from forge.repos.repositories import RepoResource, resource_for
from tasks.core import repo_settings
from tasks.core.models import RepoTaskSettings
from tasks.services import rules

MAX_BOTS = 500


class StartOptions(msgspec.Struct, kw_only=True):
    agents: list[str]
    runtimes: list[str]
    model_configured: bool
    # Why a start would be refused for want of a model, for the starter: by runtime, and by model
    # API for ACP agents ("acp:anthropic", "acp:openai"); absent: a model can be had.
    no_model: dict[str, str] = msgspec.field(default_factory=dict)
    # Tasks here may spend the starter's personal model key (the repository's setting).
    personal_keys: bool = False


# The runtimes (and ACP model APIs) whose start needs a model; asked as a start would ask.
_NEEDS_MODEL = ("builtin", "claude-code", "codex")
_ACP_PROVIDERS = ("anthropic", "openai")


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


async def missing_models(
    session: AsyncSession, settings: Settings, res: RepoResource, runtimes: Iterable[str], starter_id: int | None
) -> dict[str, str]:
    """For each runtime that needs a model and has none for this starter, the refusal a start
    would give (the start's own check, `repo_settings.require_model`)."""
    names = set(runtimes)
    asks = [(runtime, runtime, "") for runtime in _NEEDS_MODEL if runtime in names]
    if "acp" in names:
        asks += [(f"acp:{p}", "acp", p) for p in _ACP_PROVIDERS]
    out: dict[str, str] = {}
    for key, runtime, provider in asks:
        try:
            await repo_settings.require_model(
                session, settings, res.repo.id, runtime, starter_id, acp_provider=provider
            )
        except ForgeError as exc:
            out[key] = exc.detail
    return out


async def start_options(
    session: AsyncSession,
    settings: Settings,
    res: RepoResource,
    runtimes: Iterable[str],
    starter_id: int | None = None,
) -> StartOptions:
    effective = await repo_settings.effective(session, settings, res.repo.id)
    row = await session.get(RepoTaskSettings, res.repo.id)
    names = sorted(runtimes)
    return StartOptions(
        agents=await eligible_agents(session, res),
        runtimes=names,
        model_configured=bool(effective.model_base_url and effective.model_name),
        no_model=await missing_models(session, settings, res, names, starter_id),
        personal_keys=bool(row is not None and row.allow_personal_keys),
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
