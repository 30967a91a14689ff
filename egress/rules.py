"""What the egress proxy allows: rules written by a repository's admins and presets the operator or
the repository enables, parsed once into a `RuleSet`.

A rule is one of:
- `host` or `host:port`: CONNECT tunnels and plain-HTTP requests (any method, any path) to that
  host; without a port, the web ports 80 and 443. The host is a name or an address
  (`[2001:db8::1]:443` for IPv6).
- `*.example.org` or `*.example.org:443`: any name below example.org (not example.org itself).
- `GET http://host[:port]/path-prefix`: plain-HTTP requests with that method whose path starts
  with the prefix (a tunnel is opaque, so method and path rules never allow a CONNECT).

Rules only say which names may be asked for; where a name may lead is the address check's
business (addresses.py).
"""

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from forge.core.urlguard import is_noncanonical_ipv4, valid_hostname

# The real hosts of each preset (what pip, npm and apt contact by default).
PRESETS: dict[str, tuple[str, ...]] = {
    "pypi": ("pypi.org:443", "files.pythonhosted.org:443"),
    "npm": ("registry.npmjs.org:443",),
    "debian": (
        "deb.debian.org:80",
        "deb.debian.org:443",
        "security.debian.org:80",
        "security.debian.org:443",
    ),
}
WEB_PORTS = (80, 443)
MAX_RULES = 200
MAX_RULE_LENGTH = 300

Source = Literal["repository", "preset"]

_METHOD = re.compile(r"^[A-Z]{1,20}$")
# Characters a path prefix may hold (RFC 3986 pchar without "%": an encoded byte could hide a
# "/" or a "." from the comparison).
_PATH = re.compile(r"^/[A-Za-z0-9\-._~!$&'()*+,;=:@/]*$")


class RuleError(ValueError):
    """A rule, a preset or an allow-list entry that cannot be parsed; the message names it."""


def normalize_host(raw: str) -> str | None:
    """The host as rules compare it (lower case, no trailing dot, an address in its canonical
    form, IPv6 without brackets), or None when it is neither a name nor an address."""
    host = raw.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        try:
            return str(ipaddress.IPv6Address(host[1:-1]))
        except ValueError:
            return None
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        pass
    if is_noncanonical_ipv4(host):
        return None
    host = host.removesuffix(".")
    return host if valid_hostname(host) else None


def split_authority(authority: str) -> tuple[str, int | None] | None:
    """`host`, `host:port`, `[v6]` or `[v6]:port` as (normalized host, port or None)."""
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            return None
        host_part, rest = authority[: end + 1], authority[end + 1 :]
        if rest and not rest.startswith(":"):
            return None
        port_part = rest[1:] if rest else None
    elif authority.count(":") == 1:
        host_part, port_part = authority.split(":")
    elif ":" in authority:
        return None  # a bare IPv6 address needs brackets when a port may follow
    else:
        host_part, port_part = authority, None
    host = normalize_host(host_part)
    if host is None:
        return None
    if port_part is None:
        return host, None
    if not port_part.isascii() or not port_part.isdigit() or not 1 <= int(port_part) <= 65535:
        return None
    return host, int(port_part)


@dataclass(frozen=True)
class HostRule:
    text: str
    source: Source
    host: str  # normalized; for a wildcard the suffix after "*."
    wildcard: bool
    ports: tuple[int, ...]

    def matches(self, host: str, port: int) -> bool:
        if port not in self.ports:
            return False
        return host.endswith("." + self.host) if self.wildcard else host == self.host


@dataclass(frozen=True)
class PathRule:
    text: str
    source: Source
    method: str
    host: str
    port: int
    prefix: str

    def matches(self, method: str, host: str, port: int, path: str) -> bool:
        return (method, host, port) == (self.method, self.host, self.port) and path.startswith(self.prefix)


Rule = HostRule | PathRule


EXPECTED = "expected host[:port], *.domain[:port] or METHOD http://host/path-prefix"
# Methods a lower-case first word is most likely meant as (`get http://...`).
KNOWN_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT")


def _refuse(text: str, problem: str, *, expected: bool = True) -> RuleError:
    """The refusal of rule `text`: what is wrong with which part, then the forms a rule takes."""
    return RuleError(f"rule {text!r}: {problem}" + (f"; {EXPECTED}" if expected else ""))


def parse_rule(text: str, source: Source = "repository") -> Rule:
    """One rule (see the module doc); RuleError naming the wrong part and the expected form otherwise."""
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_RULE_LENGTH:
        raise RuleError(f"a rule must be 1 to {MAX_RULE_LENGTH} characters")
    rule = text.strip()
    if any(c.isspace() for c in rule):
        return _spaced_rule(rule, source)
    wildcard = rule.startswith("*.")
    split = split_authority(rule[2:] if wildcard else rule)
    if split is None:
        raise _refuse(text, _host_problem(rule[2:] if wildcard else rule))
    host, port = split
    if wildcard and (not valid_hostname(host) or host.count(".") < 1):
        raise RuleError(f"rule {text!r}: a wildcard must name a domain of at least two labels (*.example.org)")
    return HostRule(text=rule, source=source, host=host, wildcard=wildcard, ports=(port,) if port else WEB_PORTS)


def _spaced_rule(rule: str, source: Source) -> PathRule:
    """A rule with a space: `METHOD URL`, or a host or URL with a space in it (a typo)."""
    first, rest = rule.split(None, 1)
    if first.upper() in KNOWN_METHODS and first != first.upper():
        raise _refuse(rule, f"the method {first!r} must be upper case ({first.upper()})")
    if not _METHOD.match(first):
        if first.isascii() and first.isalpha() and "://" in rest:
            raise _refuse(rule, f"the method {first!r} must be an upper-case word such as GET")
        raise _refuse(rule, f"a space after {first!r}: a host or URL cannot contain spaces")
    url = rest.strip()
    if any(c.isspace() for c in url):
        at = next(i for i, c in enumerate(url) if c.isspace())
        raise _refuse(rule, f"a space in the URL after {url[:at]!r}: a URL cannot contain spaces")
    return _path_rule(rule, first, url, source)


def _host_problem(authority: str) -> str:
    """What is wrong with a host rule that did not parse, in a person's words."""
    if "://" in authority:
        scheme, _, rest = authority.partition("://")
        host = rest.split("/", 1)[0] or "host"
        if scheme.lower() == "https":
            return f"a host rule has no https:// (a tunnel is allowed by host and port): write {host}:443"
        if scheme.lower() == "http" and rest.strip("/") != host:
            return f"a path rule starts with its method: GET {authority}"
        if scheme.lower() == "http":
            return f"a host rule has no http://: write {host}:80 (or {host} for ports 80 and 443)"
        return f"a host rule has no {scheme}://: write {host}[:port]"
    if "/" in authority:
        host = authority.split("/", 1)[0]
        return f"a host rule has no path: write {host}, or GET http://{authority} for plain-HTTP requests below it"
    if authority.startswith("[") or authority.count(":") > 1:
        return "an IPv6 address is written in brackets: [2001:db8::1] or [2001:db8::1]:443"
    host, _, port = authority.partition(":")
    if ":" in authority and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        return f"the port {port!r} is not a number from 1 to 65535"
    return _name_problem(host)


def _name_problem(host: str) -> str:
    if not host:
        return "the host is missing"
    if "*" in host:
        return "a wildcard is written *.example.org (any name below example.org), at the start only"
    bad = next((c for c in host if not (c.isascii() and (c.isalnum() or c in "-_."))), None)
    if bad is not None:
        return f"the host {host!r} contains {bad!r}, which a host name cannot hold"
    if is_noncanonical_ipv4(host):
        return f"{host!r} is not an IPv4 address in dotted form (four numbers: 127.0.0.1)"
    return f"the host {host!r} is not a valid name (labels of letters, digits and inner hyphens, joined by dots)"


def _path_rule(text: str, method: str, url: str, source: Source) -> PathRule:
    if method == "CONNECT":
        raise RuleError(f"rule {text!r}: CONNECT is allowed by host:port rules, not by method rules")
    if "%" in url or "\\" in url:
        raise RuleError(f"rule {text!r}: the URL must not contain % escapes or backslashes")
    try:
        parts = urlsplit(url)
    except ValueError:
        raise _refuse(text, f"the URL {url!r} cannot be parsed") from None
    if parts.scheme != "http":
        raise RuleError(
            f"rule {text!r}: method and path rules apply to plain http:// only "
            "(an https tunnel is opaque: allow its host:443 instead)"
        )
    if "@" in parts.netloc or parts.query or parts.fragment or "?" in url or "#" in url:
        raise RuleError(f"rule {text!r}: the URL must not carry userinfo, a query or a fragment")
    split = split_authority(parts.netloc)
    if split is None:
        problem = f"in the URL, {_host_problem(parts.netloc)}" if parts.netloc else "the URL has no host"
        raise _refuse(text, problem, expected=False)
    host, port = split
    prefix = parts.path or "/"
    if not _PATH.match(prefix) or not clean_path(prefix):
        raise RuleError(f"rule {text!r}: the path prefix must be a plain path without . or .. segments")
    return PathRule(text=text, source=source, method=method, host=host, port=port or 80, prefix=prefix)


def clean_path(path: str) -> bool:
    """No dot segments, no escapes, no backslashes: what a server could read as another path."""
    if "%" in path or "\\" in path:
        return False
    return all(segment not in (".", "..") for segment in path.split("/"))


def parse_presets(names: Iterable[str], what: str = "preset") -> tuple[str, ...]:
    out: list[str] = []
    for raw in names:
        name = raw.strip().lower()
        if not name:
            continue
        if name not in PRESETS:
            raise RuleError(f"{what} {raw.strip()!r} is not one of {', '.join(sorted(PRESETS))}")
        if name not in out:
            out.append(name)
    return tuple(out)


@dataclass(frozen=True)
class RuleSet:
    """The rules in force for one run: the repository's rules and every enabled preset's."""

    rules: tuple[Rule, ...] = ()

    @classmethod
    def build(cls, rules: Iterable[str] = (), presets: Iterable[str] = ()) -> "RuleSet":
        parsed: list[Rule] = [parse_rule(text) for text in rules]
        if len(parsed) > MAX_RULES:
            raise RuleError(f"at most {MAX_RULES} rules")
        for name in parse_presets(presets):
            parsed.extend(parse_rule(text, "preset") for text in PRESETS[name])
        return cls(tuple(parsed))

    def allows_connect(self, host: str, port: int) -> Rule | None:
        """The first host rule that allows a tunnel to host:port."""
        return next((r for r in self.rules if isinstance(r, HostRule) and r.matches(host, port)), None)

    def allows_request(self, method: str, host: str, port: int, path: str) -> Rule | None:
        """The first rule that allows a plain-HTTP request (host rules allow every method and path;
        a path rule only a clean path)."""
        for rule in self.rules:
            if isinstance(rule, HostRule):
                if rule.matches(host, port):
                    return rule
            elif clean_path(path) and rule.matches(method, host, port, path):
                return rule
        return None

    def __bool__(self) -> bool:
        return bool(self.rules)
