"""An environment check read back (docs/environments.md, "Checking an environment without an
agent"): the command task that `POST .../environment/check` and the settings page's "Check
environment" start, as the settings page shows it: passed or failed, the smoke command's exit code
and the tail of its output (of the setup's log instead, when the build failed before the command
ran). The transcript holds everything; this is the summary beside the environment's form."""

from typing import Literal

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.errors import NotFound
from forge.repos.repositories import RepoResource
from tasks.core.models import Run, Task, TranscriptEvent
from tasks.core.schemas import command_text
from tasks.core.states import FailureReason, RunState, TaskState

CHECK_TITLE = "Check environment"
TAIL_LINES = 40
TAIL_CHARS = 8192
FOLD_LINES = 10  # a longer log is shown folded
OUTPUT_EVENTS = 400  # the newest output events read for the tail

Outcome = Literal["running", "passed", "failed", "stopped"]
LogSource = Literal["command", "setup", ""]


class EnvironmentCheckRead(msgspec.Struct, kw_only=True):
    number: int  # the check's task
    command: str
    state: str  # the task's
    outcome: Outcome
    exit_code: int | None  # the smoke command's (None: it did not run, or not yet)
    error: str  # why it failed, when not the command's exit code alone
    log: str  # the tail of the command's output, or of the setup's log
    log_source: LogSource
    log_lines: int
    log_cut: bool  # earlier lines were left out

    @property
    def done(self) -> bool:
        return self.outcome != "running"

    @property
    def folded(self) -> bool:
        return self.log_lines > FOLD_LINES


def is_check(task: Task) -> bool:
    return task.runtime == "command" and task.title == CHECK_TITLE


def tail(text: str) -> tuple[str, bool]:
    """The last `TAIL_LINES` lines (at most `TAIL_CHARS` characters) and whether any were cut."""
    lines = text.rstrip("\n").splitlines()
    kept = "\n".join(lines[-TAIL_LINES:])
    cut = len(lines) > TAIL_LINES
    if len(kept) > TAIL_CHARS:  # from the first whole line within the last TAIL_CHARS
        kept, cut = kept[-TAIL_CHARS:], True
        kept = kept.split("\n", 1)[1] if "\n" in kept else kept
    return kept, cut


def _outcome(task: Task, run: Run | None) -> Outcome:
    if TaskState(task.state).is_active or run is None or RunState(run.state).is_active:
        return "running"
    if run.state == RunState.SUCCEEDED:
        return "passed"
    if run.state in (RunState.STOPPED, RunState.CANCELLED):
        return "stopped"
    return "failed"


async def _output(session: AsyncSession, task: Task, run: Run) -> tuple[str, bool]:
    """The run's stdout and stderr as they came (the newest `OUTPUT_EVENTS` events), and whether
    older ones were left out."""
    stmt = (
        select(TranscriptEvent.payload)
        .where(
            TranscriptEvent.task_id == task.id,
            TranscriptEvent.run_id == run.id,
            TranscriptEvent.kind.in_(("stdout", "stderr")),
        )
        .order_by(TranscriptEvent.seq.desc())
        .limit(OUTPUT_EVENTS)
    )
    payloads = (await session.scalars(stmt)).all()
    return "".join(str((p or {}).get("text", "")) for p in reversed(payloads)), len(payloads) >= OUTPUT_EVENTS


async def _setup_log(session: AsyncSession, task: Task, run: Run) -> str:
    """The log of the run's environment build, when it built one (the last `environment` event's)."""
    stmt = (
        select(TranscriptEvent.payload)
        .where(TranscriptEvent.task_id == task.id, TranscriptEvent.run_id == run.id, TranscriptEvent.kind == "system")
        .order_by(TranscriptEvent.seq.desc())
    )
    for payload in (await session.scalars(stmt)).all():
        if (payload or {}).get("phase") == "environment":
            return str((payload.get("detail") or {}).get("log") or "")
    return ""


def _error(task: Task, run: Run | None) -> str:
    """Why the check failed, unless the exit code says it all (a failing setup, a timeout, ...)."""
    if run is not None and run.failure_reason == FailureReason.EXIT_CODE:
        return ""
    return (run.error if run is not None else "") or task.error


async def read(session: AsyncSession, res: RepoResource, number: int) -> EnvironmentCheckRead:
    """The check `number` of the repository (the caller loaded `res` for a repository admin): 404
    `not_found` when that task is no environment check."""
    task = (
        await session.execute(select(Task).where(Task.repo_id == res.repo.id, Task.number == number))
    ).scalar_one_or_none()
    if task is None or not is_check(task):
        raise NotFound("no environment check has this number", code="not_found")
    run = (
        await session.execute(select(Run).where(Run.task_id == task.id).order_by(Run.seq.desc()).limit(1))
    ).scalar_one_or_none()
    outcome = _outcome(task, run)
    log, older = "", False
    source: LogSource = ""
    if run is not None and outcome != "running":
        log, older = await _output(session, task, run)
        source = "command"
        if not log.strip() and run.exit_code is None:  # the command never ran: the build's log tells why
            log, source = await _setup_log(session, task, run), "setup"
    shown, cut = tail(log) if log.strip() else ("", False)
    return EnvironmentCheckRead(
        number=task.number,
        command=command_text(task.command),
        state=task.state,
        outcome=outcome,
        exit_code=run.exit_code if run is not None else None,
        error=_error(task, run) if outcome == "failed" else "",
        log=shown,
        log_source=source if shown else "",
        log_lines=len(shown.splitlines()),
        log_cut=cut or older,
    )
