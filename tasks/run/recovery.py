"""What recovery does for a run whose worker went away (a SIGKILLed server): its surviving
workspace becomes the work-in-progress commit (the settle step's snapshot, with the checkout
manifest saved beside the workspace), the task records what its branch holds (a snapshot that
landed before the crash included), and the workspace goes. A sweep removes the workspaces,
manifests, quota mounts and images that no live run owns.

Blocking work (pygit2, mounts) runs in threads."""

import asyncio
import contextlib
from pathlib import Path

import pygit2
import structlog

from forge.core.text import safe_text
from forge.db.models import Repository
from sandbox import quota_mounts
from tasks.core.models import Run, Task
from tasks.run import gitops
from tasks.run.env import RunEnv
from tasks.run.settle import agent_identity, forge_identity, remove_workspace, wip_message

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
    if run.start_sha and workspace.is_dir():
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
