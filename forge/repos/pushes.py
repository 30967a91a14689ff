"""Pushes, the database side: what the push rules need for a pusher (`push_context`), the record
of an accepted push (`record_push`: push record, audit row and `repo.pushed`, one transaction),
and `PushRecorder`, which makes sure no ref moves without that record.

A push is written to the intent journal (`forge.git.journal`) before git runs; git runs in a task
of its own, not the request's, so a client that hangs up (after `unpack ok`, say) changes nothing:
git finishes, the push is recorded, the entry is crossed out. After a crash, `reconcile` (at start
and periodically) records what the refs show happened, exactly once (the record carries the
entry's id, unique), and sweeps the quarantine directories interrupted pushes left behind."""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

import msgspec
import structlog
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Principal, Role, effective_role
from forge.db import audit
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.events import AccountRef, Event, EventBus, PushedRef, RepoPushed
from forge.db.models import PushRecord, Repository
from forge.git import ProtectionRule, PushContext, PushSession, RefUpdate, RepoStore, ref_locks
from forge.git.history import commits_between
from forge.git.journal import JournalEntry, PushJournal, sweep_quarantines
from forge.git.service_process import GitServiceProcess
from forge.repos.issue_refs import IssueRefs
from forge.repos.pull_lists import open_pull_numbers
from forge.repos.pulls import Pulls
from forge.repos.repositories import RepoResource, branch_rules

log = structlog.get_logger(__name__)


async def push_context(
    session: AsyncSession, res: RepoResource, principal: Principal, base_url: str = ""
) -> PushContext:
    """What the push rules need for this pusher on this repository, and what the answer links
    to (with `base_url`: the pages that open a pull request, or the open ones)."""
    rules = [
        ProtectionRule(
            pattern=r.pattern,
            allow_force_push=r.allow_force_push,
            allow_deletion=r.allow_deletion,
            require_pull_request=r.require_pull_request,
        )
        for r in await branch_rules(session, res.repo)
    ]
    role = effective_role(principal, res)
    return PushContext(
        is_admin=role is Role.ADMIN,
        is_internal=principal.via == "internal",
        archived=res.repo.archived,
        default_branch=res.repo.default_branch,
        protect_default_branch=res.repo.protect_default_branch,
        rules=rules,
        pusher=principal.login or None,
        web_url=f"{base_url}/{res.full_name}" if base_url else None,
        open_pulls=await open_pull_numbers(session, res) if base_url else {},
    )


async def record_push(
    session: AsyncSession,
    bus: EventBus,
    actor: Actor,
    res: RepoResource,
    updates: list[RefUpdate],
    *,
    journal_id: str | None = None,
    pulls: Pulls | None = None,
) -> None:
    """Record an accepted push (refs before and after) and publish `repo.pushed`; with `pulls`,
    the open pull requests whose head it moved follow (`Pulls.after_push`)."""
    if not updates:
        return
    refs = [{"ref": u.ref, "before": u.old, "after": u.new} for u in updates]
    session.add(
        PushRecord(
            repo_id=res.repo.id,
            pusher_id=actor.principal.account_id,
            token_id=actor.principal.token_id,
            refs=refs,
            journal_id=journal_id,
        )
    )
    audit.record(session, actor, "repo.push", res.full_name, refs=refs)
    await bus.publish(
        session,
        Event(
            repo_id=res.repo.id,
            repo_uuid=res.repo.uuid,
            repository=res.full_name,
            actor=AccountRef.of(actor.principal),
            data=RepoPushed(refs=[PushedRef(ref=u.ref, before=u.old, after=u.new) for u in updates]),
        ),
    )
    if pulls is not None:
        await pulls.after_push(actor, res, updates)
        await _commit_references(pulls, actor, res, updates)


async def _commit_references(pulls: Pulls, actor: Actor, res: RepoResource, updates: list[RefUpdate]) -> None:
    """The issues a pushed commit names get `referenced` (a new branch: its commits the default
    branch lacks; at most 250 commits per branch)."""
    refs = IssueRefs(pulls.session, pulls.bus, pulls.base_url)
    for u in updates:
        if not u.ref.startswith("refs/heads/") or u.is_delete:
            continue
        base = u.old if u.old.strip("0") else res.repo.default_branch
        commits = await pulls.store.read(res.key, commits_between, base, u.new)
        await refs.commit_references(actor, res, commits)


class _Meta(msgspec.Struct, frozen=True, kw_only=True):
    """What the journal keeps for the host: enough to record the push without the request."""

    repo_id: int
    actor: Actor


class _Relay:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()  # receive-pack says little: unbounded
        self.gone = False


class PushRecorder:
    """Journal, run and record pushes independently of the request that carried them."""

    def __init__(
        self,
        db: Database,
        bus: EventBus,
        journal: PushJournal,
        repos_root: Path,
        *,
        journal_grace_seconds: float = 3600.0,
        quarantine_grace_seconds: float = 3600.0,
        interval_seconds: float = 300.0,
        store: RepoStore | None = None,
        base_url: str = "",
    ) -> None:
        self.db = db
        self.store = store or RepoStore(repos_root)
        self.base_url = base_url
        self.bus = bus
        self.journal = journal
        self.repos_root = repos_root
        self.journal_grace = journal_grace_seconds
        self.quarantine_grace = quarantine_grace_seconds
        self.interval = interval_seconds
        self._live: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.Task[None] | None = None

    async def begin(self, push: PushSession, res: RepoResource, actor: Actor) -> JournalEntry:
        """Journal the push (durably) before git runs; its post-receive log goes beside the entry."""
        meta = msgspec.json.encode(_Meta(repo_id=res.repo.id, actor=actor))
        entry = await asyncio.to_thread(self.journal.begin, push.repo_path, push.updates, meta)
        self._live.add(entry.id)
        push.log_path = self.journal.accepted_path(entry.id)
        return entry

    def abandon(self, entry: JournalEntry, push: PushSession) -> None:
        """The request failed before git's answer was streamed: close git, then settle the entry."""

        async def close_and_settle() -> None:
            try:
                await push.__aexit__(None, None, None)
            finally:
                await self._settle(entry)

        self._spawn(close_and_settle())

    def stream(self, entry: JournalEntry, push: PushSession, proc: GitServiceProcess) -> AsyncIterator[bytes]:
        """git's answer for the client. git itself runs in a task of ours: if the client goes, its
        output is dropped, git finishes, and the push is recorded all the same."""
        relay = _Relay()
        self._spawn(self._drive(entry, push, proc, relay))
        return self._relay(relay)

    @staticmethod
    async def _relay(relay: _Relay) -> AsyncIterator[bytes]:
        try:
            while (chunk := await relay.queue.get()) is not None:
                yield chunk
        finally:
            relay.gone = True

    async def _drive(self, entry: JournalEntry, push: PushSession, proc: GitServiceProcess, relay: _Relay) -> None:
        try:
            async with push:
                async for chunk in proc.output():
                    if not relay.gone:
                        relay.queue.put_nowait(chunk)
        finally:
            # Recorded before the answer ends: once `git push` returns, the API, the pages and the
            # pull requests of a moved head already show it (read-your-writes for people and CI).
            try:
                await self._settle(entry)
            finally:
                relay.queue.put_nowait(None)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle(self, entry: JournalEntry) -> None:
        """Record what git did for `entry` and cross it out; on failure it stays for `reconcile`."""
        try:
            applied = await asyncio.to_thread(self.journal.outcome, entry)
            if applied:
                await self._record(entry, applied)
            await asyncio.to_thread(self.journal.finish, entry.id)
        except Exception:
            log.exception("push not recorded yet: left in the journal", journal_id=entry.id)
        finally:
            self._live.discard(entry.id)

    async def _record(self, entry: JournalEntry, applied: list[RefUpdate]) -> None:
        meta = msgspec.json.decode(entry.meta, type=_Meta)
        try:
            async with self.db.session(write=True) as session:
                done = await session.execute(select(PushRecord.id).where(PushRecord.journal_id == entry.id))
                if done.first() is not None:
                    return
                repo = await session.get(Repository, meta.repo_id)
                if repo is None:
                    return  # the repository is gone, and its pushes with it
                await session.refresh(repo, ["owner"])
                pulls = Pulls(session, self.store, self.bus, self.base_url)
                await record_push(
                    session, self.bus, meta.actor, RepoResource(repo=repo), applied, journal_id=entry.id, pulls=pulls
                )
        except IntegrityError:
            log.info("push already recorded", journal_id=entry.id)  # by another replica, just now

    async def reconcile(self) -> int:
        """Settle the journal entries no live push owns; sweep old quarantines. Returns entries settled."""
        settled = 0
        for entry in await asyncio.to_thread(self.journal.entries):
            if entry.id in self._live or not self.journal.is_stale(entry, grace_seconds=self.journal_grace):
                continue
            self._live.add(entry.id)
            await self._settle(entry)
            settled += 1
        removed = await asyncio.to_thread(sweep_quarantines, self.repos_root, older_than_seconds=self.quarantine_grace)
        # A process killed while it held a ref's lock (a push's receive-pack, a merge) left it: the
        # branch takes no update until it goes.
        unlocked = await asyncio.to_thread(ref_locks.sweep, self.repos_root)
        if settled or removed or unlocked:
            log.info(
                "push journal reconciled",
                settled=settled,
                quarantines_removed=len(removed),
                stale_ref_locks_removed=len(unlocked),
            )
        return settled

    async def start(self) -> None:
        await self.reconcile()
        self._loop = asyncio.ensure_future(self._periodic())

    async def _periodic(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.reconcile()
            except Exception:
                log.exception("push journal reconciliation failed")

    async def stop(self, *, wait_seconds: float = 60.0) -> None:
        """Stop reconciling; give the pushes in flight time to finish and be recorded."""
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=wait_seconds)
