"""Domain errors. Services raise these; one handler maps them to RFC 9457 problem details (API)
or to an error page (web). `code` values are a stable contract for bots."""

from typing import Any, ClassVar


class ForgeError(Exception):
    status: ClassVar[int] = 400
    default_code: ClassVar[str] = "bad_request"
    title: ClassVar[str] = "Bad request"

    def __init__(self, detail: str, *, code: str | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.code = code or self.default_code
        self.extra = extra
        # Set once an audit row was written for this refusal, so it is not written twice.
        self.audited = False


class InvalidInput(ForgeError):
    status = 422
    default_code = "validation_failed"
    title = "Invalid input"


class Unauthenticated(ForgeError):
    status = 401
    default_code = "unauthenticated"
    title = "Authentication required"


class Forbidden(ForgeError):
    status = 403
    default_code = "forbidden"
    title = "Forbidden"


class NotFound(ForgeError):
    status = 404
    default_code = "not_found"
    title = "Not found"


class Conflict(ForgeError):
    status = 409
    default_code = "conflict"
    title = "Conflict"


class InvalidState(Conflict):
    default_code = "invalid_state"
    title = "Invalid state"


class PayloadTooLarge(ForgeError):
    status = 413
    default_code = "payload_too_large"
    title = "Payload too large"


class RateLimited(ForgeError):
    status = 429
    default_code = "rate_limited"
    title = "Too many requests"

    def __init__(self, detail: str, *, retry_after: int, code: str | None = None) -> None:
        super().__init__(detail, code=code)
        self.retry_after = retry_after


class BadGateway(ForgeError):
    """An external service forgehand depends on (a policy hook) failed; the detail names the delivery."""

    status = 502
    default_code = "bad_gateway"
    title = "Bad gateway"


class Unavailable(ForgeError):
    status = 503
    default_code = "unavailable"
    title = "Service unavailable"
