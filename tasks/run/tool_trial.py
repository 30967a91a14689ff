"""An admin's test run of a custom tool (`POST .../tools/{id}/test-run`, the tool page's "Test run"
button; docs/tools.md): any version, drafts included, with inputs validated like an agent's, run
at once in a fresh hardened container like a task's call, and recorded in the tool's run history
(`task` null). No task, no policy call, no approval: the caller is the tool's admin.

Where it runs: the plain sandbox image, without network; a repository's tool sees a checkout of
the default branch's head in its workspace, an instance tool an empty one."""

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any

from forge.core.errors import InvalidInput
from forge.core.settings import Settings
from forge.db import audit
from forge.db.audit import Actor
from forge.db.engine import Database, utcnow
from forge.db.models import Repository
from forge.git import RepoStore
from sandbox import DEFAULT_IMAGE, SandboxEngine
from tasks.core import tool_schema
from tasks.core.redaction import Redactor
from tasks.core.states import ToolRunState
from tasks.core.tool_models import CustomTool, CustomToolRun, CustomToolVersion
from tasks.run import gitops
from tasks.run.tool_exec import ToolCall, ToolOutcome, execute_tool


async def trial_run(
    db: Database,
    store: RepoStore,
    settings: Settings,
    actor: Actor,
    tool: CustomTool,
    version: CustomToolVersion,
    inputs: dict[str, Any],
    *,
    engine: SandboxEngine | None = None,
) -> int:
    """Run `version` of `tool` with `inputs` (validated here); the run's id once it finished."""
    try:
        checked = tool_schema.check_inputs(inputs, version.parameters)
    except tool_schema.ToolSchemaError as exc:
        raise InvalidInput(exc.message, code=exc.code) from None
    run_id = await _record(db, actor, tool, version, checked)
    root = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="tool-test-", dir=settings.data_dir))
    own = engine is None
    eng = engine or SandboxEngine()
    try:
        workspace, tool_dir = root / "workspace", root / "tool"
        await asyncio.to_thread(_dirs, workspace, tool_dir)
        await _check_out(db, store, tool, workspace)
        call = ToolCall(
            tool_run_id=run_id, tool_name=tool.name, version=version.version, script=version.script,
            interpreter=version.interpreter, inputs=checked, arg_env=tool_schema.env_for(checked),
            timeout_seconds=version.timeout_seconds, image=settings.sandbox_image or DEFAULT_IMAGE,
            workspace=workspace, instance=settings.instance_id or "forgehand", task="test", run=f"tool-test-{run_id}",
        )  # fmt: skip
        redactor = Redactor([settings.model_api_key, settings.secret_key])
        outcome: ToolOutcome | None = await execute_tool(eng, call, tool_dir=tool_dir, redact=redactor.redact)
    except Exception:
        outcome = None
        raise
    finally:
        await _finish(db, run_id, outcome)
        if own:
            await eng.close()
        await asyncio.to_thread(shutil.rmtree, root, True)
    return run_id


def _dirs(workspace: Path, tool_dir: Path) -> None:
    workspace.mkdir(mode=0o777)
    workspace.chmod(0o777)  # the sandbox user writes here (uid 1000, not this process's)
    tool_dir.mkdir(mode=0o755)


async def _check_out(db: Database, store: RepoStore, tool: CustomTool, workspace: Path) -> None:
    if tool.repo_id is None:
        return
    async with db.session() as s:
        repo = await s.get(Repository, tool.repo_id)
        if repo is None:
            return
        key, branch = (repo.owner.login.lower(), repo.name.lower()), repo.default_branch
    head = await store.read(key, gitops.branch_sha, branch)
    if head is not None:
        await store.read(key, gitops.checkout_tree, head, workspace)


async def _record(
    db: Database, actor: Actor, tool: CustomTool, version: CustomToolVersion, inputs: dict[str, Any]
) -> int:
    row = CustomToolRun(
        tool_id=tool.id, version=version.version, tool_name=tool.name, repo_id=tool.repo_id, task_id=None,
        run_id=None, inputs=inputs, inputs_hash=tool_schema.inputs_hash(inputs), state=ToolRunState.RUNNING.value,
        requested_by_id=actor.principal.account_id, started_at=utcnow(),
    )  # fmt: skip
    async with db.session(write=True) as s:
        s.add(row)
        await s.flush()
        audit.record(s, actor, "tool.test_run", f"tool:{tool.name}", version=version.version, tool_run=row.id)
        return row.id


async def _finish(db: Database, run_id: int, outcome: ToolOutcome | None) -> None:
    async with db.session(write=True) as s:
        row = await s.get(CustomToolRun, run_id)
        assert row is not None
        row.finished_at = utcnow()
        if outcome is None:
            row.state, row.failure_reason = ToolRunState.FAILED.value, "internal"
            row.output = "forgehand could not run the tool"
            return
        row.state = (ToolRunState.SUCCEEDED if outcome.failure_reason is None else ToolRunState.FAILED).value
        row.exit_code, row.output, row.failure_reason = outcome.exit_code, outcome.output, outcome.failure_reason
        row.duration_ms = outcome.duration_ms
