"""Endpoint health after a failed notification: `failing_since` is set at the first failure, and
the endpoint is disabled (with a notice, an audit row and a log line) when it answers `410 Gone`
or when every delivery has failed for `AUTO_DISABLE_AFTER`. Successes clear it in bulk
(`webhooks.delivery.outbox_store`)."""

from datetime import datetime

import structlog
from sqlalchemy.ext.asyncio import AsyncSession

from forge.db import audit
from forge.db.audit import Actor
from webhooks.core.models import WebhookEndpoint
from webhooks.delivery.schedule import AUTO_DISABLE_AFTER

log = structlog.get_logger("forgehand.webhooks")
SYSTEM = Actor.system("webhooks")


def note_failure(
    session: AsyncSession, endpoint: WebhookEndpoint, *, status: int | None, error: str, now: datetime
) -> None:
    """Record a failed attempt on `endpoint` (loaded in `session`, the recording transaction)."""
    if endpoint.failing_since is None:
        endpoint.failing_since = now
    if not endpoint.active:
        return
    reason = None
    if status == 410:
        reason = f"disabled on {now:%Y-%m-%d %H:%M} UTC: the endpoint answered 410 Gone"
    elif now - endpoint.failing_since >= AUTO_DISABLE_AFTER:
        reason = (
            f"disabled on {now:%Y-%m-%d %H:%M} UTC: every delivery failed since "
            f"{endpoint.failing_since:%Y-%m-%d %H:%M} UTC (last: {error})"
        )
    if reason is not None:
        endpoint.active = False
        endpoint.disabled_reason = reason
        endpoint.disabled_at = now
        audit.record(session, SYSTEM, "webhook.disable", f"hook:{endpoint.id}", reason=reason, url=endpoint.url)
        log.warning("webhook endpoint disabled", hook=endpoint.id, reason=reason)
