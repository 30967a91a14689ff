"""Per-repository task settings: the model endpoint and the watchdog limits a repository's admins
may set for its tasks, over the instance's defaults. The model key is stored encrypted and never
shown again (`model_api_key_set` says whether one is stored); it is never passed into a sandbox."""

from typing import Annotated

import msgspec
from sqlalchemy.ext.asyncio import AsyncSession

from forge.accounts.model_keys import check_endpoint
from forge.core.error_codes import Code
from forge.core.errors import InvalidInput, about_field
from forge.core.settings import Settings
from forge.core.text import require_no_nul
from forge.core.worker_labels import checked_labels
from forge.db import audit
from forge.db.audit import Actor
from forge.repos.repositories import RepoResource
from sandbox.environment.spec import MAX_INPUT_BYTES, parse_environment_yml
from sandbox.errors import EnvironmentRefused
from tasks.core.egress_config import EgressSettings, checked, from_stored
from tasks.core.models import RepoTaskSettings
from tasks.core.repo_settings import secret_box
from tasks.core.schemas import TriggerRuntimeName
from tasks.services import environment_images, rules

Seconds = Annotated[int, msgspec.Meta(ge=1, le=7 * 24 * 3600)]
RuntimeName = Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9-]{0,39}$")]


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
    # A review task's agent may approve the pull request it reviews (null: no).
    review_agents_may_approve: bool | None = None
    # The runtime of tasks an issue, a mention or a review request starts (null: builtin).
    trigger_runtime: TriggerRuntimeName | None = None
    # The Anthropic provider (Claude Code runtimes); the key is write-only like the OpenAI one.
    anthropic_base_url: str | None = None
    anthropic_model: str | None = None
    anthropic_api_key_set: bool = False
    # Tasks may spend the starter's personal model key (GET/PUT /api/v1/user/model-keys/{provider}).
    allow_personal_keys: bool = False
    # The provider may search the web for the agent (null: the instance's setting, off by default).
    allow_web_search: bool | None = None
    # Network access of the sandbox through the egress proxy (docs/egress.md); off by default.
    egress: EgressSettings = msgspec.field(default_factory=EgressSettings)
    # Subtasks an agent may spawn (spawn_subtask; null: depth 2, 5 per task; 0 turns them off).
    max_subtask_depth: int | None = None
    max_subtasks: int | None = None
    # Runtimes a subtask may use besides its parent's (null or empty: the parent's only).
    subtask_runtimes: list[str] | None = None
    # Labels every task of the repository requires of the worker that claims its runs (null: none).
    worker_labels: list[str] | None = None


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
    review_agents_may_approve: bool | None = None
    trigger_runtime: TriggerRuntimeName | None = None
    anthropic_base_url: Annotated[str, msgspec.Meta(max_length=500)] | None = None
    anthropic_model: Annotated[str, msgspec.Meta(max_length=200)] | None = None
    anthropic_api_key: Annotated[str, msgspec.Meta(max_length=4096)] | None = None
    allow_personal_keys: bool | None = None
    allow_web_search: bool | None = None
    egress: EgressSettings | None = None  # null or absent: off
    max_subtask_depth: Annotated[int, msgspec.Meta(ge=0, le=10)] | None = None
    max_subtasks: Annotated[int, msgspec.Meta(ge=0, le=100)] | None = None
    subtask_runtimes: Annotated[list[RuntimeName], msgspec.Meta(max_length=10)] | None = None
    # `^[a-z0-9][a-z0-9_.-]{0,31}$`, at most 8 (checked here: `invalid_worker_labels`).
    worker_labels: Annotated[list[Annotated[str, msgspec.Meta(max_length=64)]], msgspec.Meta(max_length=64)] | None = (
        None
    )


def settings_read(row: RepoTaskSettings | None) -> RepoTaskSettingsRead:
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
        review_agents_may_approve=row.review_agents_may_approve if row else None,
        trigger_runtime=row.trigger_runtime if row else None,  # type: ignore[arg-type]
        anthropic_base_url=row.anthropic_base_url if row else None,
        anthropic_model=row.anthropic_model if row else None,
        anthropic_api_key_set=bool(row and row.anthropic_api_key_enc),
        allow_personal_keys=bool(row and row.allow_personal_keys),
        allow_web_search=row.allow_web_search if row else None,
        egress=from_stored(row.egress if row else None),
        max_subtask_depth=row.max_subtask_depth if row else None,
        max_subtasks=row.max_subtasks if row else None,
        subtask_runtimes=row.subtask_runtimes if row else None,
        worker_labels=row.worker_labels if row else None,
    )


async def update(
    session: AsyncSession, settings: Settings, actor: Actor, res: RepoResource, change: RepoTaskSettingsUpdate
) -> RepoTaskSettingsRead:
    rules.require_configure(actor.principal, res)
    for name, provider in (("model_base_url", "openai"), ("anthropic_base_url", "anthropic")):
        with about_field(name):
            await check_endpoint(session, settings, provider, getattr(change, name) or "")
    for key in (change.model_api_key, change.anthropic_api_key):
        require_no_nul(key or "", "a model key")
    egress = checked(change.egress) if change.egress is not None else None
    try:
        labels = checked_labels(change.worker_labels) if change.worker_labels is not None else []
    except ValueError as exc:
        raise InvalidInput(f"worker_labels: {exc}", code=Code.INVALID_WORKER_LABELS) from None
    row = await session.get(RepoTaskSettings, res.repo.id)
    if row is None:
        row = RepoTaskSettings(repo_id=res.repo.id)
        session.add(row)
    row.model_base_url = change.model_base_url or None
    row.model_name = require_no_nul(change.model_name, "a model name") if change.model_name else None
    if change.model_api_key is not None:
        row.model_api_key_enc = secret_box(settings).encrypt(change.model_api_key) if change.model_api_key else None
    row.anthropic_base_url = change.anthropic_base_url or None
    row.anthropic_model = require_no_nul(change.anthropic_model, "a model name") if change.anthropic_model else None
    if change.anthropic_api_key is not None:
        box = secret_box(settings)
        row.anthropic_api_key_enc = box.encrypt(change.anthropic_api_key) if change.anthropic_api_key else None
    row.allow_personal_keys = bool(change.allow_personal_keys)
    row.allow_web_search = change.allow_web_search
    row.turn_limit = change.turn_limit
    row.tool_timeout_seconds = change.tool_timeout_seconds
    row.idle_seconds = change.idle_seconds
    row.wall_clock_seconds = change.wall_clock_seconds
    row.token_budget = change.token_budget
    row.required_approvals = change.required_approvals
    row.approval_not_by_starter = change.approval_not_by_starter
    row.delete_branch_on_merge = change.delete_branch_on_merge
    row.review_agents_may_approve = change.review_agents_may_approve
    row.trigger_runtime = change.trigger_runtime
    row.egress = msgspec.to_builtins(egress) if egress is not None and egress != EgressSettings() else None
    row.max_subtask_depth = change.max_subtask_depth
    row.max_subtasks = change.max_subtasks
    row.subtask_runtimes = sorted(set(change.subtask_runtimes)) if change.subtask_runtimes else None
    row.worker_labels = labels or None  # tasks started from now on require them (started ones keep theirs)
    await session.flush()
    audit.record(
        session,
        actor,
        "repo.task_settings.update",
        res.full_name,
        # What changed, never the key itself.
        **{
            k: v
            for k, v in msgspec.structs.asdict(change).items()
            if k not in ("model_api_key", "anthropic_api_key", "egress") and v is not None
        },
        egress=msgspec.to_builtins(egress) if egress is not None else None,
        model_api_key="changed" if change.model_api_key is not None else "kept",
        anthropic_api_key="changed" if change.anthropic_api_key is not None else "kept",
    )
    return settings_read(row)


async def trigger_runtime(session: AsyncSession, res: RepoResource) -> TriggerRuntimeName | None:
    """The runtime the repository's task settings give tasks an issue, a mention or a review
    request starts (None: the start's default, builtin)."""
    row = await session.get(RepoTaskSettings, res.repo.id)
    value = row.trigger_runtime if row is not None else None
    return value if value in ("builtin", "claude-code", "codex") else None  # type: ignore[return-value]


class EnvironmentRebuild(msgspec.Struct, kw_only=True):
    """The answer to a forced rebuild: the environment's new generation."""

    generation: int


async def rebuild_environment(session: AsyncSession, actor: Actor, res: RepoResource) -> EnvironmentRebuild:
    """Count the repository's environment generation up: it is part of the environment's cache key,
    so the next task on any engine builds it again (docs/environments.md). The old images go with
    the image bound (FORGEHAND_ENVIRONMENT_IMAGES_LIMIT_MB)."""
    row = await session.get(RepoTaskSettings, res.repo.id, with_for_update=True)
    if row is None:
        row = RepoTaskSettings(repo_id=res.repo.id, environment_generation=0)
        session.add(row)
    row.environment_generation = (row.environment_generation or 0) + 1
    audit.record(session, actor, "repo.environment.rebuild", res.full_name, generation=row.environment_generation)
    await session.flush()
    return EnvironmentRebuild(generation=row.environment_generation)


class EnvironmentRead(msgspec.Struct, kw_only=True):
    """The environment declared in the repository's settings (null: none; the repository's own file
    is used then), and the generation a forced rebuild counts up."""

    declaration: str | None
    generation: int


class EnvironmentSet(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    declaration: Annotated[str, msgspec.Meta(max_length=MAX_INPUT_BYTES)]


def environment_read(row: RepoTaskSettings | None) -> EnvironmentRead:
    return EnvironmentRead(
        declaration=row.environment_yml if row else None, generation=row.environment_generation if row else 0
    )


async def set_environment(
    session: AsyncSession, settings: Settings, actor: Actor, res: RepoResource, text: str | None
) -> EnvironmentRead:
    """Declare (or, with None, remove) the repository's environment in its settings: checked whole
    as an environment.yml is (422 `invalid_environment` naming every problem, nothing stored)."""
    if text is not None:
        try:
            parse_environment_yml(text, allowed_images=await environment_images.allowed_images(session, settings))
        except EnvironmentRefused as exc:
            raise InvalidInput(
                "the environment is refused: " + "; ".join(exc.problems), code="invalid_environment"
            ) from None
    row = await session.get(RepoTaskSettings, res.repo.id, with_for_update=True)
    if row is None:
        row = RepoTaskSettings(repo_id=res.repo.id, environment_generation=0)
        session.add(row)
    row.environment_yml = text
    action = "repo.environment.set" if text is not None else "repo.environment.clear"
    audit.record(session, actor, action, res.full_name)
    await session.flush()
    return environment_read(row)
