"""Every response carries the headers that keep agent- and repository-written content from
reaching other origins: images only from this instance, no framing, no sniffing, no referrers."""

from typing import Any

from litestar.testing import AsyncTestClient


async def test_pages_and_api_carry_the_security_headers(client: AsyncTestClient[Any]) -> None:
    for method, path, status in (
        ("GET", "/signin", 200),
        ("GET", "/api/v1/repos", 200),
        ("GET", "/healthz", 200),
        ("GET", "/nobody/nothing", 404),
        ("GET", "/static/forgehand.css", 200),
        ("DELETE", "/healthz", 405),  # answered by routing, before any handler or middleware
        ("POST", "/api/v1/user/repos", 401),  # an exception handler's answer
    ):
        r = await client.request(method, path, headers={"Accept": "text/html"})
        assert r.status_code == status, (path, r.status_code)
        assert r.headers.get_list("x-content-type-options") == ["nosniff"], path  # once, never twice
        csp = r.headers.get("content-security-policy", "")
        assert "img-src 'self' data:" in csp and "frame-ancestors 'none'" in csp, (path, csp)
        assert r.headers.get("x-content-type-options") == "nosniff", path
        assert r.headers.get("referrer-policy") == "same-origin", path


async def test_the_api_reference_serves_only_its_own_assets(client: AsyncTestClient[Any]) -> None:
    """Swagger UI's package also holds a demo page whose initializer loads the petstore from
    another origin: only the files the page uses are served."""
    for name, kind in (("swagger-ui-bundle.js", "javascript"), ("swagger-ui.css", "css")):
        r = await client.get(f"/static/api-reference/{name}")
        assert r.status_code == 200 and kind in r.headers["content-type"] and len(r.content) > 1000
    for name in ("index.html", "swagger-initializer.js", "index.j2", "../../../../etc/passwd"):
        r = await client.get(f"/static/api-reference/{name}")
        assert r.status_code == 404, (name, r.status_code)
    page = await client.get("/api/schema/swagger")
    assert page.status_code == 200 and "/static/api-reference/swagger-ui-bundle.js" in page.text
