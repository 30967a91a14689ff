"""The URL guard: which endpoint URLs may be configured, and which addresses may be connected to.

Two checks, at two moments:
- `validate_url` when an endpoint is created or changed: a host, no userinfo, no fragment, no
  whitespace, no non-canonical IPv4 spelling (`2130706433`, `0177.0.0.1`, `0x7f.1`, `127.1`), no
  IPv6 zone id (`invalid_hook_url`); and `https`, no loopback name and no literal address that is
  not globally routable, unless the host is allow-listed (`host_not_allowed`, whose message says
  where an instance admin allows it);
- `GuardedBackend.connect_tcp` at every connection: the host is resolved once, *every* address
  is checked (`refusal_reason`), and the socket is opened to a checked address, so DNS cannot
  answer differently between the check and the connection (rebinding).

The allow-list (`FORGEHAND_WEBHOOKS_ALLOWED_HOSTS`, and what an instance admin adds in Admin >
Network: names, addresses or CIDRs, forge.db.allowlists) exempts a host from the https rule and its
addresses from the address check; tests and local development allow-list loopback explicitly.
"""

import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpcore

from forge.core.addresses import (
    AllowList,
    IPAddress,
    Network,
    ask_admin,
    host_refusal,
    is_noncanonical_ipv4,
    refusal_reason,
    valid_hostname,
)
from forge.core.error_codes import Code
from forge.core.errors import InvalidInput

__all__ = [
    "AddressRefused",
    "AllowList",
    "AllowSource",
    "GuardedBackend",
    "IPAddress",
    "Network",
    "Resolver",
    "is_noncanonical_ipv4",
    "refusal_reason",
    "system_resolver",
    "valid_hostname",
    "validate_url",
]

# The allow-list as it is now (an instance admin may change it while the process runs).
AllowSource = Callable[[], Awaitable[AllowList]]


def _refuse(message: str) -> InvalidInput:
    return InvalidInput(message, code="invalid_hook_url")


def validate_url(url: str, allow: AllowList) -> str:
    """Check an endpoint URL as configured; returns it unchanged (it is the JWT audience)."""
    if not isinstance(url, str) or not url or len(url) > 2000:
        raise _refuse("the URL must be 1 to 2000 characters")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url) or "\\" in url:
        raise _refuse("the URL must not contain whitespace, control characters or backslashes")
    if "#" in url:
        raise _refuse("the URL must not carry a fragment (it never travels, the audience check would break)")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise _refuse("the URL cannot be parsed (bad port or brackets)") from None
    if parts.scheme not in {"https", "http"}:
        raise _refuse("the URL must be https")
    netloc = parts.netloc
    if "@" in netloc or parts.username is not None or parts.password is not None:
        raise _refuse("the URL must not carry userinfo (it never travels, the audience check would break)")
    host = parts.hostname
    if not host:
        raise _refuse("the URL must have a host")
    if port == 0:
        raise _refuse("port 0 cannot be connected to")
    bracketed = netloc.split("]")[0] if netloc.startswith("[") else ""
    if "%" in bracketed or "%" in host:
        raise _refuse("IPv6 zone ids are not allowed")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if is_noncanonical_ipv4(host):
            raise _refuse(f"{host!r} is a non-canonical IPv4 spelling; write the address as a dotted quad") from None
        if not valid_hostname(host.rstrip(".")):
            raise _refuse(f"{host!r} is not a valid host name") from None
    refused = host_refusal(host, allow)
    if refused is None and parts.scheme != "https" and not allow.allows_host(host):
        refused = "the URL must be https (http is only for hosts on the instance's allow-list)"
    if refused is not None:
        raise InvalidInput(f"{refused}: {ask_admin(host, 'webhooks')}", code=Code.HOST_NOT_ALLOWED)
    return url


class AddressRefused(Exception):
    """The host resolved to an address the guard refuses; nothing was connected to. `why` says
    it in words (the address's kind, and the name it came from when the host is a name)."""

    def __init__(self, message: str, why: str = "") -> None:
        super().__init__(message)
        self.why = why or message


Resolver = Callable[[str, int], Awaitable[list[str]]]


async def system_resolver(host: str, port: int) -> list[str]:
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: list[str] = []
    for _family, _type, _proto, _canon, sockaddr in infos:
        addr = str(sockaddr[0])
        if addr not in seen:
            seen.append(addr)
    return seen


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """An httpcore network backend that resolves once, checks every address and connects to a
    checked one. TLS (SNI, certificate) and the Host header still use the URL's host name.
    `allow` is a fixed list or a source asked at every connection (the list as it is now)."""

    def __init__(self, allow: AllowList | AllowSource, resolver: Resolver | None = None) -> None:
        self.allow = allow
        self.resolver = resolver or system_resolver
        self._inner = httpcore.AnyIOBackend()

    async def current(self) -> AllowList:
        return self.allow if isinstance(self.allow, AllowList) else await self.allow()

    async def resolve_checked(self, host: str, port: int, budget: float | None) -> list[str]:
        allow = await self.current()
        host_allowed = allow.allows_host(host)
        try:
            literal: IPAddress | None = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            literal = None
        if literal is not None:
            addresses = [str(literal)]
        else:
            if is_noncanonical_ipv4(host):
                raise AddressRefused(f"{host!r} is a non-canonical IPv4 spelling")
            try:
                with anyio.fail_after(budget):
                    addresses = await self.resolver(host, port)
            except TimeoutError:
                raise httpcore.ConnectTimeout(f"resolving {host} timed out") from None
            except OSError as exc:
                raise httpcore.ConnectError(f"cannot resolve {host}: {exc.strerror or exc}") from None
        if not addresses:
            raise httpcore.ConnectError(f"{host} has no address")
        for text in addresses:
            address = ipaddress.ip_address(text)
            if host_allowed or allow.allows_address(address):
                continue
            reason = refusal_reason(address)
            if reason is not None:
                why = f"{address} is not a public address ({reason})"
                if literal is None:
                    why = f"{host} resolves to {address}, which is not a public address ({reason})"
                raise AddressRefused(f"{host} resolves to {address}: {reason}", why)
        return addresses

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's signature)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await self.resolve_checked(host, port, timeout)
        last: Exception | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
        assert last is not None
        raise last

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's signature)
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise AddressRefused("unix sockets are never connected to")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)
