"""Egress from inside a real sandbox: no route anywhere but the proxy (relay 127.0.0.1:3128 ->
egress.sock), and the proxy lets through only what the rules and the address check allow, with
pip and curl as a task would use them."""

import asyncio
import contextlib
import ipaddress
import json
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import docker
import pytest

from egress import SOCKET_NAME
from sandbox import EGRESS_PROXY_PORT, Relay, Sandbox, SandboxEngine, write_workspace_file
from tasks.run.egress import proxy_env
from tests.docker.conftest import SpecFactory
from tests.support.egress import origin_server, running_proxy, simple_index, throwaway_ca
from tests.support.waiting import until_sync

# Tries a TCP connection to each "host:port" argument (2 s each) and prints {target: outcome}.
_PROBE = """\
import json, socket, sys
out = {}
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
        out[target] = "connected"
    except OSError as exc:
        out[target] = type(exc).__name__ + ": " + (exc.strerror or str(exc))
print(json.dumps(out))
"""

_RESOLVE = """\
import json, socket, sys
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = sorted({a[4][0] for a in socket.getaddrinfo(name, 443)})
    except OSError as exc:
        out[name] = type(exc).__name__
print(json.dumps(out))
"""


@contextlib.contextmanager
def host_listener() -> Iterator[int]:
    """A listener on every host address: a stand-in for the forge's own port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("0.0.0.0", 0))
    sock.listen(16)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


@contextlib.contextmanager
def other_container(docker_client: docker.DockerClient, image: str) -> Iterator[str]:
    """Another container on Docker's default bridge, listening on 8000; yields its address."""
    argv = ["python3", "-m", "http.server", "8000"]
    c = docker_client.containers.run(image, argv, detach=True, network_mode="bridge", labels={"fh-test": "egress"})
    try:
        c.reload()
        address = str(c.attrs["NetworkSettings"]["IPAddress"])

        def listening() -> bool:  # the sandbox's failure below must not be its
            socket.create_connection((address, 8000), timeout=1).close()
            return True

        until_sync(listening, timeout=30, what="the other container to listen", ignoring=(OSError,))
        yield address
    finally:
        c.remove(force=True)


@contextlib.asynccontextmanager
async def egress_sandbox(engine: SandboxEngine, make_spec: SpecFactory, channel_dir: Path) -> AsyncIterator[Sandbox]:
    spec = make_spec(channel_dir=channel_dir, relays=(Relay(EGRESS_PROXY_PORT, SOCKET_NAME),), env=proxy_env())
    async with await engine.start(spec) as sb:
        yield sb


def bridge_gateway(docker_client: docker.DockerClient) -> str:
    config = docker_client.networks.get("bridge").attrs["IPAM"]["Config"][0]
    # Some engines (Debian's 20.10, docker0 set up by an earlier start) list only the subnet: the
    # gateway is then its first address, as Docker assigns it.
    return str(config.get("Gateway") or ipaddress.ip_network(config["Subnet"])[1])


async def test_no_route_out_but_the_proxy(
    engine: SandboxEngine, make_spec: SpecFactory, channel_dir: Path, docker_client: docker.DockerClient
) -> None:
    gateway = bridge_gateway(docker_client)
    with host_listener() as forge_port, other_container(docker_client, make_spec().image) as neighbour:
        # The listeners answer from the host: the failures below are the sandbox's, not theirs.
        socket.create_connection((gateway, forge_port), timeout=2).close()
        socket.create_connection((neighbour, 8000), timeout=2).close()
        async with (
            running_proxy(channel_dir / SOCKET_NAME, ["pypi.org"]),
            egress_sandbox(engine, make_spec, channel_dir) as sb,
        ):
            targets = [
                f"127.0.0.1:{forge_port}",  # the container's own loopback, not the host's
                f"{gateway}:{forge_port}",  # the Docker bridge's gateway: the host itself
                f"{neighbour}:8000",  # another container
                "1.1.1.1:443",  # a public address
                "169.254.169.254:80",  # cloud metadata
                f"127.0.0.1:{EGRESS_PROXY_PORT}",  # the proxy's relay: the only way out
            ]
            r = await sb.exec(["python3", "-c", _PROBE, *targets])
            outcome = json.loads(r.stdout)
            r = await sb.exec(["python3", "-c", _RESOLVE, "pypi.org", "localhost.localdomain.invalid", "example.com"])
            resolved = json.loads(r.stdout)
            r = await sb.exec(["sh", "-c", "cat /proc/net/route | wc -l; ls /sys/class/net"])
            routes, _, interfaces = r.stdout.decode().partition("\n")
    assert outcome.pop(f"127.0.0.1:{EGRESS_PROXY_PORT}") == "connected"
    assert all(v.startswith(("ConnectionRefusedError", "OSError: Network is unreachable")) for v in outcome.values()), (
        outcome
    )
    assert outcome[f"127.0.0.1:{forge_port}"].startswith("ConnectionRefusedError")
    assert all(v == "gaierror" for v in resolved.values()), resolved
    assert routes.strip() == "1" and interfaces.split() == ["lo"]  # no route table entry, only loopback


@pytest.fixture
def index_files() -> dict[str, bytes]:
    return simple_index("forgehand-probe")


async def test_pip_and_curl_reach_an_allowed_local_index_through_the_proxy(
    engine: SandboxEngine, make_spec: SpecFactory, channel_dir: Path, workspace: Path, index_files: dict[str, bytes]
) -> None:
    ca, server_tls = throwaway_ca()
    write_workspace_file(workspace, "ca.pem", ca.cert_pem.bytes(), max_bytes=1 << 20)
    with origin_server(index_files) as index, origin_server({"/hello": b"over https\n"}, tls=server_tls) as secure:
        rules = [f"127.0.0.1:{index.port}", f"127.0.0.1:{secure.port}"]
        # The test's operator allow-list: 127.0.0.1 stands in for a package index.
        async with (
            running_proxy(channel_dir / SOCKET_NAME, rules, allowed_hosts="127.0.0.1") as rec,
            egress_sandbox(engine, make_spec, channel_dir) as sb,
        ):
            pip = await sb.exec(
                    [
                        "python3", "-m", "pip", "download", "--no-deps", "--no-cache-dir",
                        "--disable-pip-version-check", "--index-url", f"http://127.0.0.1:{index.port}/simple/",
                        "--trusted-host", "127.0.0.1", "--dest", "/workspace/dl", "forgehand-probe",
                    ],
                    timeout=120,
                )  # fmt: skip
            curl = await sb.exec(
                ["curl", "-sS", "--cacert", "/workspace/ca.pem", f"https://127.0.0.1:{secure.port}/hello"]
            )
            listed = await sb.exec(["ls", "/workspace/dl"])
    assert pip.exit_code == 0, pip.stdout + pip.stderr
    assert listed.stdout.decode().split() == ["forgehand_probe-1.0-py3-none-any.whl"]
    assert curl.exit_code == 0 and curl.stdout == b"over https\n", curl.stderr
    # pip asked the proxy in absolute form (plain http), curl through CONNECT (https).
    assert [p for _, p, _ in index.requests] == [
        "/simple/forgehand-probe/",
        "/packages/forgehand_probe-1.0-py3-none-any.whl",
    ]
    assert {(a.method, a.port) for a in rec.allowed} == {("GET", index.port), ("CONNECT", secure.port)}
    assert rec.blocked == []


async def test_refusals_from_inside_the_sandbox(
    engine: SandboxEngine, make_spec: SpecFactory, channel_dir: Path
) -> None:
    answers = {"mirror.internal": ["10.20.30.40"]}

    async def resolver(host: str, port: int) -> list[str]:
        if host in answers:
            return answers[host]
        return [a[4][0] for a in await asyncio.get_running_loop().getaddrinfo(host, port)]

    with origin_server({"/file": b"secret"}) as origin:
        rules = [f"127.0.0.1:{origin.port}", "mirror.internal:443", f"localhost:{origin.port}"]
        async with (
            running_proxy(channel_dir / SOCKET_NAME, rules, resolver=resolver) as rec,
            egress_sandbox(engine, make_spec, channel_dir) as sb,
        ):
            other = await sb.exec(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "http://example.com/"])
            tunnel = await sb.exec(["curl", "-sS", "https://example.com/"])
            private = await sb.exec(["curl", "-sS", "https://mirror.internal/"])
            loopback = await sb.exec(
                ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", f"http://localhost:{origin.port}/file"]
            )
            smuggled = await sb.exec(
                ["python3", "-c", _SMUGGLE, str(EGRESS_PROXY_PORT), f"127.0.0.1:{origin.port}", "example.com"]
            )
    assert other.stdout == b"403"
    assert tunnel.exit_code != 0 and b"403" in tunnel.stderr  # curl: CONNECT tunnel failed, response 403
    assert private.exit_code != 0 and b"403" in private.stderr
    assert loopback.stdout == b"403"  # loopback needs the operator's allow-list, a rule is not enough
    assert smuggled.stdout.startswith(b"HTTP/1.1 400"), smuggled.stdout
    assert origin.requests == []
    assert [(b.host, b.method, b.rules) for b in rec.blocked] == [
        ("example.com", "GET", "allow-list"),
        ("example.com", "CONNECT", "allow-list"),
        ("mirror.internal", "CONNECT", "address"),
        ("localhost", "GET", "address"),
        ("127.0.0.1", "GET", "request"),
    ]
    assert "10.20.30.40" in rec.blocked[2].reason
    assert rec.allowed == []


# Sends one proxy request whose absolute URL names HOST_A and whose Host header names HOST_B.
_SMUGGLE = """\
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
head = "GET http://%s/file HTTP/1.1\\r\\nHost: %s\\r\\nConnection: close\\r\\n\\r\\n"
s.sendall((head % (sys.argv[2], sys.argv[3])).encode())
data = b""
while chunk := s.recv(65536):
    data += chunk
sys.stdout.write(data.decode())
"""
