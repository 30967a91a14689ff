"""Tables of the webhooks package: endpoints, the notification outbox and the delivery log."""

import uuid as uuid_mod
from datetime import datetime
from typing import cast

from sqlalchemy import JSON, Boolean, ForeignKey, Index, Integer, LargeBinary, String, Table, Text
from sqlalchemy.orm import Mapped, mapped_column

from forge.db.engine import Base, utcnow


class WebhookEndpoint(Base):
    """A consumer URL at instance scope (`repo_id` NULL) or on one repository.

    Two secret slots: `current` signs every JWT; `second` is either a staged `next` secret (before
    a promote) or the `previous` one (after a promote, until it is retired). Notifications carry a
    Standard Webhooks signature for each stored secret, so a consumer can switch at its own pace.
    Secrets are encrypted with the instance's SecretBox."""

    __tablename__ = "webhook_endpoints"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(36), unique=True, default=lambda: str(uuid_mod.uuid4()))
    repo_id: Mapped[int | None] = mapped_column(
        ForeignKey("repositories.id", ondelete="CASCADE"), nullable=True, index=True
    )
    url: Mapped[str] = mapped_column(String(2000))
    kind: Mapped[str] = mapped_column(String(8))  # policy | notify
    events: Mapped[list[str]] = mapped_column(JSON, default=list)
    failure_policy: Mapped[str] = mapped_column(String(8), default="closed")  # closed | open | hold
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    # Set when forgehand disabled the endpoint (410 Gone, failing for 5 days): shown to its admins.
    disabled_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    disabled_at: Mapped[datetime | None] = mapped_column(nullable=True)
    # Start of the current run of failed deliveries (NULL after a success).
    failing_since: Mapped[datetime | None] = mapped_column(nullable=True)
    last_success_at: Mapped[datetime | None] = mapped_column(nullable=True)

    secret_kid: Mapped[str] = mapped_column(String(40))
    secret_enc: Mapped[str] = mapped_column(Text)
    secret_created_at: Mapped[datetime] = mapped_column(default=utcnow)
    second_kid: Mapped[str | None] = mapped_column(String(40), nullable=True)
    second_enc: Mapped[str | None] = mapped_column(Text, nullable=True)
    second_role: Mapped[str | None] = mapped_column(String(8), nullable=True)  # next | previous
    second_created_at: Mapped[datetime | None] = mapped_column(nullable=True)

    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id", ondelete="SET NULL"), nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class WebhookOutbox(Base):
    """One notification for one endpoint, written in the transaction of the change it reports.

    `body` holds the exact bytes sent on every attempt. Rows of one endpoint and one `order_key`
    (the task, else the repository) are delivered in `id` order: a row is due only when no older
    row of the same key is still pending."""

    __tablename__ = "webhook_outbox"
    __table_args__ = (
        Index("ix_webhook_outbox_due", "state", "next_attempt_at"),
        Index("ix_webhook_outbox_order", "endpoint_id", "order_key", "state", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    endpoint_id: Mapped[int] = mapped_column(ForeignKey("webhook_endpoints.id", ondelete="CASCADE"))
    wid: Mapped[str] = mapped_column(String(36), index=True)
    event_type: Mapped[str] = mapped_column(String(40))
    subject: Mapped[str] = mapped_column(String(120))
    order_key: Mapped[str] = mapped_column(String(80), default="")
    body: Mapped[bytes] = mapped_column(LargeBinary)
    # pending -> delivered | failed (gave up after the whole schedule)
    state: Mapped[str] = mapped_column(String(10), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(default=utcnow)
    lease_until: Mapped[datetime | None] = mapped_column(nullable=True)
    claim_token: Mapped[str | None] = mapped_column(String(36), nullable=True)
    manual: Mapped[bool] = mapped_column(Boolean, default=False)  # a redelivery or a ping
    # `attempts` when an endpoint's recovery last moved this row's retry to now: a row whose
    # last attempt was that catch-up is not caught up again before a scheduled attempt.
    caught_up_at_attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_error: Mapped[str | None] = mapped_column(String(40), nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(nullable=True)


class WebhookDelivery(Base):
    """One attempt (notification or policy call): request, response, duration, result class."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_webhook_deliveries_endpoint_id_id", "endpoint_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    endpoint_id: Mapped[int] = mapped_column(ForeignKey("webhook_endpoints.id", ondelete="CASCADE"))
    outbox_id: Mapped[int | None] = mapped_column(
        ForeignKey("webhook_outbox.id", ondelete="SET NULL"), nullable=True, index=True
    )
    wid: Mapped[str] = mapped_column(String(36), index=True)
    jti: Mapped[str] = mapped_column(String(36))
    kind: Mapped[str] = mapped_column(String(8))  # policy | notify
    event_type: Mapped[str] = mapped_column(String(40))
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    url: Mapped[str] = mapped_column(String(2000))
    request_headers: Mapped[list[list[str]]] = mapped_column(JSON, default=list)
    request_body: Mapped[bytes] = mapped_column(LargeBinary)
    response_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    response_headers: Mapped[list[list[str]]] = mapped_column(JSON, default=list)
    response_body: Mapped[bytes] = mapped_column(LargeBinary, default=b"")
    response_truncated: Mapped[bool] = mapped_column(Boolean, default=False)
    duration_ms: Mapped[int] = mapped_column(Integer, default=0)
    # ok | denied | asked | http_error | protocol_error | timeout | connection_error | over_capacity
    result: Mapped[str] = mapped_column(String(20))
    error: Mapped[str] = mapped_column(String(500), default="")
    started_at: Mapped[datetime] = mapped_column(default=utcnow)


# The delivery log as a table, for bulk inserts (the policy log writer, the outbox store).
DELIVERIES = cast(Table, WebhookDelivery.__table__)
