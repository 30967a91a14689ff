"""Egress rules, presets and the operator's allow-list: what parses, what each rule allows, and
that every refusal names the rule it could not read."""

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from egress import PRESETS, AllowedHosts, RuleError, RuleSet, parse_presets, parse_rule
from egress.rules import HostRule, PathRule, clean_path, split_authority


def test_host_rules() -> None:
    rules = RuleSet.build(["pypi.org", "files.example.org:8443", "[2001:db8::1]:443", "10.0.0.5:80", "Upper.Example."])
    assert rules.allows_connect("pypi.org", 443) is not None
    assert rules.allows_connect("pypi.org", 80) is not None  # no port: the web ports
    assert rules.allows_connect("pypi.org", 22) is None
    assert rules.allows_connect("evil.pypi.org", 443) is None  # a name is exact
    assert rules.allows_connect("files.example.org", 8443) is not None
    assert rules.allows_connect("files.example.org", 443) is None
    assert rules.allows_connect("2001:db8::1", 443) is not None
    assert rules.allows_connect("10.0.0.5", 80) is not None
    assert rules.allows_connect("upper.example", 443) is not None  # compared lower-case, no trailing dot
    # Host rules allow plain HTTP too, any method and path.
    assert rules.allows_request("DELETE", "pypi.org", 80, "/anything/../x") is not None


def test_wildcards_match_subdomains_only() -> None:
    rules = RuleSet.build(["*.example.org:443"])
    assert rules.allows_connect("a.example.org", 443) is not None
    assert rules.allows_connect("a.b.example.org", 443) is not None
    assert rules.allows_connect("example.org", 443) is None
    assert rules.allows_connect("badexample.org", 443) is None
    assert rules.allows_connect("a.example.org.evil", 443) is None
    with pytest.raises(RuleError, match="at least two labels"):
        parse_rule("*.org")


def test_method_and_path_rules() -> None:
    rule = parse_rule("GET http://mirror.example/debian/")
    assert isinstance(rule, PathRule) and (rule.method, rule.host, rule.port, rule.prefix) == (
        "GET",
        "mirror.example",
        80,
        "/debian/",
    )
    rules = RuleSet((rule,))
    assert rules.allows_request("GET", "mirror.example", 80, "/debian/dists/Release") is rule
    assert rules.allows_request("HEAD", "mirror.example", 80, "/debian/x") is None
    assert rules.allows_request("GET", "mirror.example", 8080, "/debian/x") is None
    assert rules.allows_request("GET", "mirror.example", 80, "/other") is None
    assert rules.allows_request("GET", "mirror.example", 80, "/debian/../etc") is None
    assert rules.allows_request("GET", "mirror.example", 80, "/debian/%2e%2e/etc") is None
    assert rules.allows_connect("mirror.example", 80) is None  # a tunnel is opaque
    assert parse_rule("POST http://h.example:8080").port == 8080  # type: ignore[union-attr]
    assert parse_rule("POST http://h.example:8080").prefix == "/"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "1 to 300"),
        ("x" * 301, "1 to 300"),
        ("exa mple", "upper-case word"),
        ("get http://h.example/", "upper-case word"),
        ("CONNECT http://h.example/", "host:port rules"),
        ("GET https://h.example/", "plain http:// only"),
        ("GET http://h.example/a?b=1", "query"),
        ("GET http://u@h.example/", "userinfo"),
        ("GET http://h.example/a/../b", "without . or .."),
        ("GET http://h.example/%2e", "% escapes"),
        ("GET http:///x", "no valid host"),
        ("h.example:0", "expected host\\[:port\\]"),
        ("h.example:70000", "expected host\\[:port\\]"),
        ("h.example:http", "expected host\\[:port\\]"),
        ("2001:db8::1", "expected host\\[:port\\]"),  # a bare IPv6 address needs brackets
        ("127.1", "expected host\\[:port\\]"),  # a non-canonical IPv4 spelling
        ("-bad-.example", "expected host\\[:port\\]"),
        ("*", "expected host\\[:port\\]"),
    ],
)
def test_bad_rules_name_themselves(text: str, why: str) -> None:
    with pytest.raises(RuleError, match=why):
        parse_rule(text)


def test_presets_are_the_real_hosts() -> None:
    rules = RuleSet.build([], ["pypi", "npm", "debian"])
    assert all(r.source == "preset" for r in rules.rules)
    for host, port in [
        ("pypi.org", 443),
        ("files.pythonhosted.org", 443),
        ("registry.npmjs.org", 443),
        ("deb.debian.org", 80),
        ("security.debian.org", 443),
    ]:
        assert rules.allows_connect(host, port) is not None, host
    assert rules.allows_connect("pypi.org", 80) is None
    assert sorted(PRESETS) == ["debian", "npm", "pypi"]
    assert parse_presets(["PyPI", " npm", "pypi", ""]) == ("pypi", "npm")
    with pytest.raises(RuleError, match="'cargo' is not one of debian, npm, pypi"):
        parse_presets(["cargo"])


def test_rule_count_is_bounded() -> None:
    with pytest.raises(RuleError, match="at most 200"):
        RuleSet.build([f"h{i}.example" for i in range(201)])


def test_allowed_hosts() -> None:
    allowed = AllowedHosts.parse("127.0.0.1, index.test:8080, 10.1.0.0/16, [fd00::5]:443, Mirror.Example")
    ip = ipaddress.ip_address
    assert allowed.exempts_address(ip("127.0.0.1"), 1)
    assert allowed.exempts_address(ip("10.1.200.3"), 443) and not allowed.exempts_address(ip("10.2.0.1"), 443)
    assert allowed.exempts_address(ip("fd00::5"), 443) and not allowed.exempts_address(ip("fd00::5"), 80)
    assert allowed.exempts_name("index.test", 8080) and not allowed.exempts_name("index.test", 80)
    assert allowed.exempts_name("mirror.example", 443)
    assert not AllowedHosts.parse("")
    with pytest.raises(RuleError, match="FORGEHAND_EGRESS_ALLOWED_HOSTS: 'not a host'"):
        AllowedHosts.parse("ok.example, not a host")


def test_clean_path() -> None:
    assert clean_path("/simple/pkg/")
    for bad in ("/a/../b", "/a/./b", "/..", "/a%2fb", "/a\\b"):
        assert not clean_path(bad)


@given(st.integers(1, 65535), st.sampled_from(["pypi.org", "10.0.0.1", "[::1]", "A.Example."]))
def test_authority_round_trip(port: int, host: str) -> None:
    split = split_authority(f"{host}:{port}")
    assert split is not None and split[1] == port
    again = split_authority(f"[{split[0]}]:{port}" if ":" in split[0] else f"{split[0]}:{port}")
    assert again == split


@given(st.text(max_size=60))
def test_parse_rule_never_crashes(text: str) -> None:
    try:
        rule = parse_rule(text)
    except RuleError:
        return
    assert isinstance(rule, HostRule | PathRule)
