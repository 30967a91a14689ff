"""A token made in a form (the signed-in person's own, or a bot's by an admin) and its secret
shown once: it travels from the POST to the page it redirects to in a short-lived cookie scoped to
that page (POST-redirect-GET: a reload never mints a second token), and the page that shows it
clears the cookie."""

import hmac
from typing import Any

import msgspec
from litestar import Request
from litestar.datastructures import Cookie
from litestar.response import Redirect, Template
from sqlalchemy.ext.asyncio import AsyncSession

from forge.accounts import tokens
from forge.core.error_codes import Code
from forge.core.errors import InvalidInput
from forge.core.security import sha256_hex
from forge.core.settings import Settings
from forge.db.audit import Actor
from forge.db.models import AccessToken, Account
from forge.http.pages.common import WebForm


class TokenForm(WebForm):
    name: str = ""
    scopes: list[str] | str = msgspec.field(default_factory=list)
    expires_days: str = ""


def form_scopes(value: list[str] | str) -> list[str]:
    return [value] if isinstance(value, str) else value


async def create_from_form(
    db_session: AsyncSession, actor: Actor, owner: Account, form: TokenForm
) -> tokens.TokenCreated:
    """A token from the form, for the signed-in person (Tokens) or, by an admin, for a bot."""
    return await tokens.create(
        db_session, actor, owner, form.name, form_scopes(form.scopes), _expiry(form.expires_days)
    )


def _expiry(value: str) -> int | None:
    value = value.strip()
    if not value:
        return None
    if not (value.isascii() and value.isdecimal()):
        raise InvalidInput("expiry must be a number of days", code=Code.INVALID_EXPIRY)
    return int(value)


NEW_TOKEN_COOKIE = "fh_new_token"
_NEW_TOKEN_SECONDS = 120


def created_redirect(target: str, created: tokens.TokenCreated, settings: Settings) -> Redirect:
    return Redirect(
        target,
        status_code=303,
        cookies=[
            Cookie(
                key=NEW_TOKEN_COOKIE,
                value=f"{created.info.id}.{created.token}",
                httponly=True,
                secure=settings.secure_cookies,
                samesite="strict",
                max_age=_NEW_TOKEN_SECONDS,
                path=target.rstrip("/") or "/",
            )
        ],
    )


async def take_created(
    request: Request[Any, Any, Any], db_session: AsyncSession, *, owner_id: int | None = None
) -> tokens.TokenCreated | None:
    """The token the previous POST created, if the cookie names a live one (of `owner_id`, when
    given) and carries its secret."""
    token_id, _, secret = request.cookies.get(NEW_TOKEN_COOKIE, "").partition(".")
    if not (token_id.isascii() and token_id.isdecimal()) or len(token_id) > 18 or len(secret) <= 8:
        return None
    row = await db_session.get(AccessToken, int(token_id))
    # The whole secret must hash to the row's: a cookie planted by someone else (a sibling
    # subdomain, plain http) cannot make the page show a secret that is not the token.
    if row is None or row.revoked_at is not None or not hmac.compare_digest(sha256_hex(secret), row.token_hash):
        return None
    owner = await db_session.get(Account, row.account_id)
    if owner is None or (owner_id is not None and owner.id != owner_id):
        return None
    return tokens.TokenCreated(token=secret, info=tokens.to_read(row, owner.login))


def clear_created(response: Template, path: str) -> Template:
    response.cookies.append(Cookie(key=NEW_TOKEN_COOKIE, value="", max_age=0, path=path))
    return response
