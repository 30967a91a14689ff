"""The address rules every outbound connection a user configures goes through (webhook and policy
endpoints, model endpoints chosen by repository admins or in personal keys, egress): which
addresses are never connected to unless an instance admin allow-lists them (`refusal_reason`),
the allow-list itself (`AllowList`: names, addresses, CIDRs), and why a URL's host needs the
allow-list (`host_refusal`), which saves check before anything is stored.

Pure: no I/O. `forge.core.urlguard` connects with these rules; `forge.db.allowlists` keeps the lists
an instance admin manages beside the operator's environment variables."""

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field

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


def host_refusal(host: str, allow: AllowList) -> str | None:
    """Why a URL's host may not be used unless allow-listed: a loopback name (RFC 6761) or a
    literal address that is not globally routable; None when it may (names that resolve to such an
    address are refused when connecting)."""
    if allow.allows_host(host):
        return None
    bare = host.lower().rstrip(".")
    if bare == "localhost" or bare.endswith(".localhost"):
        return f"{host!r} is a loopback name"
    try:
        literal = ipaddress.ip_address(bare.strip("[]"))
    except ValueError:
        return None
    reason = refusal_reason(literal)
    return None if reason is None else f"{literal} is not a public address ({reason})"


def ask_admin(host: str, what: str) -> str:
    """The fix a refusal names: where an instance admin allows `host` for `what` (model endpoints,
    webhooks)."""
    return f"ask an instance admin to allow {host.strip('[]')} in Admin > Network ({what})"


def normalize_host(raw: str) -> str:
    """One allow-list entry as stored: a host name (lower case, no trailing dot), an address, or a
    CIDR (a one-address CIDR as the address). ValueError says what an entry may be."""
    item = raw.strip().lower()
    if item.startswith("[") and item.endswith("]"):
        item = item[1:-1]
    try:
        network = ipaddress.ip_network(item, strict=False)
    except ValueError:
        network = None
    if network is not None:
        return str(network.network_address) if network.num_addresses == 1 else str(network)
    host, sep, port = item.rpartition(":")
    if sep and port.isdigit() and ":" not in host:
        raise ValueError(f"{raw.strip()!r}: without the port; allow {host.strip('[]')} (every port of that host)")
    name = item.rstrip(".")
    if not valid_hostname(name):
        raise ValueError(
            f"{raw.strip()!r} is not a host name, an address or a CIDR (e.g. 127.0.0.1, llm.internal, 10.0.0.0/8)"
        )
    return name


def merged(*lists: AllowList) -> AllowList:
    """Every host any of `lists` allows."""
    names: set[str] = set()
    networks: list[Network] = []
    for allow in lists:
        names |= allow.names
        networks.extend(n for n in allow.networks if n not in networks)
    return AllowList(frozenset(names), tuple(networks))
