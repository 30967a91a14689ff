"""The URL guard: which endpoint URLs may be configured, and which addresses may be connected to.

Two checks, at two moments:
- `validate_url` when an endpoint is created or changed: `https` (unless the host is allow-listed),
  a host, no userinfo, no fragment, no whitespace, no non-canonical IPv4 spelling (`2130706433`,
  `0177.0.0.1`, `0x7f.1`, `127.1`), no IPv6 zone id, and no literal address that is not
  globally routable;
- `GuardedBackend.connect_tcp` at every connection: the host is resolved once, *every* address
  is checked (`refusal_reason`), and the socket is opened to a checked address, so DNS cannot
  answer differently between the check and the connection (rebinding).

The operator allow-list (`FORGEHAND_WEBHOOKS_ALLOWED_HOSTS`: names, addresses or CIDRs) exempts a
host from the https rule and its addresses from the address check; tests and local development
allow-list loopback explicitly.
"""

import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpcore

from forge.errors import InvalidInput

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Never connected to unless allow-listed. `is_global` is checked as well; this list makes the
# families explicit (and independent of the Python version's idea of "global").
_V4_BLOCKED: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", "this network"),
    ("10.0.0.0/8", "private (RFC 1918)"),
    ("100.64.0.0/10", "shared address space (CGNAT)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local (cloud metadata)"),
    ("172.16.0.0/12", "private (RFC 1918)"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.0.2.0/24", "documentation"),
    ("192.31.196.0/24", "AS112"),
    ("192.52.193.0/24", "AMT"),
    ("192.88.99.0/24", "6to4 relay anycast"),
    ("192.168.0.0/16", "private (RFC 1918)"),
    ("192.175.48.0/24", "AS112"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
    ("255.255.255.255/32", "broadcast"),
)
_V6_BLOCKED: tuple[tuple[str, str], ...] = (
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("::/96", "IPv4-compatible"),
    ("::ffff:0:0/96", "IPv4-mapped"),
    ("::ffff:0:0:0/96", "IPv4-translated"),
    ("64:ff9b::/96", "NAT64"),
    ("64:ff9b:1::/48", "NAT64 (local use)"),
    ("100::/64", "discard"),
    ("2001::/23", "IETF protocol assignments (Teredo, benchmarking, ORCHID)"),
    ("2001:db8::/32", "documentation"),
    ("2002::/16", "6to4"),
    ("3fff::/20", "documentation"),
    ("5f00::/16", "SRv6 SIDs"),
    ("fc00::/7", "unique local (ULA)"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local"),
    ("ff00::/8", "multicast"),
)
_BLOCKED: list[tuple[Network, str]] = [(ipaddress.ip_network(n), why) for n, why in _V4_BLOCKED + _V6_BLOCKED]


def refusal_reason(address: IPAddress) -> str | None:
    """Why an address must not be connected to, or None when it is globally routable.
    IPv4 embedded in IPv6 (mapped, compatible, NAT64, 6to4, Teredo) is refused as a family and
    its embedded address is named, so that no spelling reaches a blocked IPv4 address."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.scope_id:
            return "scoped IPv6 address"
        mapped = address.ipv4_mapped
        if mapped is not None:
            inner = refusal_reason(mapped)
            return f"IPv4-mapped {mapped} ({inner or 'mapped form'})"
    for network, why in _BLOCKED:
        if address.version == network.version and address in network:
            return why
    if not address.is_global or address.is_multicast or address.is_reserved or address.is_unspecified:
        return "not globally routable"
    return None


@dataclass(frozen=True)
class AllowList:
    """Hosts exempt from the https rule and the address check (names, addresses, CIDRs)."""

    names: frozenset[str] = frozenset()
    networks: tuple[Network, ...] = field(default_factory=tuple)

    @classmethod
    def parse(
        cls, value: str | Iterable[str] | None, *, setting: str = "FORGEHAND_WEBHOOKS_ALLOWED_HOSTS"
    ) -> "AllowList":
        items = value.split(",") if isinstance(value, str) else list(value or [])
        names: set[str] = set()
        networks: list[Network] = []
        for raw in items:
            item = raw.strip().lower()
            if not item:
                continue
            if item.startswith("[") and item.endswith("]"):
                item = item[1:-1]
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
                continue
            except ValueError:
                pass
            if not valid_hostname(item.rstrip(".")):
                raise ValueError(f"{setting}: {raw.strip()!r} is not a host name, address or CIDR")
            names.add(item.rstrip("."))
        return cls(frozenset(names), tuple(networks))

    def allows_host(self, host: str) -> bool:
        """Is this URL host (a name or a literal address) allow-listed?"""
        host = host.lower().rstrip(".")
        if host in self.names:
            return True
        try:
            return self.allows_address(ipaddress.ip_address(host))
        except ValueError:
            return False

    def allows_address(self, address: IPAddress) -> bool:
        return any(address.version == n.version and address in n for n in self.networks)

    def __bool__(self) -> bool:
        return bool(self.names or self.networks)


def valid_hostname(host: str) -> bool:
    if not host or len(host) > 253:
        return False
    for label in host.split("."):
        if not label or len(label) > 63 or label.startswith("-") or label.endswith("-"):
            return False
        if not all(c.isascii() and (c.isalnum() or c in "-_") for c in label):
            return False
    return True


def is_noncanonical_ipv4(host: str) -> bool:
    """True for spellings the C resolver reads as IPv4 but that are not a dotted quad
    (`2130706433`, `0x7f.1`, `0177.0.0.1`, `127.1`)."""
    try:
        socket.inet_aton(host)
    except (OSError, ValueError):
        return False
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return True
    return False


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
    literal: IPAddress | None = None
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        if is_noncanonical_ipv4(host):
            raise _refuse(f"{host!r} is a non-canonical IPv4 spelling; write the address as a dotted quad") from None
        if not valid_hostname(host.rstrip(".")):
            raise _refuse(f"{host!r} is not a valid host name") from None
    allowed = allow.allows_host(host)
    if parts.scheme != "https" and not allowed:
        raise _refuse("the URL must be https (only operator allow-listed hosts may use http)")
    bare = host.lower().rstrip(".")
    if not allowed and (bare == "localhost" or bare.endswith(".localhost")):
        raise _refuse(f"{host!r} is a loopback name (RFC 6761)")
    if literal is not None and not allowed:
        reason = refusal_reason(literal)
        if reason is not None:
            raise _refuse(f"{literal} is not a globally routable address ({reason})")
    return url


class AddressRefused(Exception):
    """The host resolved to an address the guard refuses; nothing was connected to."""


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
    checked one. TLS (SNI, certificate) and the Host header still use the URL's host name."""

    def __init__(self, allow: AllowList, resolver: Resolver | None = None) -> None:
        self.allow = allow
        self.resolver = resolver or system_resolver
        self._inner = httpcore.AnyIOBackend()

    async def resolve_checked(self, host: str, port: int, budget: float | None) -> list[str]:
        host_allowed = self.allow.allows_host(host)
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
            if host_allowed or self.allow.allows_address(address):
                continue
            reason = refusal_reason(address)
            if reason is not None:
                raise AddressRefused(f"{host} resolves to {address}: {reason}")
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
