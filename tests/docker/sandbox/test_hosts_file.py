"""A sandbox created without Docker's networking (`SandboxSpec.hosts_file`, what every run, pooled
sandbox and custom tool call of a worker gets): the same isolation as network none, `localhost`
resolving through the hosts file the engine writes, which the agent cannot change."""

import json
from pathlib import Path

import docker
import pytest

from sandbox import HOSTS_FILE_NAME, SandboxEngine, SpecRefused
from sandbox import engine as sandbox_engine
from sandbox.spec import HOSTS_TEXT
from tests.docker.conftest import SpecFactory

PROBE = r"""
import json, os, socket
out = {"interfaces": sorted(os.listdir("/sys/class/net"))}
out["ipv6"] = [open(f"/proc/sys/net/ipv6/conf/{n}/disable_ipv6").read().strip() for n in ("all", "lo")]
out["localhost"] = sorted({a[4][0] for a in socket.getaddrinfo("localhost", 80, proto=socket.IPPROTO_TCP)})
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(1)
with socket.create_connection(("localhost", server.getsockname()[1]), timeout=5) as c:
    c.sendall(b"ping")
    conn, _ = server.accept()
    out["loopback"] = conn.recv(4).decode()
try:
    open("/etc/hosts", "a").write("1.2.3.4 forgehand.example\n")
    out["write"] = "WRITTEN"
except OSError as e:
    out["write"] = type(e).__name__
out["hosts"] = open("/etc/hosts").read()
print(json.dumps(out))
"""


@pytest.mark.parametrize("present", [False, True], ids=["written-by-the-engine", "already-there"])
async def test_without_docker_networking_localhost_resolves_and_nothing_else_is_there(
    engine: SandboxEngine, make_spec: SpecFactory, docker_client: docker.DockerClient, tmp_path: Path, present: bool
) -> None:
    hosts = tmp_path / "channels" / HOSTS_FILE_NAME
    if present:
        hosts.parent.mkdir()
        hosts.write_text(HOSTS_TEXT)
    sb = await engine.start(make_spec(hosts_file=hosts))
    try:
        r = await sb.exec(["python3", "-c", PROBE], timeout=60)
        attrs = docker_client.api.inspect_container(sb.id)
    finally:
        await sb.remove()
    assert r.exit_code == 0, r
    seen = json.loads(r.stdout)
    assert seen["interfaces"] == ["lo"]
    assert seen["ipv6"] == ["1", "1"]  # off, as in Docker's network none
    assert seen["localhost"] == ["127.0.0.1", "::1"]
    assert seen["loopback"] == "ping"
    assert seen["write"] in ("OSError", "PermissionError")  # read-only, whoever asks
    assert seen["hosts"] == HOSTS_TEXT == hosts.read_text()
    assert oct(hosts.stat().st_mode & 0o777) == "0o644"
    assert attrs["Config"].get("NetworkDisabled") is True
    assert attrs["HostConfig"]["NetworkMode"] == "none"
    [mount] = [m for m in attrs["Mounts"] if m["Destination"] == "/etc/hosts"]
    assert mount["Source"] == str(hosts) and mount["RW"] is False
    # Docker made no network sandbox for it: no namespace of its own in the engine's records.
    assert not attrs["NetworkSettings"].get("SandboxKey")


async def test_a_spec_with_docker_networking_has_docker_s_hosts(
    engine: SandboxEngine, make_spec: SpecFactory, docker_client: docker.DockerClient
) -> None:
    """Without a hosts file the sandbox is Docker's network none, as it always was."""
    sb = await engine.start(make_spec())
    try:
        r = await sb.exec(["python3", "-c", PROBE], timeout=60)
        attrs = docker_client.api.inspect_container(sb.id)
    finally:
        await sb.remove()
    seen = json.loads(r.stdout)
    assert seen["interfaces"] == ["lo"] and seen["loopback"] == "ping" and "127.0.0.1" in seen["localhost"]
    assert seen["ipv6"] == ["1", "1"]
    assert not attrs["Config"].get("NetworkDisabled")
    assert attrs["NetworkSettings"].get("SandboxKey")


async def test_a_hosts_file_that_cannot_be_written_refuses_the_sandbox_and_leaves_nothing(
    engine: SandboxEngine, make_spec: SpecFactory, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    (tmp_path / "file").write_text("")
    spec = make_spec(hosts_file=tmp_path / "file" / HOSTS_FILE_NAME)
    with pytest.raises(SpecRefused, match="hosts file") as refused:
        await engine.start(spec)
    assert "FORGEHAND_RUN_CHANNEL_DIR" in str(refused.value)
    assert not docker_client.containers.list(all=True, filters={"label": f"forgehand.run={spec.run}"})


async def test_on_a_kernel_without_ipv6_no_ipv6_sysctl_is_asked_for(
    engine: SandboxEngine,
    make_spec: SpecFactory,
    docker_client: docker.DockerClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A host booted with ipv6.disable=1 has no net.ipv6 sysctls: asking for them would fail every start."""
    monkeypatch.setattr(sandbox_engine, "host_has_ipv6", lambda: False)
    sb = await engine.start(make_spec(hosts_file=tmp_path / HOSTS_FILE_NAME))
    try:
        attrs = docker_client.api.inspect_container(sb.id)
        r = await sb.exec(["getent", "hosts", "localhost"], timeout=30)
    finally:
        await sb.remove()
    assert not attrs["HostConfig"].get("Sysctls") and attrs["Config"].get("NetworkDisabled") is True
    assert r.exit_code == 0 and b"localhost" in r.stdout
