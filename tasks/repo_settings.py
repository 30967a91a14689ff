"""Per-repository task settings: the model endpoint and the watchdog limits a repository's admins
may set for its tasks, over the instance's defaults. The model key is stored encrypted and never
shown again (`model_api_key_set` says whether one is stored); it is never passed into a sandbox."""

from typing import Annotated
from urllib.parse import urlsplit

import msgspec
from litestar import Controller, get, put
from litestar.params import FromPath, JSONBody
from sqlalchemy.ext.asyncio import AsyncSession

from forge import audit, repositories
from forge.access import Action, require
from forge.audit import Actor
from forge.deps import ActorDep, DbSession, SettingsDep
from forge.errors import InvalidInput
from forge.repositories import RepoResource
from forge.security import SecretBox
from forge.settings import Settings
from forge.text import require_no_nul
from tasks.models import RepoTaskSettings

KEY_PURPOSE = "forgehand-model-keys-v1"
Seconds = Annotated[int, msgspec.Meta(ge=1, le=7 * 24 * 3600)]


class RepoTaskSettingsRead(msgspec.Struct, kw_only=True):
    model_base_url: str | None
    model_name: str | None
    model_api_key_set: bool
    turn_limit: int | None
    tool_timeout_seconds: int | None
    idle_seconds: int | None
    wall_clock_seconds: int | None
    token_budget: int | None
    # Merge rules of the repository's tasks (null: 1 approval, anyone's, the branch kept).
    required_approvals: int | None = None
    approval_not_by_starter: bool | None = None
    delete_branch_on_merge: bool | None = None


class RepoTaskSettingsUpdate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Every field is an override; null (or absent) means "use the instance's setting".
    `model_api_key`: a new key, "" to remove the stored one, absent to keep it."""

    model_base_url: Annotated[str, msgspec.Meta(max_length=500)] | None = None
    model_name: Annotated[str, msgspec.Meta(max_length=200)] | None = None
    model_api_key: Annotated[str, msgspec.Meta(max_length=4096)] | None = None
    turn_limit: Annotated[int, msgspec.Meta(ge=1, le=10_000)] | None = None
    tool_timeout_seconds: Seconds | None = None
    idle_seconds: Seconds | None = None
    wall_clock_seconds: Seconds | None = None
    token_budget: Annotated[int, msgspec.Meta(ge=0, le=1_000_000_000)] | None = None
    required_approvals: Annotated[int, msgspec.Meta(ge=0, le=10)] | None = None
    approval_not_by_starter: bool | None = None
    delete_branch_on_merge: bool | None = None


def _box(settings: Settings) -> SecretBox:
    return SecretBox(settings.secret_key, purpose=KEY_PURPOSE)


def _read(row: RepoTaskSettings | None) -> RepoTaskSettingsRead:
    return RepoTaskSettingsRead(
        model_base_url=row.model_base_url if row else None,
        model_name=row.model_name if row else None,
        model_api_key_set=bool(row and row.model_api_key_enc),
        turn_limit=row.turn_limit if row else None,
        tool_timeout_seconds=row.tool_timeout_seconds if row else None,
        idle_seconds=row.idle_seconds if row else None,
        wall_clock_seconds=row.wall_clock_seconds if row else None,
        token_budget=row.token_budget if row else None,
        required_approvals=row.required_approvals if row else None,
        approval_not_by_starter=row.approval_not_by_starter if row else None,
        delete_branch_on_merge=row.delete_branch_on_merge if row else None,
    )


async def update(
    session: AsyncSession, settings: Settings, actor: Actor, res: RepoResource, change: RepoTaskSettingsUpdate
) -> RepoTaskSettingsRead:
    require(actor.principal, Action.REPO_ADMIN, res)
    if change.model_base_url:
        parts = urlsplit(require_no_nul(change.model_base_url, "a model URL"))
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise InvalidInput("the model endpoint is an http(s) URL", code="invalid_model_url")
    row = await session.get(RepoTaskSettings, res.repo.id)
    if row is None:
        row = RepoTaskSettings(repo_id=res.repo.id)
        session.add(row)
    row.model_base_url = change.model_base_url or None
    row.model_name = require_no_nul(change.model_name, "a model name") if change.model_name else None
    if change.model_api_key is not None:
        row.model_api_key_enc = _box(settings).encrypt(change.model_api_key) if change.model_api_key else None
    row.turn_limit = change.turn_limit
    row.tool_timeout_seconds = change.tool_timeout_seconds
    row.idle_seconds = change.idle_seconds
    row.wall_clock_seconds = change.wall_clock_seconds
    row.token_budget = change.token_budget
    row.required_approvals = change.required_approvals
    row.approval_not_by_starter = change.approval_not_by_starter
    row.delete_branch_on_merge = change.delete_branch_on_merge
    await session.flush()
    audit.record(
        session,
        actor,
        "repo.task_settings.update",
        res.full_name,
        # What changed, never the key itself.
        **{k: v for k, v in msgspec.structs.asdict(change).items() if k != "model_api_key" and v is not None},
        model_api_key="changed" if change.model_api_key is not None else "kept",
    )
    return _read(row)


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
        changes["model_api_key"] = _box(settings).decrypt(row.model_api_key_enc)
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


class RepoTaskSettingsController(Controller):
    path = "/api/v1/repos/{owner:str}/{name:str}/task-settings"
    tags = ["tasks"]

    @get("/", summary="The repository's task settings (overrides of the instance's; the key is never shown)")
    async def get_settings(
        self, db_session: DbSession, actor: ActorDep, owner: FromPath[str], name: FromPath[str]
    ) -> RepoTaskSettingsRead:
        res = await repositories.load(db_session, actor.principal, owner, name, Action.REPO_ADMIN)
        return _read(await db_session.get(RepoTaskSettings, res.repo.id))

    @put("/", summary="Set the repository's task settings (repository admins)")
    async def put_settings(
        self,
        db_session: DbSession,
        actor: ActorDep,
        settings: SettingsDep,
        owner: FromPath[str],
        name: FromPath[str],
        data: JSONBody[RepoTaskSettingsUpdate],
    ) -> RepoTaskSettingsRead:
        res = await repositories.load(db_session, actor.principal, owner, name, Action.REPO_ADMIN)
        return await update(db_session, settings, actor, res, data)
