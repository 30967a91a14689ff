"""Every response carries the headers that keep agent- and repository-written content from
reaching other origins: images only from this instance, no framing, no sniffing, no referrers."""

from typing import Any

from litestar.testing import AsyncTestClient


async def test_pages_and_api_carry_the_security_headers(client: AsyncTestClient[Any]) -> None:
    for path, status in (("/signin", 200), ("/api/v1/repos", 200), ("/healthz", 200), ("/nobody/nothing", 404)):
        r = await client.get(path, headers={"Accept": "text/html"})
        assert r.status_code == status, (path, r.status_code)
        csp = r.headers.get("content-security-policy", "")
        assert "img-src 'self' data:" in csp and "frame-ancestors 'none'" in csp, (path, csp)
        assert r.headers.get("x-content-type-options") == "nosniff", path
        assert r.headers.get("referrer-policy") == "same-origin", path
