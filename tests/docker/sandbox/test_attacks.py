"""The attack list of the sandbox issue, each run from inside a real sandbox, each shown to fail.

Every test plays the agent: it runs hostile code through the same API the task runner uses and
checks, from the host's side as well where it can, that nothing got out.
"""

import asyncio
import contextlib
import ipaddress
import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from sandbox import (
    GiB,
    Limits,
    MiB,
    Sandbox,
    SandboxEngine,
    WorkspacePathRefused,
    list_workspace,
    read_workspace_file,
)
from tests.docker.conftest import SpecFactory
from tests.support.waiting import until


class Canary:
    """A TCP listener on every host address; it counts whoever manages to connect."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@pytest.fixture
def canary() -> Iterator[Canary]:
    c = Canary()
    try:
        yield c
    finally:
        c.close()


def host_addresses() -> list[str]:
    """This host's own addresses as seen from a container on a network: the route to the outside."""
    out = {"127.0.0.1"}
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 9))
        out.add(s.getsockname()[0])
    return sorted(out)


def resolver_addresses() -> list[str]:
    with contextlib.suppress(OSError):
        return [
            line.split()[1]
            for line in Path("/etc/resolv.conf").read_text().splitlines()
            if line.startswith("nameserver") and "." in line
        ]
    return []


PROBE = r"""
import json, socket, sys
targets = json.loads(sys.argv[1])
out = {}
for host, port in targets["tcp"]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect((host, port))
        out[f"tcp {host}:{port}"] = "CONNECTED"
    except OSError as e:
        out[f"tcp {host}:{port}"] = type(e).__name__ + ": " + str(e)
    finally:
        s.close()
query = bytes.fromhex("abcd01000001000000000000076578616d706c6503636f6d0000010001")  # A example.com
for host in targets["dns"]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2)
    try:
        s.sendto(query, (host, 53))
        s.recvfrom(512)
        out[f"dns {host}"] = "ANSWERED"
    except OSError as e:
        out[f"dns {host}"] = type(e).__name__ + ": " + str(e)
    finally:
        s.close()
for name in targets["names"]:
    try:
        out[f"resolve {name}"] = "RESOLVED " + str(socket.getaddrinfo(name, 443)[0][4])
    except OSError as e:
        out[f"resolve {name}"] = type(e).__name__ + ": " + str(e)
import os
out["interfaces"] = sorted(os.listdir("/sys/class/net"))
print(json.dumps(out))
"""


@pytest.mark.parametrize("docker_networking", [True, False], ids=["docker-none", "worker-no-docker-networking"])
async def test_no_network_to_host_or_internet(
    engine: SandboxEngine,
    make_spec: SpecFactory,
    tmp_path: Path,
    canary: Canary,
    docker_client: docker.DockerClient,
    docker_networking: bool,
) -> None:
    spec = make_spec() if docker_networking else make_spec(hosts_file=tmp_path / "hosts")
    sandbox = await engine.start(spec)
    try:
        await _probe_network(sandbox, canary, docker_client)
    finally:
        await sandbox.remove()


async def _probe_network(sandbox: Sandbox, canary: Canary, docker_client: docker.DockerClient) -> None:
    ipam = docker_client.networks.get("bridge").attrs["IPAM"]["Config"][0]
    # Older engines leave the gateway out of IPAM: it is the subnet's first address.
    gateway = ipam.get("Gateway") or str(next(ipaddress.ip_network(ipam["Subnet"]).hosts()))
    addresses = [*host_addresses(), gateway]
    targets: dict[str, list[Any]] = {
        "tcp": [
            ["1.1.1.1", 443],
            ["1.1.1.1", 53],
            ["169.254.169.254", 80],
            [gateway, 2375],
            *[[addr, canary.port] for addr in addresses],
        ],
        "dns": ["1.1.1.1", "169.254.169.254", gateway, *resolver_addresses()],
        "names": ["deb.debian.org", "example.com", "host.docker.internal"],
    }
    r = await sandbox.exec(["python3", "-c", PROBE, json.dumps(targets)], timeout=60)
    assert r.exit_code == 0, r
    results = json.loads(r.stdout)
    assert results.pop("interfaces") == ["lo"], "network_mode=none: loopback only"
    assert len(results) == len(targets["tcp"]) + len(targets["dns"]) + len(targets["names"])
    for what, outcome in results.items():
        assert outcome not in ("CONNECTED", "ANSWERED") and not outcome.startswith("RESOLVED"), what
        # No route at all: the attempts fail at once, they do not even leave the container.
        assert "unreachable" in outcome or "gaierror" in outcome or "refused" in outcome, (what, outcome)
    # 127.0.0.1 inside is the container's own loopback: the host's listener saw nobody.
    assert canary.connections == 0
    # The canary itself works, so a connection would have been counted.
    with socket.create_connection(("127.0.0.1", canary.port), timeout=2):
        pass
    await until(lambda: canary.connections, timeout=10, what="the canary to count the connection")
    assert canary.connections == 1


async def test_cannot_write_outside_workspace_and_tmpfs(
    sandbox: Sandbox, docker_client: docker.DockerClient, workspace: Path
) -> None:
    script = (
        "for f in /etc/forgehand /usr/bin/evil /evil /var/tmp/evil /root/evil /opt/evil /run/evil "
        "/sbin/evil /lib/evil /var/lib/evil; do "
        '  if (echo x > "$f") 2>/dev/null; then echo "WROTE $f"; fi; '
        "done; "
        "if (echo h > /proc/sys/kernel/hostname) 2>/dev/null; then echo WROTE-proc; fi; "
        "if (echo 1 > /sys/fs/cgroup/pids/pids.max) 2>/dev/null; then echo WROTE-cgroup; fi; "
        "if (echo 1 > /sys/fs/cgroup/pids.max) 2>/dev/null; then echo WROTE-cgroup2; fi; "
        "if mkdir /newdir 2>/dev/null; then echo WROTE-mkdir; fi; "
        "if touch /etc/passwd 2>/dev/null; then echo WROTE-passwd; fi; "
        "echo ok > /workspace/ok && echo ok > /tmp/ok && echo ok > /home/agent/ok && echo allowed"
    )
    r = await sandbox.exec(["sh", "-c", script])
    assert r.stdout == b"allowed\n", r
    assert (workspace / "ok").read_text() == "ok\n"
    # The engine's own view: nothing changed in the container's root filesystem layer (but the
    # mount point Docker itself makes for its init binary).
    changes = {c["Path"] for c in docker_client.api.diff(sandbox.id) or []}
    assert changes <= {"/usr", "/usr/sbin", "/usr/sbin/docker-init"}, changes


async def test_setuid_binaries_do_not_escalate(sandbox: Sandbox, workspace: Path) -> None:
    # Plant a setuid-root copy of `id` in the workspace (as the host's root could, e.g. from a
    # checkout), and try every setuid route from inside.
    r = await sandbox.exec(["cp", "/usr/bin/id", "/workspace/suid-id"])
    assert r.exit_code == 0
    planted = workspace / "suid-id"
    os.chown(planted, 0, 0)
    planted.chmod(0o4755)
    assert planted.stat().st_mode & 0o4000 and planted.stat().st_uid == 0
    r = await sandbox.exec(["/workspace/suid-id", "-u"])
    assert r.stdout == b"1000\n", "no-new-privileges: the setuid bit is ignored"
    r = await sandbox.exec(["/workspace/suid-id"])
    assert b"euid" not in r.stdout
    # The image ships no setuid or setgid binary at all, and mount gets nowhere.
    r = await sandbox.exec(["sh", "-c", "find / -xdev -perm /6000 -type f 2>/dev/null"])
    assert r.stdout == b""
    r = await sandbox.exec(["sh", "-c", "mount -t tmpfs none /tmp 2>&1; grep NoNewPrivs /proc/self/status"])
    assert b"uid=0" not in r.stdout
    assert b"NoNewPrivs:\t1" in r.stdout
    r = await sandbox.exec(["python3", "-c", "import os; os.setuid(0)"])
    assert r.exit_code != 0 and b"PermissionError" in r.stderr


CAPS = r"""
import ctypes, os, socket, sys
out = {}
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
    out[k] = status[k].strip()
def attempt(name, fn):
    try:
        fn()
        out[name] = "ALLOWED"
    except OSError as e:
        out[name] = type(e).__name__
open("/workspace/f", "w").close()
attempt("chown", lambda: os.chown("/workspace/f", 0, 0))
attempt("chown_other", lambda: os.chown("/workspace/f", 1000, 0))
attempt("raw_socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt("packet_socket", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))
attempt("mknod", lambda: os.mknod("/tmp/null", 0o666 | 0o020000, os.makedev(1, 3)))
attempt("chroot", lambda: os.chroot("/tmp"))
attempt("sethostname", lambda: socket.sethostname("evil"))
libc = ctypes.CDLL(None, use_errno=True)
def mount():
    if libc.mount(b"none", b"/tmp", b"tmpfs", 0, None) != 0:
        raise OSError(ctypes.get_errno(), "mount")
attempt("mount", mount)
def unshare_user():
    if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER: would hand back capabilities in a new namespace
        raise OSError(ctypes.get_errno(), "unshare")
attempt("unshare_user", unshare_user)
print(__import__("json").dumps(out))
"""


async def test_no_capabilities(sandbox: Sandbox) -> None:
    r = await sandbox.exec(["python3", "-c", CAPS])
    assert r.exit_code == 0, r
    out = json.loads(r.stdout)
    for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert out.pop(key) == "0000000000000000", key
    for name, outcome in out.items():
        assert outcome != "ALLOWED", name
    r = await sandbox.exec(["sh", "-c", "mount -t tmpfs none /tmp/x; unshare -r id; chown root /workspace/f"])
    assert r.exit_code != 0 and b"uid=0" not in r.stdout


async def test_fork_bomb_is_contained(engine: SandboxEngine, make_spec: SpecFactory) -> None:
    sb = await engine.start(make_spec())
    async with sb:
        bomb = asyncio.ensure_future(sb.exec(["bash", "-c", ":(){ :|:& };:; sleep 1000"], timeout=6))

        async def pids() -> int:
            stats = await sb.engine_call(lambda c: c.api.stats(sb.id, stream=False, one_shot=True))
            return int(stats["pids_stats"]["current"])

        # While the bomb runs: the container sits at its pids limit, never above it ...
        seen: list[int] = []

        async def at_the_limit() -> bool:
            seen.append(await pids())
            return seen[-1] >= 250

        await until(at_the_limit, timeout=6, what="the bomb to reach the pids limit", show=lambda: seen)
        assert max(seen) >= 250, seen
        assert max(seen) <= 256, seen
        # ... and the host forks as usual.
        t0 = time.monotonic()
        for _ in range(20):
            subprocess.run(["true"], check=True)
        assert time.monotonic() - t0 < 5
        result = await bomb
        assert result.timed_out
        # After the timeout the bomb is gone and the sandbox works again.
        counts: list[int] = []

        async def calm() -> bool:
            counts.append(await pids())
            return counts[-1] <= 3

        await until(calm, timeout=10, what="the bomb's processes to be gone", show=lambda: counts)
        after = counts[-1]
        assert after <= 3
        r = await sb.exec(["echo", "alive"])
        assert r.stdout == b"alive\n"


async def test_memory_hog_is_oom_killed_and_reported(engine: SandboxEngine, make_spec: SpecFactory) -> None:
    sb = await engine.start(make_spec(limits=Limits(memory_bytes=128 * MiB, wall_clock_seconds=120)))
    async with sb:
        r = await sb.exec(["python3", "-c", "a = []\nwhile True: a.append(bytearray(16 << 20))"], timeout=60)
        assert r.oom_killed, r
        assert r.exit_code == 137
        assert not r.timed_out
        # Memory and swap share one limit: the hog could not hide in swap.
        info = await sb.inspect()
        assert info["HostConfig"]["Memory"] == info["HostConfig"]["MemorySwap"] == 128 * MiB
        # Only the hog died; the sandbox goes on, and a normal command is not reported as OOM.
        r = await sb.exec(["python3", "-c", "print(len(bytearray(32 << 20)))"])
        assert r.ok and r.stdout == b"33554432\n"


async def test_disk_filler_stopped_by_tmpfs_size(engine: SandboxEngine, make_spec: SpecFactory) -> None:
    limits = Limits(tmp_bytes=16 * MiB, home_bytes=8 * MiB, shm_bytes=8 * MiB, wall_clock_seconds=120)
    sb = await engine.start(make_spec(limits=limits))
    async with sb:
        for path, cap in (("/tmp/fill", 16 * MiB), ("/home/agent/fill", 8 * MiB), ("/dev/shm/fill", 8 * MiB)):
            r = await sb.exec(["sh", "-c", f"head -c 200M /dev/zero > {path}; echo rc=$?; stat -c %s {path}"])
            out = r.stdout.decode().split()
            assert out[0] != "rc=0", path
            assert b"No space left on device" in r.stderr, path
            assert int(out[1]) <= cap, path
        r = await sb.exec(["sh", "-c", "df -B1 /tmp /home/agent /dev/shm | tail -n +2"])
        sizes = [int(line.split()[1]) for line in r.stdout.decode().splitlines()]
        assert sizes == [16 * MiB, 8 * MiB, 8 * MiB]


async def test_never_ending_command_is_killed_at_the_timeout(sandbox: Sandbox) -> None:
    cases = [
        ["sleep", "1000"],
        ["sh", "-c", "trap '' TERM INT HUP; while :; do :; done"],  # ignores polite signals, spins
        ["sh", "-c", "sleep 1001 & sleep 1002 & wait"],  # children in the same group
        ["sh", "-c", "setsid sleep 1003 & exec sleep 1004"],  # a child in its own session
        ["python3", "-c", "import os, time\nos.setpgid(0, 0)\nos.fork()\ntime.sleep(1005)"],
    ]
    for argv in cases:
        t0 = time.monotonic()
        r = await sandbox.exec(argv, timeout=1)
        elapsed = time.monotonic() - t0
        assert r.timed_out, argv
        assert 0.95 < r.duration < 5 and elapsed < 8, (argv, r.duration, elapsed)
        assert not r.oom_killed
    # Everything those commands started is dead: only init, the idle process and this probe (its
    # wrapper, `timeout`, sh) remain.
    r = await sandbox.exec(["sh", "-c", "for p in /proc/[0-9]*; do tr '\\0\\n' '  ' < $p/cmdline; echo; done"])
    lines = [line for line in r.stdout.decode().splitlines() if line.strip()]
    assert not any("sleep 10" in line or "trap" in line for line in lines), lines
    assert len(lines) <= 5, lines


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def test_one_gigabyte_of_output_is_capped_and_memory_stays_flat(sandbox: Sandbox) -> None:
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, rss_bytes())
            time.sleep(0.01)  # the sampling interval of the measurement, not a wait

    baseline = rss_bytes()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        r = await sandbox.exec(["head", "-c", str(GiB), "/dev/zero"], output_cap=MiB, timeout=120)
    finally:
        stop.set()
        sampler.join()
    assert r.exit_code == 0 and not r.timed_out
    assert len(r.stdout) == MiB
    assert r.truncated_bytes == GiB - MiB
    assert peak - baseline < 48 * MiB, f"host RSS grew by {(peak - baseline) / MiB:.1f} MiB"


async def test_workspace_symlink_to_host_files_is_refused(sandbox: Sandbox, workspace: Path) -> None:
    r = await sandbox.exec(
        [
            "sh",
            "-c",
            "ln -s /etc/shadow /workspace/shadow; ln -s / /workspace/root; ln -s ../../../../etc /workspace/up;"
            "mkfifo /workspace/fifo; ln /etc/passwd /workspace/hard 2>/dev/null || echo no-hardlink",
        ]
    )
    assert r.stdout == b"no-hardlink\n"
    # On the host these links point at the host's files; the host file API must not follow them.
    assert os.readlink(workspace / "shadow") == "/etc/shadow"
    for rel in ("shadow", "root/etc/shadow", "up/shadow", "fifo"):
        with pytest.raises(WorkspacePathRefused):
            read_workspace_file(workspace, rel, 1 << 20)
    kinds = {e.name: e.kind for e in list_workspace(workspace)}
    assert kinds == {"shadow": "symlink", "root": "symlink", "up": "symlink", "fifo": "other"}


async def test_inspect_shows_every_hardening_field(sandbox: Sandbox, workspace: Path) -> None:
    info = await sandbox.inspect()
    hc = info["HostConfig"]
    cfg = info["Config"]
    assert hc["NetworkMode"] == "none"
    assert list(info["NetworkSettings"]["Networks"]) == ["none"]
    assert hc["CapDrop"] == ["ALL"]
    assert not hc["CapAdd"]
    assert hc["SecurityOpt"] == ["no-new-privileges"]
    assert hc["Privileged"] is False
    assert hc["ReadonlyRootfs"] is True
    assert set(hc["Tmpfs"]) == {"/tmp", "/home/agent"}
    assert "size=536870912" in hc["Tmpfs"]["/tmp"]
    assert "size=268435456" in hc["Tmpfs"]["/home/agent"]
    assert hc["PidsLimit"] == 256
    assert hc["Memory"] == hc["MemorySwap"] == 2 * GiB
    assert hc["NanoCpus"] == 1_000_000_000
    assert hc["Init"] is True
    assert cfg["User"] == "1000:1000"
    assert not hc["Binds"]
    assert not hc["Devices"]
    assert not hc.get("VolumesFrom")
    assert hc["IpcMode"] == "private"
    assert hc["LogConfig"]["Type"] == "none"
    assert not hc.get("DeviceCgroupRules")
    # Exactly one mount from the host: the workspace, read-write. No Docker socket, no volume.
    mounts = info["Mounts"]
    assert [(m["Type"], m["Source"], m["Destination"], m["RW"]) for m in mounts] == [
        ("bind", str(workspace), "/workspace", True)
    ]
    assert "docker.sock" not in json.dumps(info)
    labels = cfg["Labels"]
    assert labels["forgehand.instance"] == sandbox.spec.instance
    assert labels["forgehand.task"] == sandbox.spec.task
    assert labels["forgehand.run"] == sandbox.spec.run
    assert "forgehand.weakened" not in labels
    # And inside, the process sees the same.
    r = await sandbox.exec(["sh", "-c", "cat /proc/self/status | grep -E '^(NoNewPrivs|CapEff)'; id -u"])
    assert r.stdout == b"CapEff:\t0000000000000000\nNoNewPrivs:\t1\n1000\n"
