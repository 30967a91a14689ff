"""API shapes of the host (accounts, tokens, audit). Request structs forbid unknown fields."""

from datetime import datetime
from typing import Annotated, Literal

import msgspec


class UserRead(msgspec.Struct, kw_only=True):
    id: int
    login: str
    type: Literal["User", "Bot"]
    display_name: str
    is_admin: bool
    created_at: datetime
    # The scopes of the token used for this call (null for a browser session).
    token_scopes: list[str] | None = None


class TokenCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=100)]
    scopes: Annotated[list[str], msgspec.Meta(min_length=1, max_length=20)]
    expires_days: Annotated[int, msgspec.Meta(ge=1, le=3650)] | None = None


class UserCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    login: Annotated[str, msgspec.Meta(min_length=1, max_length=39)]
    # Empty: a random password is generated and returned once.
    password: Annotated[str, msgspec.Meta(max_length=1024)] = ""
    is_admin: bool = False
    display_name: Annotated[str, msgspec.Meta(max_length=200)] = ""


class UserCreated(msgspec.Struct, kw_only=True):
    login: str
    password: str | None  # only when generated


class BotCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    login: Annotated[str, msgspec.Meta(min_length=1, max_length=39)]
    owner: Annotated[str, msgspec.Meta(max_length=39)] | None = None
    display_name: Annotated[str, msgspec.Meta(max_length=200)] = ""


class AccountUpdate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    disabled: bool | None = None


class PasswordSet(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # Empty: a random password is generated and returned once. Length rules are the service's
    # (weak_password, invalid_password), the same as the web form's.
    password: Annotated[str, msgspec.Meta(max_length=4096)] = ""


class PasswordSetResult(msgspec.Struct, kw_only=True):
    login: str
    password: str | None  # only when generated
    sessions_ended: int
