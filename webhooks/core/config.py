"""What the package needs from the host's settings, read once (with defaults until the settings
struct grows these fields)."""

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from forge.core.security import SecretBox
from forge.core.urlguard import AllowList
from forge.db.engine import utcnow
from webhooks.core.models import WebhookEndpoint
from webhooks.core.signing import SigningKey
from webhooks.sdk.protocol import DEFAULT_BUDGET

Clock = Callable[[], datetime]
SECRET_PURPOSE = "forgehand-webhook-secrets-v1"


@dataclass(frozen=True)
class WebhooksConfig:
    instance_id: str
    box: SecretBox
    allow: AllowList = field(default_factory=AllowList)
    policy_concurrency: int = 32
    policy_deadline: float = DEFAULT_BUDGET  # seconds a dispatch may take when its caller names none
    delivery_concurrency: int = 8
    clock: Clock = utcnow

    @classmethod
    def from_settings(cls, settings: Any, **overrides: Any) -> "WebhooksConfig":
        values: dict[str, Any] = {
            "instance_id": settings.instance_id,
            "box": SecretBox(settings.secret_key, purpose=SECRET_PURPOSE),
            "allow": AllowList.parse(getattr(settings, "webhooks_allowed_hosts", "")),
            "policy_concurrency": int(getattr(settings, "webhooks_policy_concurrency", 32)),
            "delivery_concurrency": int(getattr(settings, "webhooks_delivery_concurrency", 8)),
            "policy_deadline": float(getattr(settings, "webhooks_policy_deadline_seconds", DEFAULT_BUDGET)),
        }
        values.update(overrides)
        return cls(**values)

    def signing_key(self, endpoint: WebhookEndpoint) -> SigningKey:
        """The key every JWT is signed with (the `current` secret)."""
        return SigningKey(endpoint.secret_kid, _key(self.box, endpoint.secret_enc))

    def all_keys(self, endpoint: WebhookEndpoint) -> list[SigningKey]:
        """Every stored secret, current first (Standard Webhooks signs with each)."""
        keys = [self.signing_key(endpoint)]
        if endpoint.second_kid and endpoint.second_enc:
            keys.append(SigningKey(endpoint.second_kid, _key(self.box, endpoint.second_enc)))
        return keys


def unseal(box: SecretBox, enc: str) -> bytes:
    """The key bytes of a stored (encrypted) secret."""
    return bytes.fromhex(box.decrypt(enc))


_key = unseal


def seal(box: SecretBox, key: bytes) -> str:
    return box.encrypt(key.hex())
