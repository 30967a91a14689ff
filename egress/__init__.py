"""forgehand's egress proxy: what a sandbox may reach when its repository allows network access.

The sandbox keeps network none; its only way out is this HTTP(S) forward proxy on the run's
channel socket (`egress.sock`), reached through the sandbox's relay on 127.0.0.1:3128
(`HTTP_PROXY`/`HTTPS_PROXY`). The proxy allows what the rules name (rules.py: host[:port],
*.domain, METHOD http://host/path-prefix, presets), resolves names itself and checks every
address with the URL guard's rules (addresses.py), and reports each refusal and each connection
to its owner (the run). It knows nothing of tasks: `tasks.run.egress` wires it to a run.

    proxy = EgressProxy(channel_dir / SOCKET_NAME, RuleSet.build(rules, presets),
                        Dialer(AllowedHosts.parse(operator_allow_list)), on_blocked=..., on_allowed=...)
    await proxy.start(); ...; await proxy.close()
"""

from egress.addresses import AllowedHosts, Dialer, Refused, Unreachable
from egress.http11 import Allowed, Blocked, Timeouts
from egress.proxy import SOCKET_NAME, EgressProxy
from egress.rules import PRESETS, RuleError, RuleSet, parse_presets, parse_rule

__all__ = [
    "PRESETS",
    "SOCKET_NAME",
    "Allowed",
    "AllowedHosts",
    "Blocked",
    "Dialer",
    "EgressProxy",
    "Refused",
    "RuleError",
    "RuleSet",
    "Timeouts",
    "Unreachable",
    "parse_presets",
    "parse_rule",
]
