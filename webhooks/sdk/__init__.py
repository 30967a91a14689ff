"""The consumer SDK: verify forgehand's webhook requests and route them to callbacks.

Needs only PyJWT and the standard library (an import-linter contract keeps it so), so a third
party can use it without the rest of forgehand::

    from webhooks.sdk import Consumer, Verifier, allow, deny

    verifier = Verifier(audience="https://hooks.example.com/forgehand", secrets=["whsec_..."])

    def pre_tool_use(req):
        if req.data["tool_name"] == "bash":
            return deny("no shell here")
        return None  # no opinion

    consumer = Consumer(verifier, policy={"pre_tool_use": pre_tool_use}, notify=print)
    # WSGI: consumer.wsgi; ASGI: consumer.asgi; any framework: consumer.handle(method, headers, body)

Modules: `protocol` (the wire contract shared with forgehand: event names, limits, secrets, strict
JSON), `verifier` (verification and its typed errors), `consumer` (routing and answers),
`reference` (the reference consumer behind `forgehand hooks serve`).
"""

from webhooks.sdk.consumer import Consumer, HttpResponse, allow, ask, deny
from webhooks.sdk.protocol import NOTIFY_EVENTS, POLICY_EVENTS
from webhooks.sdk.verifier import (
    BadSignature,
    BindingMismatch,
    BodyTooLarge,
    Expired,
    HookRequest,
    InvalidClaim,
    MalformedBody,
    MalformedToken,
    MethodNotAllowed,
    MissingClaim,
    MissingToken,
    NotYetValid,
    UnknownKey,
    UnsupportedAlgorithm,
    UnsupportedSchema,
    VerificationError,
    Verifier,
    WrongAudience,
    WrongIssuer,
)

__all__ = [
    "NOTIFY_EVENTS",
    "POLICY_EVENTS",
    "BadSignature",
    "BindingMismatch",
    "BodyTooLarge",
    "Consumer",
    "Expired",
    "HookRequest",
    "HttpResponse",
    "InvalidClaim",
    "MalformedBody",
    "MalformedToken",
    "MethodNotAllowed",
    "MissingClaim",
    "MissingToken",
    "NotYetValid",
    "UnknownKey",
    "UnsupportedAlgorithm",
    "UnsupportedSchema",
    "VerificationError",
    "Verifier",
    "WrongAudience",
    "WrongIssuer",
    "allow",
    "ask",
    "deny",
]
