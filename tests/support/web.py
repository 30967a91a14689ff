"""Small helpers for tests that drive the web UI with plain HTTP."""

import re
from typing import Any

from litestar.testing import AsyncTestClient

CSRF_RE = re.compile(r'name="csrf_token" value="([^"]*)"')


def csrf_from(html: str) -> str:
    match = CSRF_RE.search(html)
    assert match, "no CSRF field in the page"
    return match.group(1)


async def sign_in(client: AsyncTestClient[Any], login: str, password: str) -> Any:
    page = await client.get("/signin")
    # The sign-in form's own token (a signed-in page also has the sign-out form's).
    token = csrf_from(page.text[page.text.index('action="/signin"') :])
    return await client.post(
        "/signin", data={"login": login, "password": password, "csrf_token": token, "next": "/"}, follow_redirects=False
    )
