"""The read model of tasks: `TaskRead`s for a page of tasks in a constant number of queries
(runs, pending approvals, accounts and the queue, each one query for the whole page), whatever
the page size; and `ApprovalRead`s the same way."""

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.errors import InvalidInput, NotFound
from forge.db.models import Account
from forge.repos.repositories import RepoResource
from tasks.core.models import Approval, Run, RunSkipped, Task
from tasks.core.parked import is_due
from tasks.core.schemas import (
    ApprovalRead,
    EgressRead,
    EnvironmentOverride,
    ParentRead,
    PullLink,
    RunRead,
    SkippedPage,
    SkippedPath,
    TaskRead,
    Trigger,
    UsageRead,
)
from tasks.core.states import ApprovalState, RunState, TaskState


async def release(session: AsyncSession) -> None:
    """End a read-only session's transaction so its pooled connection goes back to the pool
    before a wait (a policy call, a stream, a queued write); the next read takes one again. What
    it loaded stays loaded (the sessions do not expire on commit). Never call it on a session
    with pending writes: it would commit them."""
    if session.in_transaction():
        await session.commit()


def approval_read(a: Approval, run_seq: int, decided_by: str | None) -> ApprovalRead:
    # A pending approval past its time reads as expired even before the sweeper settles it.
    state = ApprovalState.EXPIRED if a.state == ApprovalState.PENDING and is_due(a) else a.state
    return ApprovalRead(
        id=a.uuid,
        state=state,
        tool_use_id=a.tool_use_id,
        tool_name=a.tool_name,
        tool_input=a.tool_input if isinstance(a.tool_input, dict) else {},
        input_hash=a.input_hash,
        reason=a.reason,
        held=a.held,
        requested_by=a.requested_by,
        run=run_seq,
        created_at=a.created_at,
        expires_at=a.expires_at,
        decided_by=decided_by,
        decided_at=a.decided_at,
        decision_reason=a.decision_reason,
    )


async def logins(session: AsyncSession, ids: set[int]) -> dict[int, str]:
    """Account id -> login, one query."""
    rows = await session.execute(select(Account.id, Account.login).where(Account.id.in_(ids)))
    return {int(i): str(login) for i, login in rows.tuples()}


async def approval_reads(session: AsyncSession, approvals: Sequence[Approval]) -> list[ApprovalRead]:
    run_ids = {a.run_id for a in approvals}
    seqs = dict((await session.execute(select(Run.id, Run.seq).where(Run.id.in_(run_ids)))).tuples().all())
    names = await logins(session, {a.decided_by_id for a in approvals if a.decided_by_id})
    return [
        approval_read(a, seqs.get(a.run_id, 0), names.get(a.decided_by_id) if a.decided_by_id else None)
        for a in approvals
    ]


def usage_of(runs: Sequence[Run]) -> UsageRead:
    """The metered usage of some runs; the cost is null when any run's calls were not all priced."""
    tokens = [r.input_tokens + r.output_tokens + r.cache_read_tokens + r.cache_write_tokens for r in runs]
    costs = [r.cost_micros for r, n in zip(runs, tokens, strict=True) if n or r.cost_micros]
    priced = bool(costs) and all(c is not None for c in costs)
    return UsageRead(
        input_tokens=sum(r.input_tokens for r in runs),
        output_tokens=sum(r.output_tokens for r in runs),
        cache_read_tokens=sum(r.cache_read_tokens for r in runs),
        cache_write_tokens=sum(r.cache_write_tokens for r in runs),
        cost_usd=sum(c or 0 for c in costs) / 1_000_000 if priced else None,
    )


def egress_of(runs: Sequence[Run]) -> EgressRead:
    return EgressRead(allowed=sum(r.egress_allowed for r in runs), blocked=sum(r.egress_blocked for r in runs))


def run_read(r: Run) -> RunRead:
    return RunRead(
        usage=usage_of([r]),
        egress=egress_of([r]),
        model_key=r.model_key or None,
        model_provider=r.model_provider or None,
        number=r.seq,
        kind=r.kind,
        state=r.state,
        exit_code=r.exit_code,
        error=r.error,
        failure_reason=r.failure_reason or None,
        turns=r.turns,
        prompt_tokens=r.prompt_tokens,
        completion_tokens=r.completion_tokens,
        container_id=r.container_id,
        start_sha=r.start_sha,
        end_sha=r.end_sha,
        skipped=[{"path": str(s.get("path", "")), "reason": str(s.get("reason", ""))} for s in r.skipped],
        skipped_count=r.skipped_count,
        no_changes=r.no_changes,
        created_at=r.created_at,
        started_at=r.started_at,
        finished_at=r.finished_at,
        agent_name=r.agent_name,
        agent_version=r.agent_version,
        summary=r.summary,
        summary_reported=r.summary_reported,
        worker=r.owner or None,
    )


async def _queue_positions(session: AsyncSession, runs: dict[int, list[Run]], tasks: Sequence[Task]) -> dict[int, int]:
    """task id -> 1-based place of its first queued run among all queued runs (one query)."""
    first = {
        t.id: min(r.id for r in runs.get(t.id, []) if r.state == RunState.QUEUED)
        for t in tasks
        if t.state == TaskState.QUEUED and any(r.state == RunState.QUEUED for r in runs.get(t.id, []))
    }
    # One grouped count: for each first queued run, the queued runs before it.
    ahead = Run.__table__.alias("ahead")
    rows = await session.execute(
        select(Run.id, func.count(ahead.c.id))
        .select_from(Run)
        .outerjoin(ahead, (ahead.c.state == RunState.QUEUED) & (ahead.c.id < Run.id))
        .where(Run.id.in_(set(first.values())))
        .group_by(Run.id)
    )
    counts = {int(run_id): int(n) for run_id, n in rows.tuples()}
    return {task_id: counts.get(run_id, 0) + 1 for task_id, run_id in first.items()}


async def _numbers(session: AsyncSession, task_ids: set[int]) -> dict[int, int]:
    """task id -> number (one query)."""
    if not task_ids:
        return {}
    rows = await session.execute(select(Task.id, Task.number).where(Task.id.in_(task_ids)))
    return {int(i): int(n) for i, n in rows.tuples()}


async def _child_counts(session: AsyncSession, task_ids: list[int]) -> dict[int, int]:
    """task id -> how many subtasks it has (one grouped query)."""
    rows = await session.execute(
        select(Task.parent_id, func.count(Task.id)).where(Task.parent_id.in_(task_ids)).group_by(Task.parent_id)
    )
    return {int(p): int(n) for p, n in rows.tuples() if p is not None}


@dataclass(frozen=True, slots=True)
class _PageFacts:
    """What a page of tasks reads besides the tasks, one query each."""

    runs: dict[int, list[Run]]  # task id -> its runs in order
    pending: dict[int, Approval]  # a blocked task's latest pending approval
    names: dict[int, str]  # account id -> login
    positions: dict[int, int]  # a queued task's place in the queue
    parents: dict[int, int]  # parent task id -> number
    children: dict[int, int]  # task id -> how many subtasks
    seq_of: dict[int, int]  # run id -> seq


async def task_reads(session: AsyncSession, base_url: str, page: Sequence[tuple[Task, RepoResource]]) -> list[TaskRead]:
    facts = await _page_facts(session, [t for t, _ in page])
    return [_task_read(task, res, facts, base_url) for task, res in page]


async def _page_facts(session: AsyncSession, tasks: list[Task]) -> _PageFacts:
    ids = [t.id for t in tasks]
    runs: dict[int, list[Run]] = {}
    for r in (await session.execute(select(Run).where(Run.task_id.in_(ids)).order_by(Run.seq))).scalars():
        runs.setdefault(r.task_id, []).append(r)
    blocked = [t.id for t in tasks if t.state == TaskState.BLOCKED]
    pending: dict[int, Approval] = {}
    for a in (
        await session.execute(
            select(Approval)
            .where(Approval.task_id.in_(blocked), Approval.state == ApprovalState.PENDING)
            .order_by(Approval.id)
        )
    ).scalars():
        pending[a.task_id] = a  # the latest one (as `parked.pending_for`)
    wanted = {t.agent_id for t in tasks} | {t.started_by_id for t in tasks if t.started_by_id}
    wanted |= {t.merged_by_id for t in tasks if t.merged_by_id}
    return _PageFacts(
        runs=runs,
        pending=pending,
        names=await logins(session, wanted),
        positions=await _queue_positions(session, runs, tasks),
        parents=await _numbers(session, {t.parent_id for t in tasks if t.parent_id is not None}),
        children=await _child_counts(session, ids),
        seq_of={r.id: r.seq for rs in runs.values() for r in rs},
    )


def _pull_link(number: int | None, res: RepoResource, base_url: str) -> PullLink | None:
    return PullLink(number=number, html_url=f"{base_url}/{res.full_name}/pull/{number}") if number else None


def _task_read(task: Task, res: RepoResource, facts: _PageFacts, base_url: str) -> TaskRead:
    runs, names, parents = facts.runs.get(task.id, []), facts.names, facts.parents
    parked = facts.pending.get(task.id)
    return TaskRead(
        merge_strategy=task.merge_strategy or None,
        merged_sha=task.merged_sha or None,
        merged_by=names.get(task.merged_by_id) if task.merged_by_id else None,
        merged_at=task.merged_at,
        agent_session_id=task.agent_session_id or None,
        # A pending approval has no decider yet.
        pending_approval=approval_read(parked, facts.seq_of.get(parked.run_id, 0), None) if parked else None,
        number=task.number,
        repository=res.full_name,
        title=task.title,
        goal=task.goal,
        state=task.state,
        runtime=task.runtime,
        command=task.command if task.runtime != "acp" else None,
        agent_command=task.command if task.runtime == "acp" and isinstance(task.command, str) else None,
        agent=names.get(task.agent_id, ""),
        started_by=names.get(task.started_by_id) if task.started_by_id else None,
        base=task.base,
        branch=task.branch,
        base_sha=task.base_sha,
        head_sha=task.head_sha,
        head_is_wip=task.head_is_wip,
        summary=task.summary,
        error=task.error,
        failure_reason=task.failure_reason or None,
        question=task.question,
        queued_message=task.queued_message,
        queue_position=facts.positions.get(task.id),
        html_url=f"{base_url}/{res.full_name}/tasks/{task.number}",
        on_pull_request=_pull_link(task.pull_number, res, base_url),
        pull_request=_pull_link(task.result_pull_number, res, base_url),
        created_at=task.created_at,
        updated_at=task.updated_at,
        runs=[run_read(r) for r in runs],
        no_changes=bool(task.head_sha) and task.head_sha == task.base_sha,
        usage=usage_of(runs),
        egress=egress_of(runs),
        model_key=next((r.model_key for r in reversed(runs) if r.model_key), None),
        parent=ParentRead(number=parents[task.parent_id]) if task.parent_id in parents else None,
        subtasks=facts.children.get(task.id, 0),
        question_options=list(task.question_options or []) if task.question else [],
        trigger=msgspec.convert(task.trigger, Trigger) if task.trigger else None,
        environment_override=(
            msgspec.convert(task.environment_override, EnvironmentOverride) if task.environment_override else None
        ),
        required_labels=list(task.required_labels or []),
        waiting_for_labels=list(task.required_labels or []) if task.state == TaskState.QUEUED else [],
    )


async def skipped_page(session: AsyncSession, task: Task, run_seq: str, cursor: str, limit: int) -> SkippedPage:
    """The paths run `run_seq` (as written in the path) of the task refused, after `cursor` (an
    opaque position)."""
    run = None
    if run_seq.isascii() and run_seq.isdigit() and len(run_seq) < 10:
        stmt = select(Run).where(Run.task_id == task.id, Run.seq == int(run_seq))
        run = (await session.execute(stmt)).scalar_one_or_none()
    if run is None:
        raise NotFound(f"task #{task.number} has no run {run_seq[:12]!r}")
    if cursor and not (cursor.isdigit() and len(cursor) < 10):
        raise InvalidInput("cursor: not a cursor this endpoint gave out", code="validation_failed")
    after = int(cursor) if cursor else -1
    rows = (
        await session.execute(
            select(RunSkipped)
            .where(RunSkipped.run_id == run.id, RunSkipped.idx > after)
            .order_by(RunSkipped.idx)
            .limit(limit + 1)
        )
    ).scalars()
    page = list(rows)
    more = len(page) > limit
    page = page[:limit]
    return SkippedPage(
        items=[SkippedPath(path=r.path, reason=r.reason) for r in page],
        total=run.skipped_count,
        next_cursor=str(page[-1].idx) if more else None,
    )
