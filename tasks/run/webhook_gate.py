"""The policy gate backed by the webhooks dispatcher (docs/webhooks.md): what the composition
root gives the task core when webhooks are wired.

- `user_prompt_submit` is asked before the request's write transaction (`TaskService.precheck*`,
  `PromptCheck`), so a slow consumer never holds the database's write lock; the dispatcher logs
  the call itself, so a denied prompt leaves its delivery-log rows (and the refusal's audit row)
  but nothing else: no task, message, answer or review. Only when the prechecked prompt no longer
  matches at write time (a concurrent start took the predicted task number, a comment arrived)
  is it asked again inside the transaction, with the log rows in that transaction.
- The run-time events (`session_start`, `pre_tool_use`, `post_tool_use`, `stop`) are dispatched
  by the worker outside any transaction; the dispatcher writes their log rows itself.
- A dispatch failure that decides (failure policy `closed`) comes back as `failed=True` with the
  contract's message `hook dispatch failed: <event>: <class> (delivery <id>)`."""

from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.db.engine import Database
from forge.db.events import AccountRef, ParentRef, RunRef, TaskRef
from forge.db.models import Repository
from tasks.core.policy import GateContext, GateDecision, PromptKind, SessionSource
from webhooks.policy import PolicyDispatcher, PolicyOutcome, RepoRef, TaskMeta


class WebhookGate:
    def __init__(self, dispatcher: PolicyDispatcher, db: Database) -> None:
        self.dispatcher = dispatcher
        self.db = db
        self._repo_ids: dict[str, int] = {}  # uuid -> id; a repository's id never changes

    async def _repo(self, ctx: GateContext, session: AsyncSession | None) -> RepoRef:
        repo_id = self._repo_ids.get(ctx.repo_uuid)
        if repo_id is None:
            stmt = select(Repository.id).where(Repository.uuid == ctx.repo_uuid)
            if session is not None:
                repo_id = (await session.execute(stmt)).scalar_one()
            else:
                async with self.db.session() as read:
                    repo_id = (await read.execute(stmt)).scalar_one()
            self._repo_ids[ctx.repo_uuid] = repo_id
        return RepoRef(id=repo_id, uuid=ctx.repo_uuid, full_name=ctx.repository)

    async def _dispatch(
        self, ctx: GateContext, event: str, data: dict[str, Any], session: AsyncSession | None = None
    ) -> GateDecision:
        meta = TaskMeta(
            task=TaskRef(
                id=ctx.task_uuid,
                number=ctx.task_number,
                url=ctx.task_url,
                parent=ParentRef(number=ctx.parent_number) if ctx.parent_number is not None else None,
                trigger=ctx.trigger,
            ),
            run=RunRef(id=ctx.run_uuid, seq=ctx.run_seq) if ctx.run_uuid else None,
            actor=AccountRef(login=ctx.actor_login, type=ctx.actor_type) if ctx.actor_login else None,
            agent=AccountRef(login=ctx.agent_login, type="Bot") if ctx.agent_login else None,
        )
        outcome = await self.dispatcher.dispatch(
            session if session is not None else self.db,
            event,
            repo=await self._repo(ctx, session),
            task_meta=meta,
            data=data,
        )
        return _decision(outcome, str(data.get("tool_use_id") or ""))

    async def session_start(self, ctx: GateContext, *, source: SessionSource, runtime: str, image: str) -> GateDecision:
        return await self._dispatch(ctx, "session_start", {"source": source, "runtime": runtime, "image": image})

    async def user_prompt_submit(
        self, ctx: GateContext, *, prompt: str, kind: PromptKind, session: AsyncSession | None = None
    ) -> GateDecision:
        return await self._dispatch(ctx, "user_prompt_submit", {"prompt": prompt, "kind": kind}, session)

    async def pre_tool_use(
        self, ctx: GateContext, *, tool_use_id: str, tool_name: str, tool_input: Any
    ) -> GateDecision:
        data = {"tool_use_id": tool_use_id, "tool_name": tool_name, "tool_input": tool_input}
        return await self._dispatch(ctx, "pre_tool_use", data)

    async def post_tool_use(
        self,
        ctx: GateContext,
        *,
        tool_use_id: str,
        tool_name: str,
        tool_response: str | None,
        tool_error: str | None,
    ) -> GateDecision:
        data: dict[str, Any] = {"tool_use_id": tool_use_id, "tool_name": tool_name}
        if tool_error is not None:
            data["tool_error"] = tool_error
        else:
            data["tool_response"] = tool_response or ""
        return await self._dispatch(ctx, "post_tool_use", data)

    async def stop(self, ctx: GateContext, *, summary: str, turns: int, changed_files: list[str]) -> GateDecision:
        data = {"summary": summary, "turns": turns, "changed_files": changed_files}
        return await self._dispatch(ctx, "stop", data)

    async def pre_merge(self, ctx: GateContext, *, merge: dict[str, Any]) -> GateDecision:
        # `merge`: base, head, head_sha, strategy, approvals, diffstat (docs/webhooks.md)
        return await self._dispatch(ctx, "pre_merge", merge)


def _decision(outcome: PolicyOutcome, tool_use_id: str = "") -> GateDecision:
    failure = outcome.failure_message
    return GateDecision(
        decision=outcome.decision,
        reason=failure or outcome.reason,
        input_override=outcome.input_override,
        model_context="\n\n".join(c for c in outcome.model_contexts if c.strip()),
        user_message="\n".join(m for m in outcome.user_messages if m.strip()),
        failed=failure is not None,
        held=outcome.held,
        decided_by=outcome.deciding.url if outcome.deciding is not None else "",
        dispatch={
            "event": outcome.event_type,
            "decision": outcome.decision,
            "delivery_id": outcome.delivery_id,
            # The call a tool hook decided: its transcript record sits with the call.
            **({"tool_use_id": tool_use_id} if tool_use_id else {}),
            "endpoints": [
                {
                    "url": r.url,
                    "result": r.result,
                    "decision": r.decision,
                    "status": r.status,
                    "latency_ms": round(r.latency_ms, 1),
                }
                for r in outcome.results
            ],
        }
        if outcome.results
        else None,
    )
