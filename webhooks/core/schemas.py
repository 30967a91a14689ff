"""API shapes of webhook endpoints and their delivery log. Requests forbid unknown fields."""

from datetime import datetime
from typing import Annotated, Literal

import msgspec

Kind = Literal["policy", "notify"]
FailurePolicy = Literal["closed", "open", "hold"]
EventName = Annotated[str, msgspec.Meta(min_length=1, max_length=40)]


class HookCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    url: Annotated[str, msgspec.Meta(min_length=1, max_length=2000)]
    kind: Kind
    events: Annotated[list[EventName], msgspec.Meta(min_length=1, max_length=20)]
    failure_policy: FailurePolicy = "closed"
    active: bool = True


class HookUpdate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    url: Annotated[str, msgspec.Meta(min_length=1, max_length=2000)] | None = None
    events: Annotated[list[EventName], msgspec.Meta(min_length=1, max_length=20)] | None = None
    failure_policy: FailurePolicy | None = None
    # Setting true again re-enables an endpoint forgehand disabled (and clears the notice).
    active: bool | None = None


class SecretInfo(msgspec.Struct, kw_only=True):
    kid: str
    role: Literal["current", "next", "previous"]
    created_at: datetime


class HookRead(msgspec.Struct, kw_only=True):
    id: int
    scope: Literal["instance", "repository"]
    repository: str | None
    url: str
    kind: Kind
    events: list[str]
    failure_policy: FailurePolicy
    active: bool
    # Why forgehand disabled it (410 Gone, failing for 5 days); null when it did not.
    disabled_reason: str | None
    disabled_at: datetime | None
    failing_since: datetime | None
    last_success_at: datetime | None
    secrets: list[SecretInfo]
    created_at: datetime
    updated_at: datetime


class HookWithSecret(msgspec.Struct, kw_only=True):
    """The answer of create and rotate: the only time a secret is shown."""

    hook: HookRead
    secret: str  # whsec_<base64>
    kid: str


class Queued(msgspec.Struct, kw_only=True):
    delivery_id: str  # the wid (stable across attempts)
    outbox_id: int
    event: str


class DeliveryRead(msgspec.Struct, kw_only=True):
    id: int
    wid: str
    jti: str
    kind: Kind
    event: str
    attempt: int
    url: str
    result: str
    error: str
    response_status: int | None
    duration_ms: int
    started_at: datetime


class DeliveryDetail(DeliveryRead, kw_only=True):
    request_headers: list[list[str]]
    request_body: str
    response_headers: list[list[str]]
    response_body: str  # first 64 KiB, decoded as UTF-8 with replacement
    response_truncated: bool
