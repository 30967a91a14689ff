"""Where an allowed name may lead: the proxy resolves it itself, checks every address with the URL
guard's rules (forge.core.urlguard.refusal_reason: loopback, private, link-local, metadata...) and
connects to a checked address, so DNS cannot answer differently between check and connection.

The operator's `FORGEHAND_EGRESS_ALLOWED_HOSTS` exempts entries from the address check, like the
webhooks allow-list: `host[:port]` (a name, before resolution), an address (`10.0.0.5`,
`[fd00::5]:8080`) or a CIDR (`10.1.0.0/16`). It never allows a host by itself: the rules do that.
"""

import asyncio
import ipaddress
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from egress.rules import RuleError, normalize_host, split_authority
from egress.sockio import Conn, open_tcp, open_unix
from forge.core.urlguard import IPAddress, Network, refusal_reason, system_resolver

Resolver = Callable[[str, int], Awaitable[list[str]]]
_LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


class Refused(Exception):
    """The connection is not made; `rules` names the rule set that refused it."""

    def __init__(self, rules: str, reason: str) -> None:
        super().__init__(reason)
        self.rules = rules
        self.reason = reason


class Unreachable(Exception):
    """Allowed, but the name does not resolve or no address answers in time (a 502 or 504)."""

    def __init__(self, reason: str, *, timeout: bool = False) -> None:
        super().__init__(reason)
        self.timeout = timeout


@dataclass(frozen=True)
class AllowedHosts:
    """The operator's exemptions from the address check (see the module doc)."""

    names: frozenset[tuple[str, int | None]] = frozenset()
    networks: tuple[tuple[Network, int | None], ...] = field(default_factory=tuple)

    @classmethod
    def parse(cls, value: str | Iterable[str] | None) -> "AllowedHosts":
        items = value.split(",") if isinstance(value, str) else list(value or [])
        names: set[tuple[str, int | None]] = set()
        networks: list[tuple[Network, int | None]] = []
        for raw in items:
            item = raw.strip().lower()
            if not item:
                continue
            network = _network(item)
            if network is not None:
                networks.append((network, None))
                continue
            split = split_authority(item)
            if split is None:
                raise RuleError(
                    f"FORGEHAND_EGRESS_ALLOWED_HOSTS: {raw.strip()!r} is not a host[:port], an address or a CIDR"
                )
            host, port = split
            try:
                networks.append((ipaddress.ip_network(host), port))
            except ValueError:
                names.add((host, port))
        return cls(frozenset(names), tuple(networks))

    def exempts_name(self, host: str, port: int) -> bool:
        return (host, None) in self.names or (host, port) in self.names

    def exempts_address(self, address: IPAddress, port: int) -> bool:
        return any(
            address.version == net.version and address in net and (p is None or p == port) for net, p in self.networks
        )

    def __bool__(self) -> bool:
        return bool(self.names or self.networks)


def _network(item: str) -> Network | None:
    if "/" not in item:
        return None
    try:
        return ipaddress.ip_network(item.strip("[]"), strict=False)
    except ValueError:
        return None


@dataclass
class Dialer:
    """Resolve, check, connect: what the proxy does for every allowed host."""

    allowed: AllowedHosts = field(default_factory=AllowedHosts)
    resolver: Resolver = system_resolver
    resolve_timeout: float = 5.0
    connect_timeout: float = 10.0
    # The sandbox's own loopback relays (port -> the channel socket behind it): a client that sends
    # everything to the proxy, 127.0.0.1 included, still reaches them. Never the host's loopback.
    loopback_sockets: dict[int, Path] = field(default_factory=dict)

    def channel_socket(self, host: str, port: int) -> Path | None:
        """The channel socket behind the sandbox's 127.0.0.1:`port`, when that is what is asked for."""
        if port in self.loopback_sockets and normalize_host(host) in _LOOPBACK_NAMES:
            return self.loopback_sockets[port]
        return None

    async def checked_addresses(self, host: str, port: int) -> list[IPAddress]:
        """Every address of `host`, each checked; Refused when any is not allowed (one bad
        address in an answer refuses the name: the resolver's order is not ours to trust)."""
        name = normalize_host(host)
        if name is None:
            raise Refused("request", f"{host!r} is not a host name or address")
        try:
            literal: IPAddress | None = ipaddress.ip_address(name)
        except ValueError:
            literal = None
        if literal is not None:
            addresses = [literal]
        else:
            try:
                async with asyncio.timeout(self.resolve_timeout):
                    texts = await self.resolver(name, port)
            except TimeoutError:
                raise Unreachable(
                    f"resolving {name} took longer than {self.resolve_timeout:g} s", timeout=True
                ) from None
            except OSError as exc:
                raise Unreachable(f"{name} does not resolve: {exc.strerror or exc}") from None
            addresses = [ipaddress.ip_address(t.split("%")[0]) for t in texts]
            if not addresses:
                raise Unreachable(f"{name} has no address")
        if literal is None and self.allowed.exempts_name(name, port):
            return addresses
        for address in addresses:
            if self.allowed.exempts_address(address, port):
                continue
            reason = refusal_reason(address)
            if reason is not None:
                what = f"{address}" if literal is not None else f"{name} resolves to {address}, which"
                raise Refused("address", f"{what} is not a public address ({reason})")
        return addresses

    async def connect(self, host: str, port: int) -> Conn:
        """A connection to a checked address of host:port (tried in the resolver's order)."""
        channel = self.channel_socket(host, port)
        if channel is not None:
            try:
                return await open_unix(channel, self.connect_timeout)
            except (OSError, TimeoutError) as exc:
                raise Unreachable(f"the run's channel socket {channel.name} does not answer: {exc}") from None
        addresses = await self.checked_addresses(host, port)
        last = ""
        for address in addresses:
            try:
                return await open_tcp(str(address), port, self.connect_timeout)
            except TimeoutError:
                last = f"{address} port {port} did not answer within {self.connect_timeout:g} s"
            except OSError as exc:
                last = f"{address} port {port}: {exc.strerror or exc}"
        raise Unreachable(f"cannot connect to {host}: {last}", timeout="did not answer" in last)
