"""The policy dispatcher: synchronous calls to policy endpoints before a guarded action.

One deadline per dispatch (default 5 s, at most 10 s) covers everything: waiting for a
concurrency slot, both attempts and the back-off between them. Only a connection error is
retried (once, after 250 ms, same body, new `jti`); timeouts, non-2xx answers and protocol errors
are not. Endpoints are called one after the other in a stable order (instance endpoints, then
the repository's, each by id); an `allow` with an `input_override` changes the input the next
endpoint sees (so redactions compose); the first `deny` ends the dispatch (a deny wins anyway).
Any deny wins, then any ask, then allow. A failed endpoint counts as its `failure_policy` says:
`closed` as a deny, `open` as no opinion (logged), `hold` as an ask.

A dispatch: check the event (the gate), read the endpoints (the per-repository cache of
`webhooks.policy.endpoint_cache`), call each in turn (`webhooks.policy.endpoint_call`: sign, send, strict decode),
combine the answers into the decision, and hand the log rows to the caller's transaction or the
background log writer (`webhooks.policy.log_writer`).
"""

import asyncio
import time
import uuid
from collections.abc import Mapping
from typing import Any

import msgspec
import structlog
from sqlalchemy import insert, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.db.engine import Database
from webhooks.core import envelope, metrics
from webhooks.core.config import WebhooksConfig
from webhooks.core.envelope import RepoRef, TaskMeta
from webhooks.core.models import DELIVERIES, WebhookDelivery, WebhookEndpoint
from webhooks.core.outbound import Outbound
from webhooks.policy import endpoint_cache
from webhooks.policy.answers import Decision, PolicyAnswer
from webhooks.policy.endpoint_call import FAILURES, EndpointCaller, EndpointResult, Target
from webhooks.policy.log_writer import DeliveryLogWriter, LogRow
from webhooks.sdk.protocol import MAX_BUDGET, POLICY_EVENTS

log = structlog.get_logger("forgehand.webhooks")


class PolicyOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """The combined answer of every policy endpoint on one event."""

    event_type: str
    delivery_id: str  # the wid of this dispatch (same for every endpoint and attempt)
    decision: Decision
    reason: str  # of the deciding deny/ask ("" for allow)
    # The input to use instead of the original, after every override in order (None: unchanged).
    # user_prompt_submit: {"prompt": str}; pre_tool_use: the new tool_input object.
    input_override: dict[str, Any] | None
    model_contexts: list[str]  # for the model only, in endpoint order
    user_messages: list[str]  # for people only, in endpoint order
    results: list[EndpointResult]
    held: bool  # the ask comes from failure_policy=hold, not from a consumer
    deciding: EndpointResult | None  # the first deny, else the first ask (None for allow)

    @property
    def failure(self) -> EndpointResult | None:
        """The failed endpoint whose failure policy decided the outcome, if that is what happened."""
        d = self.deciding
        return d if d is not None and d.failed else None

    @property
    def failure_message(self) -> str | None:
        """`hook dispatch failed: <event>: <class> (delivery <id>)`, when a failure decided."""
        f = self.failure
        if f is None:
            return None
        return f"hook dispatch failed: {self.event_type}: {f.result} (delivery {self.delivery_id})"

    @property
    def failures(self) -> list[EndpointResult]:
        return [r for r in self.results if r.failed]


def _clamp_budget(deadline: float) -> float:
    return min(max(float(deadline), 0.001), MAX_BUDGET)


def _apply(event_type: str, data: dict[str, Any], override: Any) -> dict[str, Any]:
    if event_type == "user_prompt_submit":
        return {**data, "prompt": override["prompt"]}
    if event_type == "pre_tool_use":
        return {**data, "tool_input": override}
    return data


class _Answers:
    """The answers of one dispatch, combined in endpoint order: an allow's `input_override`
    changes what the next endpoint sees; deny wins, then ask, then allow."""

    def __init__(self, event_type: str, data: dict[str, Any]) -> None:
        self.event_type = event_type
        self.current = data  # the data the next endpoint sees
        self.override: dict[str, Any] | None = None
        self.results: list[EndpointResult] = []
        self.contexts: list[str] = []
        self.messages: list[str] = []

    def add(self, result: EndpointResult, answer: PolicyAnswer | None) -> None:
        self.results.append(result)
        if answer is None:
            return
        if answer.model_context:
            self.contexts.append(answer.model_context)
        if answer.user_message:
            self.messages.append(answer.user_message)
        if answer.decision == "allow" and answer.has_override:
            self.current = _apply(self.event_type, self.current, answer.input_override)
            self.override = (
                {"prompt": self.current["prompt"]}
                if self.event_type == "user_prompt_submit"
                else self.current["tool_input"]
            )

    def outcome(self, wid: str) -> PolicyOutcome:
        results = self.results
        deciding = next((r for r in results if r.effective == "deny"), None) or next(
            (r for r in results if r.effective == "ask"), None
        )
        decision: Decision = deciding.effective if deciding is not None and deciding.effective else "allow"
        return PolicyOutcome(
            event_type=self.event_type,
            delivery_id=wid,
            decision=decision,
            reason=deciding.reason if deciding is not None else "",
            input_override=self.override,
            model_contexts=self.contexts,
            user_messages=self.messages,
            results=results,
            held=deciding is not None and deciding.failed and decision == "ask",
            deciding=deciding,
        )


class PolicyDispatcher:
    """Calls policy endpoints and combines their answers (see the module docstring)."""

    def __init__(self, db: Database, cfg: WebhooksConfig, outbound: Outbound) -> None:
        self.db = db
        self.cfg = cfg
        self.outbound = outbound
        self.caller = EndpointCaller(cfg, outbound)
        self._cache: endpoint_cache.GenerationCache[int, list[tuple[frozenset[str], Target]]] = (
            endpoint_cache.GenerationCache()
        )
        self._refreshing: dict[int, asyncio.Task[None]] = {}
        self.log_writer = DeliveryLogWriter(db)

    async def _targets(self, source: AsyncSession | Database | None, repo_id: int, event_type: str) -> list[Target]:
        """The active policy endpoints of this repository (instance ones first) taking this event.
        Cached per repository until an endpoint changes in this process, for at most
        `endpoint_cache.TTL` seconds (changes made by another process); reloaded in the background
        after half of that while in use, so that a steady stream of dispatches never waits."""
        found = self._cache.lookup(repo_id)
        if found is not None:
            endpoints, stale_soon = found
            if stale_soon and repo_id not in self._refreshing:
                self._refreshing[repo_id] = asyncio.get_running_loop().create_task(self._refresh(repo_id))
        else:
            gen, t0 = endpoint_cache.generation(), time.monotonic()
            if isinstance(source, AsyncSession):
                endpoints = await self._load(source, repo_id)
            else:
                async with (source or self.db).session() as session:
                    endpoints = await self._load(session, repo_id)
            self._cache.put(repo_id, gen, endpoints, t0)
        return [t for events, t in endpoints if event_type in events]

    async def _refresh(self, repo_id: int) -> None:
        try:
            gen, t0 = endpoint_cache.generation(), time.monotonic()
            async with self.db.session() as session:
                endpoints = await self._load(session, repo_id)
            self._cache.put(repo_id, gen, endpoints, t0)
        except Exception:
            log.warning("could not reload the policy endpoints ahead", repo=repo_id, exc_info=True)
        finally:
            self._refreshing.pop(repo_id, None)

    async def _load(self, session: AsyncSession, repo_id: int) -> list[tuple[frozenset[str], Target]]:
        stmt = (
            select(WebhookEndpoint)
            .where(
                WebhookEndpoint.kind == "policy",
                WebhookEndpoint.active.is_(True),
                or_(WebhookEndpoint.repo_id.is_(None), WebhookEndpoint.repo_id == repo_id),
            )
            .order_by(WebhookEndpoint.repo_id.is_not(None), WebhookEndpoint.id)
        )
        return [
            (frozenset(e.events or ()), Target(e.id, e.url, e.failure_policy, self.cfg.signing_key(e)))
            for e in (await session.execute(stmt)).scalars()
        ]

    async def dispatch(
        self,
        source: AsyncSession | Database | None,
        event_type: str,
        *,
        repo: RepoRef,
        task_meta: TaskMeta,
        data: Mapping[str, Any],
        deadline: float | None = None,
    ) -> PolicyOutcome:
        if event_type not in POLICY_EVENTS:
            raise ValueError(f"{event_type!r} is not a policy event")
        budget = _clamp_budget(self.cfg.policy_deadline if deadline is None else deadline)
        started = time.monotonic()
        end = started + budget
        wid = str(uuid.uuid4())
        targets = await self._targets(source, repo.id, event_type)
        answers = _Answers(event_type, dict(data))
        if not targets:
            return answers.outcome(wid)
        log_rows: list[LogRow] = []
        at = self.cfg.clock()
        for target in targets:
            body, subject = envelope.for_policy(
                event_type, wid, self.cfg.instance_id, repo, task_meta, answers.current, at
            )
            result, answer = await self.caller.call(target, event_type, wid, subject, body, budget, end, log_rows)
            answers.add(result, answer)
            metrics.DISPATCHES.labels(event=event_type, result=result.result).inc()
            if result.effective == "deny":
                break
        outcome = answers.outcome(wid)
        metrics.DISPATCH_SECONDS.labels(event=event_type).observe(time.monotonic() - started)
        await self._write_log(source, log_rows, failed=any(r["result"] in FAILURES for r in log_rows))
        for r in outcome.failures:
            log.warning(
                "policy hook failed",
                hook=r.endpoint_id,
                hook_event=event_type,
                result=r.result,
                failure_policy=r.failure_policy,
                delivery=wid,
                detail=r.detail,
            )
        return outcome

    async def _write_log(self, source: AsyncSession | Database | None, rows: list[LogRow], *, failed: bool) -> None:
        """Where the log rows of a dispatch go:
        - an AsyncSession from the caller: into its transaction (they commit or roll back with the
          guarded action; on SQLite no second writer is needed while the caller holds the lock);
        - a dispatch in which an endpoint failed: written before returning (the failure is what an
          operator comes looking for, and such a dispatch took its time already);
        - otherwise: handed to the background writer (`DeliveryLogWriter`), off the critical path.
          They appear a few milliseconds later; a crash in that window loses them, never the decision.
        """
        if not rows:
            return
        if isinstance(source, AsyncSession):
            source.add_all([WebhookDelivery(**row) for row in rows])
            return
        if not failed and (source is None or source is self.db):
            self.log_writer.submit(rows)
            return
        try:
            async with (source or self.db).session(write=True) as session:
                await session.execute(insert(DELIVERIES), rows)
        except Exception:
            # The decision stands; losing its log row must not turn it into an error.
            log.exception("could not record policy deliveries", count=len(rows))

    async def flush_log(self) -> None:
        """Wait until the log rows of every dispatch returned so far are written."""
        await self.log_writer.flush()

    async def aclose(self) -> None:
        """Write what is pending in the delivery log (called by `WebhooksRuntime.stop`)."""
        for task in list(self._refreshing.values()):
            task.cancel()
        self._refreshing.clear()
        await self.log_writer.aclose()
