"""A repository's task settings as runs and merges read them: the instance's settings with the
repository's overrides (`effective`), and the merge rules. The model key is stored encrypted."""

import msgspec
from sqlalchemy.ext.asyncio import AsyncSession

from forge.security import SecretBox
from forge.settings import Settings
from tasks.core.models import RepoTaskSettings

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
    ):
        value = getattr(row, column)
        if value is not None:
            changes[name] = value
    return msgspec.structs.replace(settings, **changes) if changes else settings


class MergeRules(msgspec.Struct, frozen=True, kw_only=True):
    required_approvals: int = 1
    approval_not_by_starter: bool = False
    delete_branch_on_merge: bool = False


async def merge_rules(session: AsyncSession, repo_id: int) -> MergeRules:
    row = await session.get(RepoTaskSettings, repo_id)
    if row is None:
        return MergeRules()
    return MergeRules(
        required_approvals=row.required_approvals if row.required_approvals is not None else 1,
        approval_not_by_starter=bool(row.approval_not_by_starter),
        delete_branch_on_merge=bool(row.delete_branch_on_merge),
    )
