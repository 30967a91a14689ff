"""Recovering the runs whose worker went away (a SIGKILLed server), at a worker's start and twice
per lease. A run is orphaned when its owner is not a live worker of this process, a process of
this host that is gone, or a worker whose lease lapsed (no heartbeat for `worker_lease_seconds`:
`owner_gone`). Their containers are reaped first, on this worker's engine and on the dead worker's
own engine when it can be reached (the workers' register names it); each surviving workspace
becomes the work-in-progress commit (the settle step's snapshot, with the checkout manifest saved
beside the workspace), the task records what its branch holds (a snapshot that landed before the
crash included), the run ends failed `interrupted` (a subtask's parent told), and the workspace
goes. A sweep removes the workspaces, manifests, quota mounts and images, and the run channels,
that no live run owns.

Blocking work (pygit2, mounts) runs in threads."""

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pygit2
import structlog
from sqlalchemy import select, update

from forge.core.text import plural, safe_text
from forge.db.engine import utcnow
from forge.db.models import Account, Repository
from forge.git import fences
from forge.git.errors import RefConflict
from sandbox import EngineUnavailable, SandboxEngine, SandboxError, quota_mounts, reap
from tasks.core import worker_registry
from tasks.core.models import Run, Task
from tasks.core.states import FailureReason, RunState, TaskState, ToolRunState
from tasks.core.subtasks import report_to_parent
from tasks.core.tool_models import CustomToolRun
from tasks.core.transcript import Notice, Pending
from tasks.run import gitops
from tasks.run.env import RunEnv
from tasks.run.gateway import sweep_channels
from tasks.run.settle import agent_identity, forge_identity, remove_workspace, run_data, wip_message

log = structlog.get_logger("forgehand.tasks")

INTERRUPTED = "interrupted: the worker running it went away"
_SIDE_FILES = (".manifest", ".manifest.tmp", ".img")


def workspaces_root(env: RunEnv) -> Path:
    return env.settings.data_dir.resolve() / "workspaces"


def workspace_of(env: RunEnv, task_uuid: str, run_uuid: str) -> Path:
    return workspaces_root(env) / task_uuid / run_uuid


class Salvage:
    """What recovery found of one interrupted run: its snapshot (or why not) and the branch tip."""

    def __init__(self) -> None:
        self.snapshot: gitops.Snapshot | None = None
        self.error = ""
        self.tip: str | None = None
        self.tip_is_wip = False


async def salvage(env: RunEnv, run: Run, task: Task, repo: Repository, agent_login: str) -> Salvage:
    """Snapshot the run's workspace (if it survived) onto the task branch, then read the tip."""
    out = Salvage()
    key = (repo.owner.login.lower(), repo.name.lower())
    workspace = workspace_of(env, task.uuid, run.uuid)
    # A review task's result is its review: its work tree is never committed, interrupted or not.
    review = isinstance(task.trigger, dict) and task.trigger.get("kind") == "review_request"
    if run.start_sha and workspace.is_dir() and not review:
        manifest = await asyncio.to_thread(gitops.load_manifest, workspace)
        ref = f"{repo.owner.login}/{repo.name}#{task.number}, run {run.seq}"
        try:
            out.snapshot = await env.store.write(
                key,
                gitops.snapshot_commit,
                workspace,
                branch=task.branch,
                parent_sha=run.start_sha,
                message=wip_message(task.title, ref, "interrupted", "the server running it went away"),
                author=agent_identity(env.settings, agent_login),
                committer=forge_identity(env.settings),
                limits=gitops.SnapshotLimits(max_file_bytes=env.settings.task_max_file_bytes),
                manifest=manifest,
            )
        except Exception as exc:
            log.exception("recovery snapshot failed", run_id=run.id)
            out.error = safe_text(f"the work-in-progress snapshot of the interrupted run failed: {exc}")
    out.tip, out.tip_is_wip = await env.store.read(key, _tip, task.branch)
    return out


def plain(found: Salvage, exc: Exception) -> Salvage:
    """`found` without the lists recording it failed on (changed and skipped paths), and why."""
    out = Salvage()
    snap = found.snapshot
    if snap is not None:
        out.snapshot = gitops.Snapshot(sha=snap.sha, committed=snap.committed, changed_files=[], skipped=[])
    out.error = safe_text(f"the interrupted run's reports could not be recorded: {type(exc).__name__}: {exc}")
    out.tip, out.tip_is_wip = found.tip, found.tip_is_wip
    return out


def _tip(repo: pygit2.Repository, branch: str) -> tuple[str | None, bool]:
    sha = gitops.branch_sha(repo, branch)
    if sha is None:
        return None, False
    return sha, repo[sha].peel(pygit2.Commit).message.startswith("WIP:")


def sweep(root: Path, live_runs: set[str]) -> list[Path]:
    """Remove every workspace under `root` (`<task>/<run>`) whose run is not in `live_runs`, with
    its manifest, quota mount and image; returns what was removed. Blocking."""
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    doomed: set[Path] = {m for m in quota_mounts(root) if m.name not in live_runs}
    for task_dir in root.iterdir():
        if not task_dir.is_dir() or task_dir.is_symlink():
            continue
        for entry in task_dir.iterdir():
            name = entry.name
            for suffix in _SIDE_FILES:
                name = name.removesuffix(suffix)
            if name not in live_runs:
                doomed.add(task_dir / name)
    for workspace in sorted(doomed):
        remove_workspace(workspace)
        for suffix in _SIDE_FILES:
            with contextlib.suppress(OSError):
                workspace.with_name(workspace.name + suffix).unlink()
        removed.append(workspace)
    for task_dir in root.iterdir():
        with contextlib.suppress(OSError):
            task_dir.rmdir()  # empty now
    return removed


# Worker ids alive in this process: a run owned by an id of this process that is not here is orphaned.
_LIVE_WORKERS: set[str] = set()
FOREIGN_ENGINE_TIMEOUT = 10.0  # reaching a dead worker's engine, and removing its containers there


def worker_started(worker_id: str) -> None:
    _LIVE_WORKERS.add(worker_id)


def worker_stopped(worker_id: str) -> None:
    _LIVE_WORKERS.discard(worker_id)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_gone(owner: str, heartbeat_at: Any, *, lease: float, now: Any = None) -> bool:
    """The run's worker is gone: a worker of this process that stopped, a process of this host
    that is not alive (known at once), or any other worker whose lease (`heartbeat_at`) is older
    than `lease` seconds (a host gone silent, a cut network, a frozen process)."""
    host, _, rest = owner.partition(":")
    pid_text, _, _nonce = rest.partition(":")
    if host == socket.gethostname() and pid_text.isdigit():
        pid = int(pid_text)
        if pid == os.getpid():
            return owner not in _LIVE_WORKERS
        if not _pid_alive(pid):
            return True
    now = now or utcnow()
    return heartbeat_at is None or now - heartbeat_at > timedelta(seconds=lease)


async def recover(env: RunEnv, *, reap_containers: bool) -> None:
    """Runs whose worker is gone: reap their containers, snapshot their surviving workspaces
    as the work-in-progress commit, end them `interrupted` recording the branch's tip, remove
    their workspaces; then sweep workspaces (and quota mounts) no live run owns."""
    keep: set[str] = set()
    gone: list[tuple[int, str]] = []  # each run with the owner found gone
    dead: set[str] = set()
    lease = env.settings.worker_lease_seconds
    async with env.db.session() as s:
        runs = (await s.execute(select(Run).where(Run.state == RunState.RUNNING))).scalars().all()
        for run in runs:
            if run.owner == env.worker_id or not owner_gone(run.owner, run.heartbeat_at, lease=lease):
                keep.add(run.uuid)
            else:
                gone.append((run.id, run.owner))
                dead.add(first_owner(run.owner))
    for owner in sorted(dead):
        await _reap_on_its_engine(env, owner, keep)
    if reap_containers or gone:
        # Before any snapshot: a container still writing into its workspace is gone first.
        try:
            removed = await reap(env.engine, env.instance, keep=keep)
        except (EngineUnavailable, SandboxError) as exc:
            log.warning("could not reap sandboxes", error=str(exc))
        else:
            if removed:
                log.info("reaped orphaned sandboxes", count=len(removed))
    for run_id, seen_owner in gone:
        try:
            await _recover_run(env, run_id, seen_owner)
        except Exception:
            log.exception("recovering an interrupted run failed", run_id=run_id)
    keep |= await _live_run_uuids(env)
    swept = await asyncio.to_thread(sweep, workspaces_root(env), keep)
    if swept:
        log.info("removed workspaces no live run owns", count=len(swept))
    # This instance's channels, and those an earlier version left in the shared root itself.
    stale = []
    for root in (env.settings.effective_run_channel_dir, env.settings.run_channel_root):
        stale += await asyncio.to_thread(sweep_channels, root, keep)
    if stale:
        log.info("removed run channels no live run owns", count=len(stale))


async def _reap_on_its_engine(env: RunEnv, owner: str, keep: set[str]) -> None:
    """Remove a dead worker's containers on the engine it used (the register's), when that engine
    is another than this worker's and can be reached from here: a `tcp://` or `ssh://` engine, or a
    Unix socket of this same host. Otherwise its containers stay until a worker starts on that
    engine again (each worker reaps its engine at its start)."""
    async with env.db.session() as s:
        record = await worker_registry.find(s, owner)
    if record is None:
        return
    ours = worker_registry.engine_label(env.engine.base_url or os.environ.get("DOCKER_HOST", ""))
    same_host = record.host == socket.gethostname()
    if record.engine == ours and same_host:
        return  # this worker's own engine: the reap below covers it
    if not record.engine or (record.engine.startswith("unix://") and not same_host):
        log.warning(
            "a dead worker's containers are on an engine this host cannot reach: they go when a worker starts there",
            worker=owner,
            host=record.host,
            engine=record.engine or "(its default socket)",
        )
        return
    try:
        async with asyncio.timeout(FOREIGN_ENGINE_TIMEOUT):
            async with SandboxEngine(record.engine) as engine:
                removed = await reap(engine, env.instance, keep=keep, orphans=False)
    except (TimeoutError, EngineUnavailable, SandboxError) as exc:
        log.warning("a dead worker's engine did not answer", worker=owner, engine=record.engine, error=str(exc))
        return
    log.info("removed a dead worker's containers on its engine", worker=owner, engine=record.engine, count=len(removed))


async def _live_run_uuids(env: RunEnv) -> set[str]:
    # Runs that started while this recovery ran (another worker's) keep their workspaces too.
    async with env.db.session() as s:
        return set((await s.execute(select(Run.uuid).where(Run.state == RunState.RUNNING))).scalars().all())


#: Between the owner the run had and the worker recovering it, in `Run.owner` while it recovers.
RECOVERING = " recovering "


def first_owner(owner: str) -> str:
    """The worker that ran the run, also while another worker recovers it (`RECOVERING`)."""
    return owner.split(RECOVERING, 1)[1] if RECOVERING in owner else owner


async def _recover_run(env: RunEnv, run_id: int, seen_owner: str) -> None:
    owner = await _take(env, run_id, seen_owner)
    if owner is None:
        return
    async with _renewing(env, run_id, owner):
        await _salvage_and_record(env, run_id)


@contextlib.asynccontextmanager
async def _renewing(env: RunEnv, run_id: int, owner: str) -> AsyncIterator[None]:
    """The taker's lease on the run it recovers, renewed while it does (a large workspace takes a
    while to snapshot): another worker must not take it again meanwhile."""

    async def renew() -> None:
        while True:
            await asyncio.sleep(env.settings.worker_lease_seconds / 3)
            with contextlib.suppress(Exception):
                async with env.db.session(write=True) as s:
                    await s.execute(
                        update(Run).where(Run.id == run_id, Run.owner == owner).values(heartbeat_at=utcnow())
                    )

    renewing = asyncio.create_task(renew())
    try:
        yield
    finally:
        renewing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewing


async def _salvage_and_record(env: RunEnv, run_id: int) -> None:
    async with env.db.session() as s:
        run = await s.get(Run, run_id)
        task = await s.get(Task, run.task_id) if run is not None else None
        repo = await s.get(Repository, run.repo_id) if run is not None else None
        agent = await s.get(Account, task.agent_id) if task is not None else None
        if run is None or task is None or repo is None or run.state != RunState.RUNNING:
            return
        key = (repo.owner.login.lower(), repo.name.lower())
        # The pooled connection goes back before the git work (a large workspace takes a while);
        # what was read stays loaded (sessions do not expire on commit; nothing was written).
        await s.commit()
        try:
            # Before any git write: the dead worker, should it wake, can no longer move the branch.
            await env.store.write(key, fences.revoke, run.uuid)
        except RefConflict as exc:
            log.warning("the run's fence stayed locked: recovered at a later pass", run_id=run_id, error=str(exc))
            return
        found = await salvage(env, run, task, repo, agent.login if agent else "agent")
        workspace = workspace_of(env, task.uuid, run.uuid)
    try:
        await _record_interrupted(env, run_id, found)
    except Exception as exc:
        # Never the same failure on every start: the run ends without what could not be written.
        log.exception("recording an interrupted run failed; recording it without its reports", run_id=run_id)
        await _record_interrupted(env, run_id, plain(found, exc))
    await asyncio.to_thread(remove_workspace, workspace)


async def _take(env: RunEnv, run_id: int, seen_owner: str) -> str | None:
    """Make the run this worker's to recover, in the database, before anything else: its owner
    becomes `<this worker> recovering <its worker>`, so the worker that ran it, should it wake,
    records nothing (its settle and its beat find the run no longer its own). Only this worker
    renews that owner's lease, while it recovers (`_renewing`): if it dies before the run is
    recorded, the lease lapses and another worker recovers the run again. The owner it wrote;
    None if the run is no longer running, or no longer the gone worker's (`seen_owner`'s): it
    renewed its lease meanwhile, or another worker took the run first."""
    async with env.db.session(write=True) as s:
        seen = await s.get(Run, run_id)
        if seen is None:
            return None
        await env.lifecycle(s).lock_id(seen.task_id)
        run = await s.get(Run, run_id, with_for_update=True, populate_existing=True)
        if run is None or run.state != RunState.RUNNING or run.owner != seen_owner:
            return None
        if not owner_gone(run.owner, run.heartbeat_at, lease=env.settings.worker_lease_seconds):
            return None  # a late beat came in: its worker is alive after all
        owner = f"{env.worker_id}{RECOVERING}{first_owner(run.owner)}"
        run.owner = owner
        run.heartbeat_at = utcnow()
    return owner


async def _record_interrupted(env: RunEnv, run_id: int, found: Salvage) -> None:
    async with env.db.session(write=True) as s:
        seen = await s.get(Run, run_id)
        if seen is None:
            return
        # The task's lock, then the run read under it: its worker's own settle takes them in that order.
        await env.lifecycle(s).lock_id(seen.task_id)
        run = await s.get(Run, run_id, with_for_update=True, populate_existing=True)
        if run is None or run.state != RunState.RUNNING:
            return  # settled meanwhile (by its worker before it stalled, or by another worker)
        run.owner = first_owner(run.owner)  # the run's JSON names the worker that ran it
        # Its custom tools' runs still waiting or running ended with it (their containers were reaped).
        open_states = [ToolRunState.AWAITING_APPROVAL.value, ToolRunState.QUEUED.value, ToolRunState.RUNNING.value]
        await s.execute(
            update(CustomToolRun)
            .where(CustomToolRun.run_id == run_id, CustomToolRun.state.in_(open_states))
            .values(state=ToolRunState.CANCELLED.value, finished_at=utcnow())
        )
        await _settle_interrupted(env, s, run, found)


async def _settle_interrupted(env: RunEnv, s: Any, run: Run, found: Salvage) -> None:
    task = await env.lifecycle(s).lock_id(run.task_id)
    repo = await s.get(Repository, run.repo_id)
    run.state = RunState.FAILED
    run.failure_reason = FailureReason.INTERRUPTED
    run.error = INTERRUPTED
    run.finished_at = utcnow()
    if repo is None:
        return
    life = env.lifecycle(s)
    notices = [Pending(kind="notice", payload=Notice(text=run.error, level="error"), run_id=run.id)]
    snap = found.snapshot
    if snap is not None:
        run.skipped = [{"path": x.path, "reason": x.reason} for x in snap.skipped]
        if snap.committed:
            files = plural(len(snap.changed_files), "file")
            text = f"work-in-progress snapshot {snap.sha[:12]} on {task.branch}: {files} changed"
            notices.append(Pending(kind="notice", payload=Notice(text=text), run_id=run.id))
    if found.error:
        notices.append(Pending(kind="notice", payload=Notice(text=found.error, level="error"), run_id=run.id))
    # What the branch holds is the task's head: a snapshot taken now, or one that landed
    # before the crash cut the run's end off.
    if found.tip is not None and found.tip != task.head_sha and run.start_sha:
        run.end_sha = found.tip
        task.head_sha = found.tip
        task.head_is_wip = bool(snap is not None and snap.committed) or found.tip_is_wip
    await life.append(task.id, notices)
    await life.publish("run.finished", task, repo, run=run, data=run_data(run))
    if TaskState(task.state) in (TaskState.RUNNING, TaskState.QUEUED):
        task.failure_reason = FailureReason.INTERRUPTED
        task.error = run.error
        await life.set_state(task, repo, TaskState.FAILED, run=run)
        await report_to_parent(life, task)  # a subtask's parent hears of it too
