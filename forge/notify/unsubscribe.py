"""The e-mail's unsubscribe links: a signed token (a JWT, HS256, with a key derived from the
instance's secret for this use alone) that names a person and what to turn off (a thread, or a
reason's e-mail), and using one without signing in (RFC 8058 one-click: a POST to the link)."""

import hashlib
import hmac
from typing import Literal

import jwt
import msgspec
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Principal
from forge.core.error_codes import Code
from forge.core.errors import NotFound
from forge.db import audit
from forge.db.audit import Actor
from forge.db.models import Account
from forge.notify import preferences, subscriptions
from forge.notify.reasons import REASONS, SUBJECT_PATHS

AUDIENCE = "forgehand:unsubscribe"


class Unsubscribe(msgspec.Struct, frozen=True, kw_only=True):
    """What a link turns off: a thread (`kind` thread: repo, subject type and number) or the
    e-mails of a reason (`kind` reason)."""

    account_id: int
    kind: Literal["thread", "reason"]
    repo_id: int = 0
    subject_type: str = ""
    number: int = 0
    reason: str = ""


def _key(secret: str) -> bytes:
    return hmac.new(secret.encode(), b"forgehand notifications unsubscribe", hashlib.sha256).digest()


def sign(secret: str, what: Unsubscribe) -> str:
    claims: dict[str, object] = {"aud": AUDIENCE, "sub": str(what.account_id), "k": what.kind}
    if what.kind == "thread":
        claims |= {"r": what.repo_id, "t": what.subject_type, "n": what.number}
    else:
        claims |= {"reason": what.reason}
    return jwt.encode(claims, _key(secret), algorithm="HS256")


def _refused() -> NotFound:
    return NotFound(
        "this unsubscribe link is not valid here: open your notification settings (/settings/notifications) instead",
        code=Code.INVALID_UNSUBSCRIBE_LINK,
    )


def verify(secret: str, token: str) -> Unsubscribe:
    """The link's content; refuses (404) a token this instance did not sign."""
    try:
        claims = jwt.decode(token[:2000], _key(secret), algorithms=["HS256"], audience=AUDIENCE)
        kind = claims["k"]
        if kind == "thread" and claims["t"] in SUBJECT_PATHS:
            return Unsubscribe(
                account_id=int(claims["sub"]), kind="thread", repo_id=int(claims["r"]),
                subject_type=str(claims["t"]), number=int(claims["n"]),
            )  # fmt: skip
        if kind == "reason" and claims["reason"] in REASONS:
            return Unsubscribe(account_id=int(claims["sub"]), kind="reason", reason=str(claims["reason"]))
    except (jwt.PyJWTError, KeyError, ValueError, TypeError):
        pass
    raise _refused()


def describe(what: Unsubscribe) -> str:
    if what.kind == "thread":
        noun = {"issue": "issue", "pull_request": "pull request", "task": "task"}[what.subject_type]
        return f"notifications of {noun} #{what.number}"
    return f"e-mails about {what.reason.replace('_', ' ')}"


async def apply(session: AsyncSession, secret: str, token: str, client_addr: str = "") -> Unsubscribe:
    """Turn off what the link names, for the person it names (audited as them)."""
    what = verify(secret, token)
    account = await session.get(Account, what.account_id)
    if account is None:
        raise _refused()
    if what.kind == "thread":
        await subscriptions.ignore_thread(session, account.id, what.repo_id, what.subject_type, what.number)
    else:
        await preferences.set_channel(session, account.id, what.reason, "web")
    principal = Principal(account_id=account.id, login=account.login, type="Bot" if account.is_bot else "User")
    actor = Actor(principal=principal, client_addr=client_addr)
    audit.record(session, actor, "notifications.unsubscribe", describe(what), kind=what.kind)
    return what
