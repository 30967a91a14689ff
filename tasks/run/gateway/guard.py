"""The URL guard for model endpoints that repository admins and people chose (their base URLs in
repository settings and personal keys): the shared address rules (forge.core.urlguard), applied
when each connection is opened. The host is resolved once, every address is checked, and the
socket goes to a checked address, so a name cannot resolve to a public address for the check and
to a private one for the connection (DNS rebinding). Loopback, private, link-local (cloud
metadata) and other non-global addresses are refused unless the operator allow-lists them
(`FORGEHAND_MODEL_ALLOWED_HOSTS`, the syntax of `FORGEHAND_WEBHOOKS_ALLOWED_HOSTS`, and the hosts an
instance admin adds in Admin > Network: forge.db.allowlists, read as they are at each connection). The
instance's own endpoints (`FORGEHAND_MODEL_BASE_URL`, `FORGEHAND_ANTHROPIC_BASE_URL`) are the
operator's choice and are not guarded.

The check runs in the gateway's upstream transport (tasks/run/gateway/upstream.py), which asks
`GuardedBackend.resolve_checked` for the addresses it may connect to; a refusal is
`EndpointRefused` (an `httpx.ConnectError`), answered 502 `x-forgehand-gateway: refused`."""

from forge.core.urlguard import AllowList, AllowSource, GuardedBackend, Resolver
from tasks.run.gateway.upstream import ALLOWED_HOSTS_SETTING, EndpointRefused, UpstreamTransport

__all__ = ["EndpointRefused", "allow_list", "guarded_transport"]


def allow_list(value: str) -> AllowList:
    """FORGEHAND_MODEL_ALLOWED_HOSTS parsed; ValueError names the setting."""
    return AllowList.parse(value, setting=ALLOWED_HOSTS_SETTING)


def guarded_transport(allow: AllowList | AllowSource, resolver: Resolver | None = None) -> UpstreamTransport:
    return UpstreamTransport(guard=GuardedBackend(allow, resolver))
