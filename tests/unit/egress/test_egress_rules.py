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
        ("exa mple", "a space after 'exa'"),
        ("get http://h.example/", "'get' must be upper case \\(GET\\)"),
        ("Fetch http://h.example/", "upper-case word"),
        ("CONNECT http://h.example/", "host:port rules"),
        ("GET https://h.example/", "plain http:// only"),
        ("GET http://h.example/a?b=1", "query"),
        ("GET http://u@h.example/", "userinfo"),
        ("GET http://h.example/a/../b", "without . or .."),
        ("GET http://h.example/%2e", "% escapes"),
        ("GET http:///x", "has no host"),
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


EXPECTED_FORM = "expected host[:port], *.domain[:port] or METHOD http://host/path-prefix"


@pytest.mark.parametrize(
    ("text", "wrong_part"),
    [
        # A space inside a host or URL is named as such, not read as a method.
        ("https://bad rule", "a space after 'https://bad': a host or URL cannot contain spaces"),
        ("*.exa mple.org", "a space after '*.exa'"),
        ("GET http://mirror.example/deb ian/", "a space in the URL after 'http://mirror.example/deb'"),
        # A scheme or a path on a host rule: the rule it should have been.
        ("https://pypi.org", "a host rule has no https://"),
        ("https://pypi.org", "write pypi.org:443"),
        ("http://mirror.example", "write mirror.example:80"),
        ("http://mirror.example/debian/", "a path rule starts with its method: GET http://mirror.example/debian/"),
        ("pypi.org/simple", "a host rule has no path: write pypi.org"),
        # The host or port that is wrong, by name.
        ("pypi.org:99999", "the port '99999' is not a number from 1 to 65535"),
        ("pypi.org:https", "the port 'https' is not"),
        ("py!pi.org", "the host 'py!pi.org' contains '!'"),
        ("2001:db8::1", "an IPv6 address is written in brackets"),
        ("127.1", "'127.1' is not an IPv4 address in dotted form"),
        ("a.*.example.org", "a wildcard is written *.example.org"),
    ],
)
def test_a_bad_rule_names_its_wrong_part_and_the_expected_form(text: str, wrong_part: str) -> None:
    with pytest.raises(RuleError) as refused:
        parse_rule(text)
    message = str(refused.value)
    assert message.startswith(f"rule {text!r}: "), message
    assert wrong_part in message, message
    assert "method must be" not in message  # the method is named only when it is the wrong part
    assert message.endswith(EXPECTED_FORM), message


def test_a_bad_method_or_url_in_a_path_rule_names_that_part() -> None:
    for text, named in [
        ("get http://mirror.example/", "the method 'get' must be upper case (GET)"),
        ("GET https://mirror.example/", "plain http:// only"),
        ("GET http://mir!ror.example/", "in the URL, the host 'mir!ror.example' contains '!'"),
        ("GET http://mirror.example:0/", "in the URL, the port '0' is not a number from 1 to 65535"),
    ]:
        with pytest.raises(RuleError) as refused:
            parse_rule(text)
        assert named in str(refused.value), refused.value


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
