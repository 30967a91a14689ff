"""Settling a run: remove the sandbox, take the snapshot commit of the workspace, tell the policy
the run stopped, and record the outcome (the run's and the task's new state, a parked call, the
next queued message) in one transaction."""

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import structlog

from forge.core.settings import Settings
from forge.core.text import plural, safe_text
from forge.db.engine import utcnow
from forge.db.events import RunFinished
from forge.db.models import Repository
from forge.db.payload_base import TriggerRef
from forge.git import Identity, fences
from forge.git.errors import Fenced
from forge.repos.repositories import RepoResource
from sandbox import Sandbox
from sandbox import remove_workspace as sandbox_remove_workspace
from tasks.core import payloads, task_pulls
from tasks.core.lifecycle import Lifecycle
from tasks.core.models import Run, Task
from tasks.core.parked import park
from tasks.core.policy import GateContext
from tasks.core.states import FailureReason, RunKind, RunState, TaskState
from tasks.core.subtasks import report_to_parent
from tasks.core.transcript import Notice, Pending, Prompt, Summary
from tasks.core.writer import TranscriptWriter
from tasks.run import gitops, task_status
from tasks.run.env import RunEnv
from tasks.run.runtimes.base import Outcome

log = structlog.get_logger("forgehand.tasks")


def run_data(run: Run) -> RunFinished:
    return payloads.run_finished(run)


def remove_workspace(path: Path) -> None:
    sandbox_remove_workspace(path)  # unmounts the workspace's quota filesystem and deletes its image first
    with contextlib.suppress(OSError):
        gitops.manifest_path(path).unlink()
    with contextlib.suppress(OSError):
        path.parent.rmdir()  # the task's directory, when this was its last workspace


def host_of(settings: Settings) -> str:
    return urlsplit(settings.effective_base_url).hostname or "localhost"


def agent_identity(settings: Settings, login: str) -> Identity:
    return Identity(name=login, email=f"{login.lower()}@bots.{host_of(settings)}")


def forge_identity(settings: Settings) -> Identity:
    return Identity(name="forgehand", email=f"forgehand@{host_of(settings)}")


def wip_message(title: str, ref: str, state: str, why: str) -> str:
    return f"WIP: {title}\n\nWork in progress: the run ended {state} ({why}).\n\nTask {ref}\n"


class Settling:
    """The settling steps of `Execution` (what it loaded and provisioned, declared here)."""

    env: RunEnv
    run_id: int
    run_uuid: str
    task_id: int
    run_seq: int
    number: int
    title: str
    full_name: str
    branch: str
    agent_login: str
    repo_key: tuple[str, str]
    sandbox: Sandbox | None
    workspace: Path | None
    checkout: gitops.Checkout | None
    start_sha: str
    writer: TranscriptWriter | None
    trigger: TriggerRef | None
    settled_snap: gitops.Snapshot | None = None  # the settle step's snapshot, once taken
    fence_held = False  # the run's git fence (forge.git.fences), held since its workspace was made
    turns: int
    prompt_tokens: int
    completion_tokens: int

    async def system(self, phase: str, text: str, t0: float | None = None, **detail: Any) -> None:
        raise NotImplementedError

    def gate_ctx(self) -> GateContext:
        raise NotImplementedError

    async def settle(self, outcome: Outcome, stopped: bool) -> None:
        """Settle the run. Whatever fails on the way (an event that cannot be encoded, a write the
        database refuses) still ends it: failed `settle_failed` with the error, never left
        `running`; the workspace and its quota mount go once the run is recorded."""
        settled = False
        try:
            await self._settle(outcome, stopped)
            settled = True
        except Exception as exc:
            log.exception("settling the run failed", run_id=self.run_id)
            settled = await self._settle_failed(exc)
        if settled and self.fence_held:
            try:  # a fence still held goes with the run (a revoked one stays)
                await self.env.store.write(self.repo_key, fences.release, self.run_uuid)
            except Exception as exc:
                log.warning("the run's fence could not be removed", run_id=self.run_id, error=str(exc))
        if settled and self.workspace is not None:
            await asyncio.to_thread(remove_workspace, self.workspace)

    async def _settle_failed(self, exc: Exception) -> bool:
        """End the run failed after its settle step raised (unless it already got recorded), with the
        snapshot's commit if one landed; False if even that could not be written (then recovery
        takes the run, its workspace kept for the work-in-progress snapshot)."""
        if self.writer is not None:
            with contextlib.suppress(Exception):
                await self.writer.close()
        error = safe_text(f"the run could not be settled: {type(exc).__name__}: {exc}")
        outcome = Outcome(status=RunState.FAILED, failure_reason=FailureReason.SETTLE_FAILED, error=error)
        snap = self.settled_snap
        if snap is not None:
            snap = gitops.Snapshot(sha=snap.sha, committed=snap.committed, changed_files=[], skipped=[])
        try:
            await self.finish_in_db(outcome, RunState.FAILED, snap, notice=error)
        except Exception:
            log.exception("recording the failed settle failed", run_id=self.run_id)
            return False
        return True

    async def _settle(self, outcome: Outcome, stopped: bool) -> None:
        assert self.writer is not None
        await self._remove_sandbox()
        if not await self._still_ours():
            await self._taken_over()
            return
        run_state = RunState.STOPPED if stopped else outcome.status
        snap: gitops.Snapshot | None = None
        if self.workspace is not None and self.start_sha:
            try:
                snap, run_state = await self._snapshot(outcome, run_state, stopped)
            except Fenced:
                # Taken over between the check above and the snapshot (this worker stalled there):
                # the branch was not moved, and the taker records the run.
                await self._taken_over()
                return
            if outcome.status is RunState.SUCCEEDED or stopped or outcome.failure_reason is not None:
                changed = snap.changed_files if snap else []
                with contextlib.suppress(Exception):
                    await self.env.gate.stop(
                        self.gate_ctx(),
                        summary=outcome.summary,
                        turns=self.turns,
                        changed_files=changed,
                    )
        if outcome.summary:
            await self.writer.emit("summary", Summary(text=outcome.summary, reported=outcome.summary_reported))
        if outcome.error and not stopped:
            await self.writer.emit("notice", Notice(text=outcome.error, level="error"))
        await self.writer.close()
        await self.finish_in_db(outcome, run_state, snap)

    async def _taken_over(self) -> None:
        """Another worker took the run over (this one's lease lapsed: a stalled process, a cut
        network): it snapshotted the workspace and ended the run. Nothing more is written here."""
        log.warning("the run was taken over by another worker: not settled here", run_id=self.run_id)
        self.leave_to_taker()
        if self.writer is not None:
            with contextlib.suppress(Exception):
                await self.writer.close()

    def leave_to_taker(self) -> None:
        """The run is another worker's now: its fence (revoked) stays, and its workspace is the
        taker's to snapshot and remove (or, once no live run owns it, this host's sweep's): never
        removed under the taker."""
        self.fence_held = False
        self.workspace = None

    async def _still_ours(self) -> bool:
        async with self.env.db.session() as s:
            run = await s.get(Run, self.run_id)
            return run is not None and run.owner == self.env.worker_id and run.state == RunState.RUNNING

    async def _remove_sandbox(self) -> None:
        if self.sandbox is not None:
            t0 = time.monotonic()
            try:
                await self.sandbox.remove()
                await self.system("sandbox_removed", "sandbox removed", t0)
            except Exception as exc:
                log.warning("sandbox removal failed", run_id=self.run_id, error=str(exc))

    async def _snapshot(
        self, outcome: Outcome, run_state: RunState, stopped: bool
    ) -> tuple[gitops.Snapshot | None, RunState]:
        """The workspace's snapshot commit on the task branch (work in progress for a failed or
        stopped run); a snapshot that fails fails the run (unless stopped). The snapshot (None if
        it failed) and the run's state."""
        env = self.env
        assert self.writer is not None and self.workspace is not None
        t0 = time.monotonic()
        if self.trigger is not None and self.trigger.kind == "review_request":
            # A review task's result is its review: what its agent changed is never committed nor proposed.
            await self.system("snapshot", "a review task: its work tree is not committed", t0, committed=False)
            return gitops.Snapshot(sha=self.start_sha, committed=False, changed_files=[], skipped=[]), run_state
        wip = run_state in (RunState.FAILED, RunState.STOPPED)
        try:
            snap = await env.store.write(
                self.repo_key,
                gitops.snapshot_commit,
                self.workspace,
                branch=self.branch,
                parent_sha=self.start_sha,
                message=self.commit_message(outcome, run_state, wip),
                author=agent_identity(env.settings, self.agent_login),
                committer=forge_identity(env.settings),
                limits=gitops.SnapshotLimits(max_file_bytes=env.settings.task_max_file_bytes),
                manifest=self.checkout,
                fence=self.run_uuid,
            )
        except Fenced:
            raise
        except Exception as exc:
            log.exception("snapshot failed", run_id=self.run_id)
            await self.writer.emit("notice", Notice(text=f"the snapshot commit failed: {exc}", level="error"))
            if not stopped:  # a run whose work could not be committed fails: never "success, nothing to review"
                big = isinstance(exc, gitops.SnapshotTooLarge)
                outcome.failure_reason = FailureReason.SNAPSHOT_TOO_LARGE if big else FailureReason.SNAPSHOT_FAILED
                outcome.status, outcome.error = RunState.FAILED, f"the snapshot failed: {exc}"
                run_state = RunState.FAILED
            return None, run_state
        self.settled_snap = snap
        await self._report_snapshot(snap, wip, t0)
        return snap, run_state

    async def _report_snapshot(self, snap: gitops.Snapshot, wip: bool, t0: float) -> None:
        """The snapshot's system event, and a warning naming what was not committed."""
        assert self.writer is not None
        if snap.committed:
            kind = "work-in-progress snapshot" if wip else "snapshot"
            text = f"{kind} {snap.sha[:12]} on {self.branch}: {plural(len(snap.changed_files), 'file')} changed"
        else:
            text = "no changes: no new commit, the task branch is left as it was"
        await self.system(
            "snapshot",
            text,
            t0,
            sha=snap.sha,
            committed=snap.committed,
            wip=wip and snap.committed,
            changed_files=snap.changed_files[:200],
            skipped=[{"path": s.path, "reason": s.reason} for s in snap.skipped[:200]],
        )
        if snap.skipped:
            await self.writer.emit(
                "notice",
                Notice(
                    text="not committed: " + "; ".join(f"{s.path} ({s.reason})" for s in snap.skipped[:20]),
                    level="warning",
                ),
            )

    def commit_message(self, outcome: Outcome, state: RunState, wip: bool) -> str:
        ref = f"{self.full_name}#{self.number}, run {self.run_seq}"
        if wip:
            return wip_message(self.title, ref, state.value, outcome.error or state.value)
        body = f"\n\n{outcome.summary}" if outcome.summary else ""
        return f"{self.title}{body}\n\nTask {ref}\n"

    async def finish_in_db(
        self, outcome: Outcome, run_state: RunState, snap: gitops.Snapshot | None, *, notice: str = ""
    ) -> None:
        env = self.env
        async with env.db.session(write=True) as s:
            life = env.lifecycle(s)
            task = await life.lock_id(self.task_id)
            # Read under the task's lock (recovery takes it too), never from an earlier read.
            run = await s.get(Run, self.run_id, with_for_update=True, populate_existing=True)
            repo = await s.get(Repository, task.repo_id)
            assert run is not None and repo is not None
            if run.owner != env.worker_id:
                self.leave_to_taker()  # another worker is recovering it: it records the run
                return
            if run.state != RunState.RUNNING:
                return  # recorded already: by a takeover that is done, or before a settle failure
            if notice:  # the settle step failed: its writer is gone, the reason goes in this transaction
                await life.append(
                    task.id, [Pending(kind="notice", payload=Notice(text=notice, level="error"), run_id=run.id)]
                )
            self._record_run(run, task, outcome, run_state, snap)
            await life.publish("run.finished", task, repo, run=run, data=run_data(run))
            if snap is not None and snap.committed:
                await task_status.report(life, task, repo, run)
            current = TaskState(task.state)
            if current is not TaskState.RUNNING:
                return  # settled elsewhere (recovered as interrupted by another worker)
            await self._next_state(life, task, repo, run, outcome, run_state)
            await self._follow_pull(life, task, repo)
            if task.parent_id is not None and TaskState(task.state) is not TaskState.QUEUED:
                await report_to_parent(life, task)

    async def _follow_pull(self, life: Lifecycle, task: Task, repo: Repository) -> None:
        """The task's pull request follows it; a failure there is logged and never fails the run's
        settling (the task's state and transcript are what matter here)."""
        try:
            async with life.session.begin_nested():
                await task_pulls.follow(life, self.env.store, task, RepoResource(repo=repo))
        except Exception:
            log.exception("the task's pull request did not follow its run", task_id=task.id)

    def _record_run(
        self, run: Run, task: Task, outcome: Outcome, run_state: RunState, snap: gitops.Snapshot | None
    ) -> None:
        """The run's ending on its row; the snapshot as the task's head, the conversation and summary on the task."""
        run.state = run_state
        run.exit_code = outcome.exit_code
        run.error = "" if run_state is RunState.STOPPED else outcome.error
        run.failure_reason = (
            (outcome.failure_reason.value if outcome.failure_reason else "") if run_state is RunState.FAILED else ""
        )
        run.finished_at = utcnow()
        run.turns = self.turns
        run.prompt_tokens = self.prompt_tokens
        run.completion_tokens = self.completion_tokens
        if snap is not None:
            run.end_sha = snap.sha
            run.skipped = [{"path": x.path, "reason": x.reason} for x in snap.skipped]
            run.no_changes = not snap.committed
            if snap.committed or not task.head_sha:
                task.head_sha = snap.sha
                task.head_is_wip = snap.committed and run_state in (RunState.FAILED, RunState.STOPPED)
        if outcome.conversation is not None:
            task.conversation = outcome.conversation
        run.summary, run.summary_reported = outcome.summary, outcome.summary_reported and bool(outcome.summary)
        if outcome.summary:
            task.summary = outcome.summary

    async def _next_state(
        self, life: Lifecycle, task: Task, repo: Repository, run: Run, outcome: Outcome, run_state: RunState
    ) -> None:
        """The task's state after its run: stopped, blocked (a question or a parked call), queued
        for the message that waited, in review, or failed."""
        if run_state is RunState.STOPPED:
            task.queued_message = ""
            await life.set_state(task, repo, TaskState.STOPPED, run=run)
        elif run_state is RunState.BLOCKED:
            task.question = outcome.question
            task.question_options = list(outcome.question_options) if outcome.question else None
            if outcome.approval is not None:
                await park(
                    life, task, repo, run, outcome.approval, ttl_seconds=self.env.settings.task_approval_ttl_seconds
                )
            await life.set_state(task, repo, TaskState.BLOCKED, run=run)
        elif task.queued_message and outcome.failure_reason is not FailureReason.POLICY_BYPASS:
            # (after a bypass the task stays failed for inspection: nothing continues on its own)
            body, task.queued_message = task.queued_message, ""
            nxt = await life.new_run(task, RunKind.MESSAGE, body, None)
            if run_state is RunState.FAILED:
                task.error = outcome.error
                task.failure_reason = outcome.failure_reason.value if outcome.failure_reason else ""
            await life.append(
                task.id, [Pending(kind="prompt", payload=Prompt(text=body, source="message"), run_id=nxt.id)]
            )
            await life.set_state(task, repo, TaskState.QUEUED, run=nxt)
        elif run_state is RunState.SUCCEEDED:
            task.error = ""
            task.failure_reason = ""
            await life.set_state(task, repo, TaskState.AWAITING_REVIEW, run=run)
        else:
            task.error = outcome.error
            task.failure_reason = (
                outcome.failure_reason.value if outcome.failure_reason else FailureReason.INTERNAL.value
            )
            await life.set_state(task, repo, TaskState.FAILED, run=run)
