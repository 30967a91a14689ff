"""Domain errors. Services raise these; one handler maps them to RFC 9457 problem details (API)
or to an error page (web). `code` values are a stable contract for bots: each one is registered
in `forge.core.error_codes` with its status, and an error built with any other code fails at once."""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from forge.core.error_codes import Code, lookup


class ForgeError(Exception):
    status: ClassVar[int] = Code.BAD_REQUEST.status
    default_code: ClassVar[Code] = Code.BAD_REQUEST
    title: ClassVar[str] = "Bad request"

    def __init_subclass__(cls, *, code: Code | None = None, title: str | None = None, **kwargs: Any) -> None:
        # A subclass names its default code; its status is the registry's, so the two cannot disagree.
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.default_code = code
            cls.status = code.status
        if title is not None:
            cls.title = title

    def __init__(self, detail: str, *, code: str | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.code: str = lookup(code or self.default_code, self.status).value
        self.extra = extra
        # Set once an audit row was written for this refusal, so it is not written twice.
        self.audited = False


class InvalidInput(ForgeError, code=Code.VALIDATION_FAILED, title="Invalid input"):
    pass


class Unauthenticated(ForgeError, code=Code.UNAUTHENTICATED, title="Authentication required"):
    pass


class Forbidden(ForgeError, code=Code.FORBIDDEN, title="Forbidden"):
    pass


class NotFound(ForgeError, code=Code.NOT_FOUND, title="Not found"):
    pass


class Conflict(ForgeError, code=Code.CONFLICT, title="Conflict"):
    pass


class InvalidState(Conflict, code=Code.INVALID_STATE, title="Invalid state"):
    pass


class PayloadTooLarge(ForgeError, code=Code.PAYLOAD_TOO_LARGE, title="Payload too large"):
    pass


class RateLimited(ForgeError, code=Code.RATE_LIMITED, title="Too many requests"):
    def __init__(self, detail: str, *, retry_after: int, code: str | None = None) -> None:
        super().__init__(detail, code=code)
        self.retry_after = retry_after


class BadGateway(ForgeError, code=Code.BAD_GATEWAY, title="Bad gateway"):
    """An external service forgehand depends on (a policy hook) failed; the detail names the delivery."""


class Unavailable(ForgeError, code=Code.UNAVAILABLE, title="Service unavailable"):
    pass


@contextmanager
def about_field(name: str) -> Iterator[None]:
    """Refusals raised inside concern the input `name` (its wire name): a form shows them beside it
    (forge/http/pages/forms.py). One that names its field already keeps it."""
    try:
        yield
    except ForgeError as exc:
        exc.extra.setdefault("field", name)
        raise
