"""Commit statuses: what CI systems report on a commit, in GitHub's and Gitea's shape, so an
existing integration reports here with another base URL.

Every report is a row (a context's history); a commit's combined status reads the latest report of
each context: `failure` when any is `failure` or `error`, `pending` when there is none or any is
`pending`, else `success` (GitHub's rule). Reporting needs write access to the repository
(`repo:write` on a token), reading needs read access. Each report is audited
(`repo.status.create`) and published as `status.created`."""

from datetime import datetime
from typing import Annotated, Literal
from urllib.parse import urlsplit

import msgspec
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Action, require
from forge.core.error_codes import Code
from forge.core.errors import InvalidInput
from forge.db import audit
from forge.db.audit import Actor
from forge.db.events import AccountRef, Event, EventBus, StatusCreated
from forge.db.models import Account, CommitStatus, Repository
from forge.git import RefNotFound, RepoStore, resolve_ref
from forge.repos import branch_rules
from forge.repos.repositories import RepoResource

StatusState = Literal["pending", "success", "failure", "error"]
CombinedState = Literal["pending", "success", "failure"]
MAX_PER_CONTEXT = 1000  # GitHub's limit per commit and context
MAX_URL = 2048


class StatusCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    state: StatusState
    target_url: Annotated[str, msgspec.Meta(max_length=MAX_URL)] | None = None
    description: Annotated[str, msgspec.Meta(max_length=1024)] | None = None
    context: Annotated[str, msgspec.Meta(min_length=1, max_length=255)] = "default"


class StatusRead(msgspec.Struct, kw_only=True):
    id: int
    url: str
    state: StatusState
    description: str
    target_url: str
    context: str
    creator: AccountRef | None  # {login, type}; null when the account is gone
    created_at: datetime
    updated_at: datetime


class CombinedStatus(msgspec.Struct, kw_only=True):
    state: CombinedState
    sha: str
    total_count: int
    statuses: list[StatusRead]  # the latest of each context, by context
    commit_url: str
    url: str


def combine(states: list[str]) -> CombinedState:
    """GitHub's combined state of the latest status of each context."""
    if any(s in ("failure", "error") for s in states):
        return "failure"
    if not states or "pending" in states:
        return "pending"
    return "success"


def _target_url(raw: str | None) -> str:
    url = (raw or "").strip()
    if not url:
        return ""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c in url for c in "\x00\r\n "):
        raise InvalidInput(
            f"target_url must be an http(s) URL, got {url[:80]!r}: point it at the build's page",
            code=Code.INVALID_TARGET_URL,
        )
    return url


async def resolve_sha(store: RepoStore, res: RepoResource, spec: str) -> str:
    """The full id of the commit `spec` names (a sha, abbreviated or not, a branch or a tag);
    `ref_not_found` (404) when it names none."""
    return (await store.read(res.key, resolve_ref, spec)).sha


async def status_sha(store: RepoStore, res: RepoResource, spec: str) -> str:
    """`resolve_sha` for a report: a commit the repository does not have is the reporter's
    mistake (`unknown_commit`, 422), as GitHub answers."""
    try:
        return await resolve_sha(store, res, spec)
    except RefNotFound:
        raise InvalidInput(
            f"{res.full_name} has no commit {spec[:80]!r}: push it before reporting its status",
            code=Code.UNKNOWN_COMMIT,
        ) from None


def _creator(account: Account | None) -> AccountRef | None:
    return AccountRef(login=account.login, type="Bot" if account.is_bot else "User") if account else None


def _read(row: CommitStatus, creator: AccountRef | None, api: str) -> StatusRead:
    return StatusRead(
        id=row.id,
        url=f"{api}/statuses/{row.sha}",
        state=row.state,  # type: ignore[arg-type]
        description=row.description,
        target_url=row.target_url,
        context=row.context,
        creator=creator,
        created_at=row.created_at,
        updated_at=row.created_at,
    )


async def _rows(session: AsyncSession, repo_id: int, sha: str) -> list[tuple[CommitStatus, Account | None]]:
    """Every status of the commit, newest first."""
    stmt = (
        select(CommitStatus, Account)
        .outerjoin(Account, Account.id == CommitStatus.creator_id)
        .where(CommitStatus.repo_id == repo_id, CommitStatus.sha == sha)
        .order_by(CommitStatus.id.desc())
    )
    return [(row, account) for row, account in (await session.execute(stmt)).all()]


def _latest(rows: list[tuple[CommitStatus, Account | None]]) -> dict[str, tuple[CommitStatus, Account | None]]:
    """The newest status of each context, by context."""
    latest: dict[str, tuple[CommitStatus, Account | None]] = {}
    for row, account in rows:
        latest.setdefault(row.context, (row, account))
    return dict(sorted(latest.items()))


async def head_checks(
    session: AsyncSession, repo: Repository, branch: str, sha: str
) -> tuple[CombinedState | None, list[str]]:
    """A head about to merge into `branch`: its combined state (None when nothing reported) and, in
    words, each check the branch's rules require whose latest status on it is not `success`."""
    latest = (await _latest_states(session, repo.id, [sha])).get(sha, {})
    unmet = [
        f"required check {context} is {latest[context]}"
        if context in latest
        else f"required check {context} has not reported"
        for context in await branch_rules.required_checks(session, repo, branch)
        if latest.get(context) != "success"
    ]
    return (combine(list(latest.values())) if latest else None), unmet


async def record(
    session: AsyncSession,
    repo_id: int,
    sha: str,
    *,
    state: StatusState,
    context: str,
    description: str = "",
    target_url: str = "",
    creator_id: int | None = None,
) -> tuple[CommitStatus, CombinedState]:
    """Add a status row (the caller checked who may, and resolved `sha`); returns it and the
    commit's combined state with it."""
    count = (
        await session.execute(
            select(func.count(CommitStatus.id)).where(
                CommitStatus.repo_id == repo_id, CommitStatus.sha == sha, CommitStatus.context == context
            )
        )
    ).scalar_one()
    if count >= MAX_PER_CONTEXT:
        raise InvalidInput(
            f"commit {sha[:12]} already has {MAX_PER_CONTEXT} statuses of {context!r}: report on a new commit",
            code=Code.TOO_MANY_STATUSES,
        )
    row = CommitStatus(
        repo_id=repo_id,
        sha=sha,
        state=state,
        context=context,
        description=description[:1024],
        target_url=target_url,
        creator_id=creator_id,
    )
    session.add(row)
    await session.flush()
    return row, combine(list((await _latest_states(session, repo_id, [sha]))[sha].values()))


async def create(
    session: AsyncSession,
    actor: Actor,
    bus: EventBus,
    res: RepoResource,
    sha: str,
    data: StatusCreate,
    api: str,
) -> StatusRead:
    """A status reported over the API on the commit `sha` (already resolved to a full id)."""
    require(actor.principal, Action.REPO_WRITE, res)
    target_url = _target_url(data.target_url)
    context = data.context.strip()
    if not context or not context.isprintable():
        raise InvalidInput("a context is 1-255 printable characters, e.g. ci/build", code=Code.VALIDATION_FAILED)
    row, combined = await record(
        session,
        res.repo.id,
        sha,
        state=data.state,
        context=context,
        description=(data.description or "").strip(),
        target_url=target_url,
        creator_id=actor.principal.account_id,
    )
    audit.record(session, actor, "repo.status.create", res.full_name, sha=sha, state=data.state, context=context)
    await bus.publish(session, _event(actor, res, row, combined))
    return _read(row, AccountRef.of(actor.principal), api)


def created_payload(row: CommitStatus, combined: CombinedState) -> StatusCreated:
    """The `status.created` notification's data for a recorded status."""
    return StatusCreated(
        id=row.id,
        sha=row.sha,
        state=row.state,  # type: ignore[arg-type]
        context=row.context,
        description=row.description,
        target_url=row.target_url,
        combined=combined,
    )


def _event(actor: Actor, res: RepoResource, row: CommitStatus, combined: CombinedState) -> Event:
    return Event(
        repo_id=res.repo.id,
        repo_uuid=res.repo.uuid,
        repository=res.full_name,
        actor=AccountRef.of(actor.principal),
        data=created_payload(row, combined),
    )


async def list_statuses(session: AsyncSession, res: RepoResource, sha: str, api: str) -> list[StatusRead]:
    """Every status of the commit, newest first (a context's whole history)."""
    return [_read(row, _creator(account), api) for row, account in await _rows(session, res.repo.id, sha)]


async def _latest_states(session: AsyncSession, repo_id: int, shas: list[str]) -> dict[str, dict[str, str]]:
    """sha -> context -> the state of its newest status, for the commits that have any."""
    wanted = sorted(set(shas))
    latest: dict[str, dict[str, str]] = {}
    for start in range(0, len(wanted), 500):  # bounded IN lists: SQLite caps a statement's parameters
        rows = (
            await session.execute(
                select(CommitStatus.sha, CommitStatus.context, CommitStatus.state)
                .where(CommitStatus.repo_id == repo_id, CommitStatus.sha.in_(wanted[start : start + 500]))
                .order_by(CommitStatus.id.desc())
            )
        ).all()
        for sha, context, state in rows:
            latest.setdefault(sha, {}).setdefault(context, state)
    return latest


async def combined_states(session: AsyncSession, repo_id: int, shas: list[str]) -> dict[str, CombinedState]:
    """The combined state of each commit that has statuses (commits without any are left out)."""
    return {
        sha: combine(list(states.values())) for sha, states in (await _latest_states(session, repo_id, shas)).items()
    }


async def combined_status(session: AsyncSession, res: RepoResource, sha: str, api: str) -> CombinedStatus:
    rows = _latest(await _rows(session, res.repo.id, sha)).values()
    latest = [_read(row, _creator(account), api) for row, account in rows]
    return CombinedStatus(
        state=combine([s.state for s in latest]),
        sha=sha,
        total_count=len(latest),
        statuses=latest,
        commit_url=f"{api}/commits/{sha}",
        url=f"{api}/commits/{sha}/status",
    )
