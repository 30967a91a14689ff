"""A repository's task settings as runs and merges read them: the instance's settings with the
repository's overrides (`effective`), which key pays for a run's model calls (`model_access`),
and the merge rules. Model keys are stored encrypted."""

from typing import Literal

import msgspec
from sqlalchemy.ext.asyncio import AsyncSession

from forge.accounts.model_keys import personal_keys
from forge.core.error_codes import Code
from forge.core.errors import InvalidInput
from forge.core.security import SecretBox
from forge.core.settings import Settings
from tasks.core.models import RepoTaskSettings

Provider = Literal["anthropic", "openai"]
KeySource = Literal["instance", "repository", "personal"]
ANTHROPIC_DEFAULT_URL = "https://api.anthropic.com"

KEY_PURPOSE = "forgehand-model-keys-v1"


def secret_box(settings: Settings) -> SecretBox:
    return SecretBox(settings.secret_key, purpose=KEY_PURPOSE)


async def effective(session: AsyncSession, settings: Settings, repo_id: int) -> Settings:
    """The instance's settings with the repository's overrides applied (what a run uses)."""
    row = await session.get(RepoTaskSettings, repo_id)
    if row is None:
        return settings
    changes: dict[str, object] = {}
    if row.model_base_url:
        changes["model_base_url"] = row.model_base_url
    if row.model_name:
        changes["model_name"] = row.model_name
    if row.model_api_key_enc:
        changes["model_api_key"] = secret_box(settings).decrypt(row.model_api_key_enc)
    for column, name in (
        ("turn_limit", "task_turn_limit"),
        ("tool_timeout_seconds", "task_tool_timeout_seconds"),
        ("idle_seconds", "task_idle_seconds"),
        ("wall_clock_seconds", "task_wall_clock_seconds"),
        ("token_budget", "task_token_budget"),
        ("allow_web_search", "task_allow_web_search"),
    ):
        value = getattr(row, column)
        if value is not None:
            changes[name] = value
    return msgspec.structs.replace(settings, **changes) if changes else settings


class ProviderAccess(msgspec.Struct, frozen=True, kw_only=True):
    """Where one provider's calls of a run go, with which key and model, and whose key that is."""

    provider: Provider
    base_url: str
    api_key: str
    model: str
    source: KeySource
    # The endpoint is the instance's own (the operator's choice); others are checked by the
    # gateway's URL guard at every connection (tasks/run/gateway/guard.py).
    trusted: bool = True

    @property
    def configured(self) -> bool:
        if self.provider == "openai":
            return bool(self.base_url and self.model)
        # The vendor's endpoint without a key cannot answer; any other endpoint may need none.
        return bool(self.base_url) and (bool(self.api_key) or self.base_url.rstrip("/") != ANTHROPIC_DEFAULT_URL)


async def model_access(
    session: AsyncSession, settings: Settings, repo_id: int, starter_id: int | None
) -> dict[Provider, ProviderAccess]:
    """Which key pays, per provider: the starter's personal key when the repository allows it and
    they have one, else the repository's, else the instance's.

    A key only ever goes to an endpoint its owner chose: a personal key to the person's own base
    URL (or the instance's), a repository's key to the repository's (or the instance's), and the
    instance's key only to the instance's endpoint; a repository that sets its own endpoint
    without a key gets no key sent there."""
    row = await session.get(RepoTaskSettings, repo_id)
    box = secret_box(settings)
    instance: dict[Provider, tuple[str, str, str]] = {
        "openai": (settings.model_base_url, settings.model_api_key, settings.model_name),
        "anthropic": (settings.anthropic_base_url, settings.anthropic_api_key, settings.anthropic_model),
    }
    personal = await personal_keys(session, settings, starter_id) if row is not None and row.allow_personal_keys else {}
    out: dict[Provider, ProviderAccess] = {}
    for provider, (base, key, model) in instance.items():
        source: KeySource = "instance"
        if row is not None:
            repo_base = row.model_base_url if provider == "openai" else row.anthropic_base_url
            repo_key_enc = row.model_api_key_enc if provider == "openai" else row.anthropic_api_key_enc
            model = (row.model_name if provider == "openai" else row.anthropic_model) or model
            if repo_key_enc or repo_base:
                source = "repository"
                base = repo_base or base
                key = box.decrypt(repo_key_enc) if repo_key_enc else ""
        mine = personal.get(provider)
        if mine is not None:
            source, key = "personal", mine.api_key
            base = mine.base_url or instance[provider][0]
            model = mine.model or model
        trusted = base.rstrip("/") == instance[provider][0].rstrip("/")
        out[provider] = ProviderAccess(
            provider=provider, base_url=base, api_key=key, model=model, source=source, trusted=trusted
        )
    return out


class MergeRules(msgspec.Struct, frozen=True, kw_only=True):
    required_approvals: int = 1
    approval_not_by_starter: bool = False
    delete_branch_on_merge: bool = False
    # A review task's agent may approve the pull request it reviews (its approval then counts as anyone's).
    review_agents_may_approve: bool = False


async def merge_rules(session: AsyncSession, repo_id: int) -> MergeRules:
    row = await session.get(RepoTaskSettings, repo_id)
    if row is None:
        return MergeRules()
    return MergeRules(
        required_approvals=row.required_approvals if row.required_approvals is not None else 1,
        approval_not_by_starter=bool(row.approval_not_by_starter),
        delete_branch_on_merge=bool(row.delete_branch_on_merge),
        review_agents_may_approve=bool(row.review_agents_may_approve),
    )


# What each CLI runtime needs from the model settings: the provider and how to say it.
_CLI_NEEDS: dict[str, tuple[Provider, str]] = {
    "claude-code": (
        "anthropic",
        "an Anthropic endpoint (FORGEHAND_ANTHROPIC_API_KEY, FORGEHAND_ANTHROPIC_MODEL, or the repository's or "
        "your own model key)",
    ),
    "codex": (
        "openai",
        "an OpenAI-compatible endpoint with the Responses API (FORGEHAND_MODEL_BASE_URL, FORGEHAND_MODEL_NAME, "
        "FORGEHAND_MODEL_API_KEY, or the repository's or your own model key)",
    ),
}
# Where a provider's model is set, by whose key pays (the first named is where this run's would go).
_MODEL_FIX: dict[Provider, dict[KeySource, str]] = {
    "anthropic": {
        "personal": "your Anthropic key's model (Settings > Model access)",
        "repository": "the repository's Anthropic model (Settings > Tasks, anthropic_model)",
        "instance": "FORGEHAND_ANTHROPIC_MODEL (the instance's)",
    },
    "openai": {
        "personal": "your OpenAI-compatible key's model (Settings > Model access)",
        "repository": "the repository's model (Settings > Tasks, model_name)",
        "instance": "FORGEHAND_MODEL_NAME (the instance's)",
    },
}


def _no_model(runtime: str, access: ProviderAccess, settings: Settings) -> InvalidInput | None:
    """The refusal of a run whose provider has an endpoint but no model the gateway could use:
    OpenAI-compatible endpoints name none by default, and with a price table
    (`FORGEHAND_MODEL_PRICES`) the gateway lets through only a configured model or one the table
    lists, which an agent's own default need not be."""
    if access.model or (access.provider == "anthropic" and not settings.model_prices):
        return None
    fixes = _MODEL_FIX[access.provider]
    where = [fixes[access.source], *(v for k, v in fixes.items() if k != access.source and k != "personal")]
    why = "" if access.provider == "openai" else " (the price table lets through only the models a run is given)"
    return InvalidInput(
        f"no model can be chosen for {runtime}{why}: set {', or '.join(where)}", code=Code.MODEL_NOT_CHOSEN
    )


async def require_model(
    session: AsyncSession,
    settings: Settings,
    repo_id: int,
    runtime: str,
    starter_id: int | None,
    *,
    acp_provider: str = "",
) -> None:
    """A task of `runtime` can have a model (the command runtime needs none; an ACP agent the one its
    configuration names, `acp_provider`): raises InvalidInput."""
    if runtime == "command":
        return
    need = _CLI_NEEDS.get(runtime)
    if runtime == "acp":
        need = {"anthropic": _CLI_NEEDS["claude-code"], "openai": _CLI_NEEDS["codex"]}.get(acp_provider)
        if need is None:
            return  # an agent that calls no model
    if need is not None:
        provider, what = need
        access = (await model_access(session, settings, repo_id, starter_id))[provider]
        # An OpenAI-compatible endpoint without a model is an endpoint all the same: its refusal
        # names the missing model.
        endpoint = access.configured or (provider == "openai" and access.base_url)
        if endpoint and (refusal := _no_model(runtime, access, settings)) is not None:
            raise refusal
        if not access.configured:
            raise InvalidInput(f"the {runtime} runtime needs {what}", code="model_not_configured")
        return
    found = await effective(session, settings, repo_id)
    if not (found.model_base_url and found.model_name):
        raise InvalidInput(
            "the builtin runtime needs a model endpoint (FORGEHAND_MODEL_BASE_URL, FORGEHAND_MODEL_NAME); "
            "use the command runtime or configure one",
            code="model_not_configured",
        )
