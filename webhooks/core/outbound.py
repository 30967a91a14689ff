"""Outbound HTTP for deliveries and policy calls: guarded connections, no redirects, no proxies
from the environment, a hard total timeout and a cap on the response bytes read.

httpcore is used directly (httpx's transport cannot take a custom network backend): the pool's
backend is the `GuardedBackend`, so every new connection is resolved once, checked, and opened to
the checked address."""

import asyncio
import ssl
import time
from dataclasses import dataclass
from typing import Literal

import httpcore

from forge.core.urlguard import AddressRefused, AllowList, AllowSource, GuardedBackend, Resolver

FailureKind = Literal["timeout", "connection_error", "refused"]


class OutboundError(Exception):
    """No HTTP response: `kind` is timeout, connection_error (nothing or a broken exchange) or
    refused (the guard refused the address; nothing was connected to)."""

    def __init__(self, kind: FailureKind, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


@dataclass
class Reply:
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    truncated: bool  # the response body was longer than the cap (only `cap` bytes were read)
    seconds: float


class Outbound:
    """A connection pool whose connections all went through the URL guard."""

    def __init__(
        self,
        allow: AllowList | AllowSource,
        *,
        max_connections: int = 64,
        resolver: Resolver | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.backend = GuardedBackend(allow, resolver)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context,
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=30.0,
            http1=True,
            http2=False,
            retries=0,
            network_backend=self.backend,
        )

    async def post(
        self,
        url: str,
        headers: list[tuple[str, str]],
        body: bytes,
        *,
        total_timeout: float,
        connect_timeout: float | None = None,
        max_response: int,
    ) -> Reply:
        """POST and read at most `max_response` bytes of the answer, all within `total_timeout`."""
        started = time.monotonic()
        if total_timeout <= 0:
            raise OutboundError("timeout", "no time left")
        connect = min(connect_timeout, total_timeout) if connect_timeout else total_timeout
        extensions = {"timeout": {"connect": connect, "read": total_timeout, "write": total_timeout, "pool": connect}}
        try:
            async with asyncio.timeout(total_timeout):
                async with self._pool.stream(
                    "POST", url, headers=headers, content=body, extensions=extensions
                ) as response:
                    chunks: list[bytes] = []
                    size = 0
                    truncated = False
                    async for chunk in response.aiter_stream():
                        room = max_response - size
                        if len(chunk) > room:
                            chunks.append(chunk[:room])
                            size += room
                            truncated = True
                            break
                        chunks.append(chunk)
                        size += len(chunk)
                    reply_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers]
                    return Reply(
                        status=response.status,
                        headers=reply_headers,
                        body=b"".join(chunks),
                        truncated=truncated,
                        seconds=time.monotonic() - started,
                    )
        except TimeoutError:
            raise OutboundError("timeout", f"no complete answer within {total_timeout:.2f} s") from None
        except AddressRefused as exc:
            raise OutboundError("refused", str(exc)) from None
        except httpcore.TimeoutException as exc:
            raise OutboundError("timeout", f"{type(exc).__name__}: {exc}"[:300]) from None
        except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol) as exc:
            raise OutboundError("connection_error", f"{type(exc).__name__}: {exc}"[:300]) from None
        except OSError as exc:
            raise OutboundError("connection_error", f"{type(exc).__name__}: {exc}"[:300]) from None

    async def aclose(self) -> None:
        await self._pool.aclose()
