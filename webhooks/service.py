"""Endpoint management: create, change, delete, rotate, ping, read and redeliver the log.

Every mutating call writes its audit row in the caller's transaction. `repo` is the repository
an endpoint belongs to, or None for instance endpoints; callers authorize before calling."""

import uuid
from collections.abc import Sequence

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.errors import Conflict, InvalidInput, NotFound
from forge.core.urlguard import validate_url
from forge.db import allowlists, audit
from forge.db.audit import Actor
from forge.db.events import Event, Ping
from forge.db.models import Repository
from webhooks.core import envelope
from webhooks.core.config import WebhooksConfig, seal
from webhooks.core.models import WebhookDelivery, WebhookEndpoint, WebhookOutbox
from webhooks.core.schemas import DeliveryDetail, DeliveryRead, HookCreate, HookRead, HookUpdate, SecretInfo
from webhooks.core.signing import new_secret
from webhooks.delivery.outbox import enqueue
from webhooks.sdk.protocol import NOTIFY_EVENTS, POLICY_EVENTS, StrictJSONError, loads_strict, subject_for


def _target(endpoint: WebhookEndpoint, repo: Repository | None) -> str:
    return f"{repo.owner.login}/{repo.name}:hook:{endpoint.id}" if repo else f"instance:hook:{endpoint.id}"


def _check_events(kind: str, events: Sequence[str]) -> list[str]:
    allowed = POLICY_EVENTS if kind == "policy" else NOTIFY_EVENTS
    unknown = [e for e in events if e not in allowed]
    if unknown:
        raise InvalidInput(
            f"unknown {kind} event(s) {', '.join(map(repr, unknown))} (valid: {', '.join(allowed)})",
            code="invalid_hook_events",
        )
    return sorted(set(events), key=allowed.index)


def _check_failure_policy(kind: str, policy: str) -> str:
    if kind == "notify" and policy != "closed":
        raise InvalidInput("failure_policy applies to policy endpoints only", code="invalid_failure_policy")
    return policy


def to_read(endpoint: WebhookEndpoint, repo: Repository | None) -> HookRead:
    secrets = [SecretInfo(kid=endpoint.secret_kid, role="current", created_at=endpoint.secret_created_at)]
    if endpoint.second_kid and endpoint.second_role in {"next", "previous"} and endpoint.second_created_at:
        secrets.append(
            SecretInfo(
                kid=endpoint.second_kid,
                role="next" if endpoint.second_role == "next" else "previous",
                created_at=endpoint.second_created_at,
            )
        )
    return HookRead(
        id=endpoint.id,
        scope="repository" if endpoint.repo_id is not None else "instance",
        repository=f"{repo.owner.login}/{repo.name}" if repo else None,
        url=endpoint.url,
        kind="policy" if endpoint.kind == "policy" else "notify",
        events=list(endpoint.events),
        failure_policy=endpoint.failure_policy,  # type: ignore[arg-type]
        active=endpoint.active,
        disabled_reason=endpoint.disabled_reason,
        disabled_at=endpoint.disabled_at,
        failing_since=endpoint.failing_since,
        last_success_at=endpoint.last_success_at,
        secrets=secrets,
        created_at=endpoint.created_at,
        updated_at=endpoint.updated_at,
    )


async def list_endpoints(session: AsyncSession, repo: Repository | None) -> list[WebhookEndpoint]:
    stmt = select(WebhookEndpoint).order_by(WebhookEndpoint.id)
    stmt = stmt.where(WebhookEndpoint.repo_id == repo.id if repo is not None else WebhookEndpoint.repo_id.is_(None))
    return list((await session.execute(stmt)).scalars())


async def get_endpoint(session: AsyncSession, repo: Repository | None, hook_id: int) -> WebhookEndpoint:
    endpoint = await session.get(WebhookEndpoint, hook_id)
    if endpoint is None or endpoint.repo_id != (repo.id if repo is not None else None):
        raise NotFound("webhook endpoint not found", code="hook_not_found")
    return endpoint


async def create_endpoint(
    session: AsyncSession, actor: Actor, cfg: WebhooksConfig, repo: Repository | None, data: HookCreate
) -> tuple[WebhookEndpoint, str]:
    url = validate_url(data.url, await allowlists.with_entries(session, "webhooks", cfg.allow))
    events = _check_events(data.kind, data.events)
    failure_policy = _check_failure_policy(data.kind, data.failure_policy)
    key, shown = new_secret()
    now = cfg.clock()
    endpoint = WebhookEndpoint(
        repo_id=repo.id if repo is not None else None,
        url=url,
        kind=data.kind,
        events=events,
        failure_policy=failure_policy,
        active=data.active,
        secret_kid=key.kid,
        secret_enc=seal(cfg.box, key.key),
        secret_created_at=now,
        created_by_id=actor.principal.account_id,
        created_at=now,
        updated_at=now,
    )
    session.add(endpoint)
    await session.flush()
    audit.record(
        session, actor, "webhook.create", _target(endpoint, repo), url=url, kind=data.kind, events=events, kid=key.kid
    )
    return endpoint, shown


async def update_endpoint(
    session: AsyncSession,
    actor: Actor,
    cfg: WebhooksConfig,
    repo: Repository | None,
    endpoint: WebhookEndpoint,
    data: HookUpdate,
) -> WebhookEndpoint:
    changed: dict[str, object] = {}
    if data.url is not None and data.url != endpoint.url:
        endpoint.url = validate_url(data.url, await allowlists.with_entries(session, "webhooks", cfg.allow))
        changed["url"] = endpoint.url
    if data.events is not None:
        events = _check_events(endpoint.kind, data.events)
        if events != list(endpoint.events):
            endpoint.events = events
            changed["events"] = events
    if data.failure_policy is not None and data.failure_policy != endpoint.failure_policy:
        endpoint.failure_policy = _check_failure_policy(endpoint.kind, data.failure_policy)
        changed["failure_policy"] = endpoint.failure_policy
    if data.active is not None and (data.active != endpoint.active or (data.active and endpoint.disabled_reason)):
        endpoint.active = data.active
        if data.active:
            endpoint.disabled_reason = None
            endpoint.disabled_at = None
            endpoint.failing_since = None
        changed["active"] = data.active
    if changed:
        endpoint.updated_at = cfg.clock()
        audit.record(session, actor, "webhook.update", _target(endpoint, repo), **changed)
    return endpoint


async def delete_endpoint(
    session: AsyncSession, actor: Actor, repo: Repository | None, endpoint: WebhookEndpoint
) -> None:
    target = _target(endpoint, repo)
    url = endpoint.url
    await session.delete(endpoint)
    await session.flush()
    audit.record(session, actor, "webhook.delete", target, url=url)


async def rotate_generate(
    session: AsyncSession, actor: Actor, cfg: WebhooksConfig, repo: Repository | None, endpoint: WebhookEndpoint
) -> tuple[WebhookEndpoint, str, str]:
    """Stage a `next` secret (signing continues with `current`); answers it, once."""
    if endpoint.second_kid is not None:
        what = "a next secret is already staged" if endpoint.second_role == "next" else "the previous secret"
        raise Conflict(f"{what} is still stored: promote or retire it first", code="rotation_in_progress")
    key, shown = new_secret()
    endpoint.second_kid = key.kid
    endpoint.second_enc = seal(cfg.box, key.key)
    endpoint.second_role = "next"
    endpoint.second_created_at = cfg.clock()
    endpoint.updated_at = cfg.clock()
    audit.record(session, actor, "webhook.rotate", _target(endpoint, repo), step="generate", kid=key.kid)
    return endpoint, shown, key.kid


async def rotate_promote(
    session: AsyncSession, actor: Actor, cfg: WebhooksConfig, repo: Repository | None, endpoint: WebhookEndpoint
) -> WebhookEndpoint:
    """The staged secret starts signing; the old one stays as `previous` until retired."""
    if endpoint.second_role != "next" or endpoint.second_kid is None or endpoint.second_enc is None:
        raise Conflict("there is no staged next secret to promote", code="no_next_secret")
    old = (endpoint.secret_kid, endpoint.secret_enc, endpoint.secret_created_at)
    endpoint.secret_kid, endpoint.secret_enc = endpoint.second_kid, endpoint.second_enc
    endpoint.secret_created_at = endpoint.second_created_at or cfg.clock()
    endpoint.second_kid, endpoint.second_enc, endpoint.second_created_at = old
    endpoint.second_role = "previous"
    endpoint.updated_at = cfg.clock()
    audit.record(session, actor, "webhook.rotate", _target(endpoint, repo), step="promote", kid=endpoint.secret_kid)
    return endpoint


async def rotate_retire(
    session: AsyncSession, actor: Actor, cfg: WebhooksConfig, repo: Repository | None, endpoint: WebhookEndpoint
) -> WebhookEndpoint:
    """Forget the second secret (the previous one after a promote, or a staged next one)."""
    if endpoint.second_kid is None:
        raise Conflict("there is only one secret", code="nothing_to_retire")
    kid, role = endpoint.second_kid, endpoint.second_role
    endpoint.second_kid = endpoint.second_enc = endpoint.second_role = None
    endpoint.second_created_at = None
    endpoint.updated_at = cfg.clock()
    audit.record(session, actor, "webhook.rotate", _target(endpoint, repo), step="retire", kid=kid, role=role)
    return endpoint


async def ping(
    session: AsyncSession, actor: Actor, cfg: WebhooksConfig, repo: Repository | None, endpoint: WebhookEndpoint
) -> WebhookOutbox:
    """Queue a `ping` notification for this endpoint (one attempt, shown in its log)."""
    event = Event(
        repo_id=repo.id if repo else None,
        repo_uuid=repo.uuid if repo else "",
        repository=f"{repo.owner.login}/{repo.name}" if repo else "",
        data=Ping(
            hook_id=endpoint.id,
            url=endpoint.url,
            events=list(endpoint.events),
            kind="policy" if endpoint.kind == "policy" else "notify",
        ),
        at=cfg.clock(),
    )
    body, subject = envelope.for_event(event, cfg.instance_id)
    row = enqueue(
        session,
        cfg,
        endpoint.id,
        wid=event.id,
        event_type="ping",
        subject=subject,
        body=body,
        order_key=f"manual:{event.id}",
        manual=True,
    )
    await session.flush()
    audit.record(session, actor, "webhook.ping", _target(endpoint, repo), delivery_id=event.id)
    return row


async def list_deliveries(
    session: AsyncSession, endpoint: WebhookEndpoint, *, limit: int = 50, before: int | None = None
) -> list[DeliveryRead]:
    stmt = (
        select(WebhookDelivery)
        .where(WebhookDelivery.endpoint_id == endpoint.id)
        .order_by(WebhookDelivery.id.desc())
        .limit(max(1, min(limit, 200)))
    )
    if before is not None:
        stmt = stmt.where(WebhookDelivery.id < before)
    return [_delivery_read(d) for d in (await session.execute(stmt)).scalars()]


def _delivery_read(d: WebhookDelivery) -> DeliveryRead:
    return DeliveryRead(
        id=d.id,
        wid=d.wid,
        jti=d.jti,
        kind="policy" if d.kind == "policy" else "notify",
        event=d.event_type,
        attempt=d.attempt,
        url=d.url,
        result=d.result,
        error=d.error,
        response_status=d.response_status,
        duration_ms=d.duration_ms,
        started_at=d.started_at,
    )


async def _delivery(session: AsyncSession, endpoint: WebhookEndpoint, delivery_id: int) -> WebhookDelivery:
    row = await session.get(WebhookDelivery, delivery_id)
    if row is None or row.endpoint_id != endpoint.id:
        raise NotFound("delivery not found", code="delivery_not_found")
    return row


async def get_delivery(session: AsyncSession, endpoint: WebhookEndpoint, delivery_id: int) -> DeliveryDetail:
    d = await _delivery(session, endpoint, delivery_id)
    base = msgspec.structs.asdict(_delivery_read(d))
    return DeliveryDetail(
        **base,
        request_headers=[list(h) for h in d.request_headers],
        request_body=bytes(d.request_body).decode("utf-8", errors="replace"),
        response_headers=[list(h) for h in d.response_headers],
        response_body=bytes(d.response_body).decode("utf-8", errors="replace"),
        response_truncated=d.response_truncated,
    )


async def redeliver(
    session: AsyncSession,
    actor: Actor,
    cfg: WebhooksConfig,
    repo: Repository | None,
    endpoint: WebhookEndpoint,
    delivery_id: int,
) -> WebhookOutbox:
    """Queue one new attempt of a logged delivery: the same body and `wid`, a new `jti`.
    A redelivered policy call is logged like any attempt; its answer decides nothing."""
    d = await _delivery(session, endpoint, delivery_id)
    body = bytes(d.request_body)
    try:
        meta = loads_strict(body).get("meta", {})
    except (StrictJSONError, AttributeError):
        raise Conflict("the logged body cannot be redelivered", code="not_redeliverable") from None
    row = enqueue(
        session,
        cfg,
        endpoint.id,
        wid=d.wid,
        event_type=d.event_type,
        subject=subject_for(meta, cfg.instance_id),
        body=body,
        order_key=f"manual:{uuid.uuid4()}",
        manual=True,
    )
    await session.flush()
    audit.record(
        session, actor, "webhook.redeliver", _target(endpoint, repo), delivery_id=d.wid, log_id=d.id, outbox_id=row.id
    )
    return row
