"""The URL guard for model endpoints that repository admins and people chose (their base URLs in
repository settings and personal keys): the webhooks' address rules (webhooks.urlguard), applied
when each connection is opened. The host is resolved once, every address is checked, and the
socket goes to a checked address, so a name cannot resolve to a public address for the check and
to a private one for the connection (DNS rebinding). Loopback, private, link-local (cloud
metadata) and other non-global addresses are refused unless the operator allow-lists them
(`FORGEHAND_MODEL_ALLOWED_HOSTS`, the syntax of `FORGEHAND_WEBHOOKS_ALLOWED_HOSTS`). The
instance's own endpoints (`FORGEHAND_MODEL_BASE_URL`, `FORGEHAND_ANTHROPIC_BASE_URL`) are the
operator's choice and are not guarded.

httpx's own transport cannot take a network backend, so `GuardedTransport` drives an httpcore
pool whose backend is the guard's, and speaks httpx's types on both sides (its errors included:
the proxy handles one kind of error whichever client made the call)."""

from collections.abc import AsyncIterable, AsyncIterator, Iterator
from contextlib import contextmanager
from typing import cast

import httpcore
import httpx

from webhooks.urlguard import AddressRefused, AllowList, GuardedBackend, Resolver

SETTING = "FORGEHAND_MODEL_ALLOWED_HOSTS"


class EndpointRefused(httpx.ConnectError):
    """The endpoint's host is (or resolves to) an address the guard refuses; nothing was sent."""


def allow_list(value: str) -> AllowList:
    """FORGEHAND_MODEL_ALLOWED_HOSTS parsed; ValueError names the setting."""
    return AllowList.parse(value, setting=SETTING)


@contextmanager
def _httpx_errors(request: httpx.Request) -> Iterator[None]:
    try:
        yield
    except AddressRefused as exc:
        raise EndpointRefused(f"{exc} (allow-list it in {SETTING})", request=request) from None
    except httpcore.TimeoutException as exc:
        kind = getattr(httpx, type(exc).__name__, httpx.TimeoutException)
        raise kind(str(exc), request=request) from exc
    except httpcore.NetworkError as exc:
        kind = getattr(httpx, type(exc).__name__, httpx.NetworkError)
        raise kind(str(exc), request=request) from exc
    except (httpcore.ProtocolError, httpcore.UnsupportedProtocol) as exc:
        kind = getattr(httpx, type(exc).__name__, httpx.RemoteProtocolError)
        raise kind(str(exc), request=request) from exc


class _Body(httpx.AsyncByteStream):
    def __init__(self, stream: object, request: httpx.Request) -> None:
        self._stream = cast(AsyncIterable[bytes], stream)  # an async pool's bodies are async
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _httpx_errors(self._request):
            async for part in self._stream:
                yield part

    async def aclose(self) -> None:
        close = getattr(self._stream, "aclose", None)
        if close is not None:
            await close()


class GuardedTransport(httpx.AsyncBaseTransport):
    def __init__(self, allow: AllowList, resolver: Resolver | None = None) -> None:
        self.backend = GuardedBackend(allow, resolver)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            max_connections=32,
            keepalive_expiry=30.0,
            http1=True,
            http2=False,
            retries=0,
            network_backend=self.backend,
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _httpx_errors(request):
            answer = await self._pool.handle_async_request(core)
        return httpx.Response(
            status_code=answer.status,
            headers=answer.headers,
            stream=_Body(answer.stream, request),
            extensions=answer.extensions,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()
