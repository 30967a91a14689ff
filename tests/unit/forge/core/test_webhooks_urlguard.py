"""The URL guard: what may be configured, and which addresses are never connected to."""

import ipaddress

import pytest

from forge.core.errors import InvalidInput
from forge.core.urlguard import AllowList, refusal_reason, validate_url

NONE = AllowList()
LOOPBACK = AllowList.parse("127.0.0.1, localhost")
INVALID, ALLOW = "invalid_hook_url", "host_not_allowed"


def test_https_url_with_path_and_query_is_accepted_unchanged() -> None:
    url = "https://hooks.example.com:8443/forgehand/in?team=a"
    assert validate_url(url, NONE) == url


@pytest.mark.parametrize(
    ("url", "why", "code"),
    [
        ("http://hooks.example.com/x", "must be https", ALLOW),
        ("ftp://hooks.example.com/x", "must be https", INVALID),
        ("https://user:pw@hooks.example.com/x", "userinfo", INVALID),
        ("https://user@hooks.example.com/x", "userinfo", INVALID),
        ("https://hooks.example.com/x#frag", "fragment", INVALID),
        ("https://hooks.example.com/x#", "fragment", INVALID),
        ("https:///x", "host", INVALID),
        ("https://", "host", INVALID),
        ("https://hooks.example.com:99999/", "port", INVALID),
        ("https://hooks.example.com:0/", "port 0", INVALID),
        ("https://localhost/x", "loopback name", ALLOW),
        ("https://api.localhost/x", "loopback name", ALLOW),
        ("https://hooks example.com/", "whitespace", INVALID),
        ("https://hooks.example.com/\n", "whitespace", INVALID),
        ("https://hooks.example.com\\@evil/", "backslash", INVALID),
        ("https://127.0.0.1/", "not a public address \\(loopback\\)", ALLOW),
        ("https://10.1.2.3/", "RFC 1918", ALLOW),
        ("https://169.254.169.254/latest/meta-data", "link-local", ALLOW),
        ("https://100.64.0.1/", "CGNAT", ALLOW),
        ("https://[::1]/", "loopback", ALLOW),
        ("https://[::ffff:127.0.0.1]/", "IPv4-mapped", ALLOW),
        ("https://[::ffff:7f00:1]/", "IPv4-mapped", ALLOW),
        ("https://[64:ff9b::7f00:1]/", "NAT64", ALLOW),
        ("https://[2002:7f00:1::]/", "6to4", ALLOW),
        ("https://[fd00:ec2::254]/", "unique local", ALLOW),
        ("https://[fe80::1%25eth0]/", "zone", INVALID),
        ("https://2130706433/", "non-canonical", INVALID),
        ("https://0177.0.0.1/", "non-canonical", INVALID),
        ("https://0x7f.0.0.1/", "non-canonical", INVALID),
        ("https://0x7f000001/", "non-canonical", INVALID),
        ("https://127.1/", "non-canonical", INVALID),
        ("https://-bad-.example.com/", "not a valid host", INVALID),
        ("https://" + "a" * 2000 + ".com/", "2000", INVALID),
    ],
)
def test_refused_urls(url: str, why: str, code: str) -> None:
    """A URL no allow-list could make good is `invalid_hook_url`; one the allow-list would let pass
    is `host_not_allowed`, and its message says where an instance admin allows the host."""
    with pytest.raises(InvalidInput, match=why) as info:
        validate_url(url, NONE)
    assert info.value.code == code
    if code == ALLOW:
        assert "ask an instance admin to allow" in info.value.detail
        assert "Admin > Network (webhooks)" in info.value.detail


def test_allow_list_exempts_host_from_https_and_address_checks() -> None:
    assert validate_url("http://127.0.0.1:8080/hook", LOOPBACK)
    assert validate_url("http://localhost:8080/hook", LOOPBACK)
    nets = AllowList.parse("10.0.0.0/8,[::1]")
    assert validate_url("http://10.20.30.40/x", nets)
    assert validate_url("http://[::1]:9/x", nets)
    # Allow-listing does not lift userinfo/fragment rules, nor extend to other hosts.
    with pytest.raises(InvalidInput):
        validate_url("http://u@127.0.0.1/x", LOOPBACK)
    with pytest.raises(InvalidInput):
        validate_url("http://127.0.0.2/x", LOOPBACK)
    with pytest.raises(InvalidInput):
        validate_url("http://127.0.0.1.evil.example/x", LOOPBACK)


def test_allow_list_parsing_refuses_garbage() -> None:
    with pytest.raises(ValueError, match="ALLOWED_HOSTS"):
        AllowList.parse("localhost, not a host!")
    assert not AllowList.parse(" , ")
    assert AllowList.parse("LOCALHOST.").allows_host("localhost")


BLOCKED = [
    "0.0.0.0",
    "0.1.2.3",
    "10.0.0.1",
    "100.64.0.1",
    "100.127.255.254",
    "127.0.0.1",
    "127.255.255.254",
    "169.254.169.254",
    "172.16.0.1",
    "172.31.255.255",
    "192.0.0.8",
    "192.0.2.1",
    "192.88.99.1",
    "192.168.1.1",
    "198.18.0.1",
    "198.19.255.255",
    "198.51.100.7",
    "203.0.113.9",
    "224.0.0.1",
    "239.255.255.250",
    "240.0.0.1",
    "255.255.255.255",
    "::",
    "::1",
    "::127.0.0.1",
    "::ffff:127.0.0.1",
    "::ffff:10.0.0.1",
    "::ffff:169.254.169.254",
    "::ffff:8.8.8.8",
    "::ffff:0:7f00:1",
    "64:ff9b::a9fe:a9fe",
    "64:ff9b:1::1",
    "100::1",
    "2001::1",
    "2001:2::1",
    "2001:db8::1",
    "2002:a9fe:a9fe::",
    "2002:0808:0808::",
    "fc00::1",
    "fd00:ec2::254",
    "fe80::1",
    "fec0::1",
    "ff02::1",
    "3fff::1",
]


@pytest.mark.parametrize("address", BLOCKED)
def test_non_global_families_are_refused(address: str) -> None:
    assert refusal_reason(ipaddress.ip_address(address)) is not None


@pytest.mark.parametrize(
    "address", ["8.8.8.8", "1.1.1.1", "93.184.215.14", "2606:4700:4700::1111", "2a00:1450:4001::1"]
)
def test_global_addresses_pass(address: str) -> None:
    assert refusal_reason(ipaddress.ip_address(address)) is None
