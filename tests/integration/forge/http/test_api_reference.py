"""The API reference opens with what a caller needs (what the API is, how to authenticate with a
token, where the error codes are), and its document is built once per process, in a worker thread:
the event loop keeps answering meanwhile, and later apps never build it again."""

import asyncio
import threading
from typing import Any

import httpx
import pytest
from litestar import Litestar
from litestar._openapi.plugin import OpenAPIPlugin
from litestar.testing import AsyncTestClient

from forge.app.factory import create_app
from forge.core.error_codes import Code
from forge.core.settings import Settings
from forge.http.api import reference
from forge.http.api.contract import ContractJsonPlugin, route_key
from tests.support.accounts import LiveServer


async def test_the_reference_opens_with_a_description_for_callers(client: AsyncTestClient[Any]) -> None:
    doc = (await client.get("/api/schema/openapi.json")).json()
    description = doc["info"]["description"]
    assert "The forgehand host" not in description  # the package docstring it used to show
    for says in ("REST API", "Settings → Tokens", "Authorization: Bearer fh_", "problem+json", "Problem → code"):
        assert says in description, says
    codes = doc["components"]["schemas"]["Problem"]["properties"]["code"]["description"]
    assert f"- `{Code.REPO_NOT_FOUND.value}` (404): {Code.REPO_NOT_FOUND.meaning}" in codes
    assert codes.count("\n- `") == len(Code)
    page = await client.get("/api/schema/swagger")
    assert page.status_code == 200 and 'href="/static/favicon.svg"' in page.text


def test_the_event_loop_answers_while_the_document_builds(
    live_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reference, "_documents", {})  # as in a process that never built it
    monkeypatch.setattr(ContractJsonPlugin, "_cache", {})
    building, answered = threading.Event(), threading.Event()
    build = reference._build

    def build_after_another_request(app: Litestar) -> dict[str, Any]:
        # The build holds on until the server has answered another request: on the event loop
        # (as Litestar's own handler would build it) that request could never be answered.
        building.set()
        assert answered.wait(60), "no other request was answered while the document was being built"
        return build(app)

    monkeypatch.setattr(reference, "_build", build_after_another_request)

    async def go() -> None:
        async with httpx.AsyncClient(base_url=live_server.url, timeout=120) as client:
            reference = asyncio.create_task(client.get("/api/schema/swagger"))
            assert await asyncio.to_thread(building.wait, 60)
            assert (await client.get("/healthz")).status_code == 200
            answered.set()
            assert (await reference).status_code == 200

    asyncio.run(go())


async def test_later_apps_never_build_the_document_again(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    async with AsyncTestClient(app=create_app(settings), base_url="http://testserver.local") as client:
        assert (await client.get("/api/schema/openapi.json")).status_code == 200  # built, or cached already

    def no_second_build(self: OpenAPIPlugin) -> Any:
        raise AssertionError("the OpenAPI document was built again")

    monkeypatch.setattr(OpenAPIPlugin, "_build_openapi", no_second_build)
    monkeypatch.setattr(ContractJsonPlugin, "contract", _cached_only(ContractJsonPlugin.contract))
    async with AsyncTestClient(app=create_app(settings), base_url="http://testserver.local") as client:
        for path in ("/api/schema", "/api/schema/swagger", "/api/schema/openapi.json"):
            assert (await client.get(path)).status_code == 200, path


def _cached_only(contract: Any) -> Any:
    def check(self: ContractJsonPlugin, app: Litestar, schema: dict[str, Any]) -> bytes:
        assert route_key(app) in ContractJsonPlugin._cache, "the contract was completed again"
        result: bytes = contract(self, app, schema)
        return result

    return check


async def test_serve_builds_it_at_startup(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reference, "_documents", {})
    app = create_app(settings)
    reference.warm_up(app)
    async with app.lifespan():
        assert reference._warming  # started in the background: startup did not wait for it
        await asyncio.wait_for(asyncio.gather(*reference._warming), timeout=120)
        assert app.plugins.get(OpenAPIPlugin)._openapi_schema is not None
