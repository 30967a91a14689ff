"""Pushes, the database side: what the push rules need for a pusher (`push_context`) and the record
of an accepted push (`record_push`: push record, audit row and `repo.pushed`, one transaction)."""

from sqlalchemy.ext.asyncio import AsyncSession

from forge import audit
from forge.access import Principal, Role, effective_role
from forge.audit import Actor
from forge.events import AccountRef, Event, EventBus
from forge.git import ProtectionRule, PushContext, RefUpdate
from forge.models import PushRecord
from forge.repositories import RepoResource, branch_rules


async def push_context(session: AsyncSession, res: RepoResource, principal: Principal) -> PushContext:
    """What the push rules need for this pusher on this repository."""
    rules = [
        ProtectionRule(pattern=r.pattern, allow_force_push=r.allow_force_push, allow_deletion=r.allow_deletion)
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
    )


async def record_push(
    session: AsyncSession, bus: EventBus, actor: Actor, res: RepoResource, updates: list[RefUpdate]
) -> None:
    """Record an accepted push (refs before and after) and publish `repo.pushed`."""
    if not updates:
        return
    refs = [{"ref": u.ref, "before": u.old, "after": u.new} for u in updates]
    session.add(
        PushRecord(
            repo_id=res.repo.id, pusher_id=actor.principal.account_id, token_id=actor.principal.token_id, refs=refs
        )
    )
    audit.record(session, actor, "repo.push", res.full_name, refs=refs)
    await bus.publish(
        session,
        Event(
            type="repo.pushed",
            repo_id=res.repo.id,
            repo_uuid=res.repo.uuid,
            repository=res.full_name,
            actor=AccountRef(login=actor.principal.login, type="Bot" if actor.principal.type == "Bot" else "User")
            if actor.principal.account_id is not None
            else None,
            data={"refs": refs},
        ),
    )
