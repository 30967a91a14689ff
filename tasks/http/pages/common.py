"""What every task page shows about its repository, and how a page shows JSON to a person."""

import json
import unicodedata
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from litestar.response import Template

from forge import repositories
from forge.access import Principal
from forge.errors import ForgeError
from forge.repositories import RepoResource
from tasks.services import rules

Done = TypeVar("Done")


async def or_form_error(action: Awaitable[Done], again: Callable[[ForgeError], Awaitable[Template]]) -> Done | Template:
    """A form's action, or the page again showing why it was refused (a 404 stays a 404)."""
    try:
        return await action
    except ForgeError as exc:
        if exc.status == 404:
            raise
        return await again(exc)


def repo_context(res: RepoResource, principal: Principal, base_url: str) -> dict[str, Any]:
    return {
        "repo": repositories.to_read(res, principal, base_url),
        "can_admin": rules.may_configure(principal, res),
        "can_write": rules.may_act(principal, res),
    }


def visible_json(value: Any) -> str:
    """JSON for a person to approve: readable (non-ASCII text as is), but characters that are
    invisible or change the text's direction are shown escaped, so they cannot disguise a command."""
    text = json.dumps(value, indent=2, ensure_ascii=False)
    hidden = ("Cc", "Cf", "Co", "Cs", "Zl", "Zp")
    return "".join(f"\\u{ord(ch):04x}" if ch != "\n" and unicodedata.category(ch) in hidden else ch for ch in text)
