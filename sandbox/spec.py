"""The sandbox spec and the one function that turns it into Docker create arguments.

Every hardening default lives in `container_create_kwargs`. The only way to loosen one is a field of
`Weakenings`, which an admin sets per repository and the task page shows (`weakenings_in_effect`).
Limits can be tuned (they are numbers that must stay positive), never switched off.
"""

import re
from pathlib import Path
from typing import Any

import msgspec

from .errors import SpecRefused

MiB = 1024 * 1024
GiB = 1024 * MiB

# Labels that name a container's owner, so that any container can be found and reaped after a crash.
LABEL_INSTANCE = "forgehand.instance"
LABEL_TASK = "forgehand.task"
LABEL_RUN = "forgehand.run"
LABEL_WEAKENED = "forgehand.weakened"
LABEL_POOL = "forgehand.pool"
OWN_LABEL_PREFIX = "forgehand."

SANDBOX_UID = 1000
SANDBOX_GID = 1000
SANDBOX_USER = f"{SANDBOX_UID}:{SANDBOX_GID}"
WORKSPACE_DIR = "/workspace"
HOME_DIR = "/home/agent"
# The run's channel to forgehand (docs/design.md, "The run's channel"): a host directory of Unix sockets, mounted
# read-only. Sockets need no network namespace; connect() works on a read-only mount.
CHANNEL_DIR = "/run/forgehand"
# Loopback ports the sandbox relays to the channel's sockets (see `Relay`): the gateway (the model
# API for CLIs that need a TCP base URL, /mcp for every CLI) and the egress proxy (HTTP(S)_PROXY).
GATEWAY_RELAY_PORT = 4100
EGRESS_PROXY_PORT = 3128
# /etc/hosts of a sandbox Docker sets no network up for (`SandboxSpec.hosts_file`): what Docker
# writes there for a container of network none. Without it `localhost` would not resolve.
HOSTS_PATH = "/etc/hosts"
HOSTS_FILE_NAME = "hosts"  # its name beside the run channel directories (their sweep skips files)
# What Docker's network none sets that runc's own namespace would not: IPv6 off, loopback's ::1
# included, so that a sandbox without Docker's networking behaves as one of network none.
NO_IPV6 = {f"net.ipv6.conf.{name}.disable_ipv6": "1" for name in ("all", "default", "lo")}
HOSTS_TEXT = (
    "127.0.0.1\tlocalhost\n"
    "::1\tlocalhost ip6-localhost ip6-loopback\n"
    "fe00::0\tip6-localnet\n"
    "ff00::0\tip6-mcastprefix\n"
    "ff02::1\tip6-allnodes\n"
    "ff02::2\tip6-allrouters\n"
)

_LABEL_VALUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@+-]{0,127}$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_CAPABILITY = re.compile(r"^(CAP_)?[A-Z][A-Z_]{1,30}$")
_NUMERIC_USER = re.compile(r"^\d{1,10}:\d{1,10}$")
_SOCKET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_NETWORK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# Network modes that share a namespace with the host or another container: refused even when the
# network is opted in, because they reach the host's loopback (the forge itself, the Docker API...).
_NEVER_NETWORKS = {"host"}


class Limits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Resource limits. All enforced by the kernel (cgroups, tmpfs size) or by the idle process."""

    pids: int = 256
    memory_bytes: int = 2 * GiB  # memswap is set to the same value: no swap to hide in
    nano_cpus: int = 1_000_000_000  # one CPU
    tmp_bytes: int = 512 * MiB  # tmpfs /tmp
    home_bytes: int = 256 * MiB  # tmpfs /home/agent
    shm_bytes: int = 64 * MiB  # /dev/shm (private IPC namespace)
    # The workspace: a quota mount's own size is its limit (prepare_workspace(limit_bytes=...)); on a
    # plain directory the sandbox's watchdog ends at this (see quota.py: it cannot stop a burst).
    workspace_bytes: int = GiB
    wall_clock_seconds: int = 3600  # the whole sandbox; the idle process exits then, and the container with it
    exec_timeout_seconds: float = 600.0  # default per exec
    output_cap_bytes: int = 4 * MiB  # default per exec (stdout + stderr)


class Relay(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A TCP listener on 127.0.0.1:`port` inside the container (its own loopback: network none keeps
    one) that forwards each connection to the channel socket `socket` (a file name in CHANNEL_DIR).

    For clients that only speak TCP (a proxy URL, a model base URL). The sandbox starts every relay
    right after the container starts, before any other command, as the sandbox user.
    """

    port: int
    socket: str

    @property
    def socket_path(self) -> str:
        return f"{CHANNEL_DIR}/{self.socket}"


class Weakenings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Explicit opt-ins that loosen the defaults. All off. Each one is listed by `weakenings_in_effect`."""

    network: bool = False  # allow `SandboxSpec.network` to name a Docker network (never "host")
    cap_add: tuple[str, ...] = ()  # capabilities given back after cap_drop=ALL
    new_privileges: bool = False  # drop `no-new-privileges` (setuid binaries work again)
    writable_root: bool = False  # root filesystem writable (writes land in the container layer)
    user: str | None = None  # run as another numeric "uid:gid" (e.g. "0:0") instead of 1000:1000


class SandboxSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What one sandbox is: image, workspace, environment, owner labels, limits, network, weakenings."""

    image: str
    workspace: Path  # host directory, bind-mounted read-write at /workspace
    instance: str
    task: str
    run: str
    env: dict[str, str] = msgspec.field(default_factory=dict)
    limits: Limits = msgspec.field(default_factory=Limits)
    network: str = "none"
    weaken: Weakenings = msgspec.field(default_factory=Weakenings)
    extra_labels: dict[str, str] = msgspec.field(default_factory=dict)
    pool: str = ""  # set by SandboxPool on the containers it starts ahead of time
    # Host directory of the run's sockets (model gateway, hook bridge...), mounted read-only at
    # CHANNEL_DIR; None: no channel (the command runtime, the builtin runtime's tool sandbox).
    channel_dir: Path | None = None
    # Loopback relays to sockets in the channel directory (needs `channel_dir`), started before any
    # other command; a relay that cannot start fails the sandbox's start.
    relays: tuple[Relay, ...] = ()
    # A host file holding HOSTS_TEXT (the engine writes it unless it is exactly that: hosts.py),
    # mounted read-only at /etc/hosts. With it, a sandbox of network none is created without Docker's networking
    # (`network_disabled`): runc still gives the container a network namespace of its own with
    # loopback only, as network none does, but dockerd sets up no network sandbox for it (no
    # libnetwork, no hook re-executing dockerd), which halves the CPU and the time of a start.
    # Docker then writes no /etc/hosts, hence this file. None: Docker's network none.
    hosts_file: Path | None = None

    @property
    def user(self) -> str:
        return self.weaken.user or SANDBOX_USER

    def labels(self) -> dict[str, str]:
        labels = {LABEL_INSTANCE: self.instance, LABEL_TASK: self.task, LABEL_RUN: self.run}
        if self.pool:
            labels[LABEL_POOL] = self.pool
        return labels


def weakenings_in_effect(spec: SandboxSpec) -> list[str]:
    """Human-readable list of every default this spec loosens (empty when fully hardened)."""
    w = spec.weaken
    out: list[str] = []
    if spec.network != "none":
        out.append(f"network: {spec.network}")
    out.extend(f"capability: {cap.removeprefix('CAP_')}" for cap in w.cap_add)
    if w.new_privileges:
        out.append("new privileges allowed (setuid binaries work)")
    if w.writable_root:
        out.append("writable root filesystem")
    if w.user is not None and w.user != SANDBOX_USER:
        out.append(f"user: {w.user}")
    return out


def validate_spec(spec: SandboxSpec) -> None:
    """Raise SpecRefused for anything malformed or loosened without its opt-in."""
    _validate_paths(spec)
    _validate_hosts_file(spec)
    _validate_relays(spec)
    _validate_labels_and_env(spec)
    _validate_limits(spec.limits)
    _validate_weakenings(spec)


def _validate_paths(spec: SandboxSpec) -> None:
    if not spec.image or any(ch.isspace() for ch in spec.image):
        raise SpecRefused(f"bad image reference {spec.image!r}")
    ws = Path(spec.workspace)
    if not ws.is_absolute():
        raise SpecRefused(f"workspace must be an absolute host path, got {str(ws)!r}")
    if spec.channel_dir is not None:
        channel = Path(spec.channel_dir)
        if not channel.is_absolute():
            raise SpecRefused(f"channel_dir must be an absolute host path, got {str(channel)!r}")
        if channel.resolve() == ws.resolve():
            raise SpecRefused("channel_dir may not be the workspace")


def _validate_labels_and_env(spec: SandboxSpec) -> None:
    for name, value in (("instance", spec.instance), ("task", spec.task), ("run", spec.run)):
        if not _LABEL_VALUE.match(value):
            raise SpecRefused(f"label {name}={value!r} must match {_LABEL_VALUE.pattern}")
    if spec.pool and not _LABEL_VALUE.match(spec.pool):
        raise SpecRefused(f"pool id {spec.pool!r} must match {_LABEL_VALUE.pattern}")
    for key, value in spec.extra_labels.items():
        if key.startswith(OWN_LABEL_PREFIX):
            raise SpecRefused(f"extra label {key!r} may not use the reserved {OWN_LABEL_PREFIX!r} prefix")
        if "\x00" in key or "\x00" in value:
            raise SpecRefused("labels may not contain NUL")
    for key, value in spec.env.items():
        if not _ENV_KEY.match(key):
            raise SpecRefused(f"environment name {key!r} is not a plain identifier")
        if "\x00" in value:
            raise SpecRefused(f"environment value of {key} contains NUL")


def _validate_limits(lim: Limits) -> None:
    positive = {
        "pids": lim.pids,
        "memory_bytes": lim.memory_bytes,
        "nano_cpus": lim.nano_cpus,
        "tmp_bytes": lim.tmp_bytes,
        "home_bytes": lim.home_bytes,
        "shm_bytes": lim.shm_bytes,
        "workspace_bytes": lim.workspace_bytes,
        "wall_clock_seconds": lim.wall_clock_seconds,
        "exec_timeout_seconds": lim.exec_timeout_seconds,
        "output_cap_bytes": lim.output_cap_bytes,
    }
    for limit_name, amount in positive.items():
        # A zero or negative value would mean "unlimited" to Docker for some of these.
        if not amount > 0:
            raise SpecRefused(f"limit {limit_name} must be positive, got {amount!r}")
    if lim.pids < 8:
        raise SpecRefused("limit pids must be at least 8 (init, the idle process and an exec need room)")
    if lim.memory_bytes < 6 * MiB:
        raise SpecRefused("limit memory_bytes must be at least 6 MiB (Docker's minimum)")


def _validate_weakenings(spec: SandboxSpec) -> None:
    if spec.network != "none":
        if spec.network in _NEVER_NETWORKS or spec.network.startswith("container:"):
            raise SpecRefused(f"network mode {spec.network!r} shares a namespace and is never allowed")
        if not spec.weaken.network:
            raise SpecRefused(f"network {spec.network!r} needs the explicit `weaken.network` opt-in")
        if not _NETWORK_NAME.match(spec.network):
            raise SpecRefused(f"bad network name {spec.network!r}")
    for cap in spec.weaken.cap_add:
        if cap.upper() in {"ALL", "CAP_ALL"} or not _CAPABILITY.match(cap):
            raise SpecRefused(f"capability {cap!r}: name each capability explicitly")
    if spec.weaken.user is not None and not _NUMERIC_USER.match(spec.weaken.user):
        # A name would be resolved through the image's /etc/passwd, which the image author controls.
        raise SpecRefused(f"user must be numeric uid:gid, got {spec.weaken.user!r}")


def _validate_hosts_file(spec: SandboxSpec) -> None:
    if spec.hosts_file is not None and (not spec.hosts_file.is_absolute() or ".." in spec.hosts_file.parts):
        raise SpecRefused(f"hosts_file {str(spec.hosts_file)!r} must be an absolute path without '..'")


def without_docker_network(spec: SandboxSpec) -> bool:
    """True when the sandbox is created without Docker's networking (see `SandboxSpec.hosts_file`)."""
    return spec.network == "none" and spec.hosts_file is not None


def _validate_relays(spec: SandboxSpec) -> None:
    if spec.relays and spec.channel_dir is None:
        raise SpecRefused("relays need a channel_dir (they forward to its sockets)")
    seen: set[int] = set()
    for relay in spec.relays:
        # Unprivileged ports only: the relay runs as the sandbox user, without capabilities.
        if not 1024 <= relay.port <= 65535:
            raise SpecRefused(f"relay port {relay.port!r} must be between 1024 and 65535")
        if relay.port in seen:
            raise SpecRefused(f"two relays listen on port {relay.port}")
        seen.add(relay.port)
        if not _SOCKET_NAME.match(relay.socket) or ".." in relay.socket:
            raise SpecRefused(f"relay socket {relay.socket!r} must be a plain file name in the channel directory")


def container_create_kwargs(spec: SandboxSpec, *, name: str | None = None, ipv6: bool = True) -> dict[str, Any]:
    """Keyword arguments for `docker.DockerClient.containers.create` with the hardened defaults.
    `ipv6`: the engine's kernel has IPv6 (its `net.ipv6` sysctls exist, so they can be set)."""
    validate_spec(spec)
    lim = spec.limits
    w = spec.weaken
    env = {"HOME": HOME_DIR, "USER": "agent", "LANG": "C.UTF-8", **spec.env}
    kwargs: dict[str, Any] = {
        "image": spec.image,
        # The idle process. Its exit at the wall clock ends the container even if the forge is gone.
        "command": ["sleep", str(int(lim.wall_clock_seconds))],
        "entrypoint": [],
        "detach": True,
        "init": True,  # docker-init reaps zombies and forwards SIGTERM on stop
        "user": spec.user,
        "working_dir": WORKSPACE_DIR,
        "hostname": "sandbox",
        "environment": env,
        "labels": _labels(spec),
        "network_mode": spec.network,
        "network_disabled": without_docker_network(spec),
        "cap_drop": ["ALL"],
        "security_opt": [] if w.new_privileges else ["no-new-privileges"],
        "privileged": False,
        "read_only": not w.writable_root,
        "tmpfs": _tmpfs(spec),
        "mounts": _mounts(spec),
        "pids_limit": lim.pids,
        "mem_limit": lim.memory_bytes,
        "memswap_limit": lim.memory_bytes,
        "nano_cpus": lim.nano_cpus,
        "shm_size": lim.shm_bytes,
        "ipc_mode": "private",
        # PID 1 runs as the agent's uid, so the agent could write to its stdout; with a logging
        # driver that would fill the host's disk. Nothing useful is logged there anyway.
        "log_config": {"Type": "none", "Config": {}},
        "ulimits": [{"Name": "core", "Soft": 0, "Hard": 0}],
        "stdin_open": False,
        "tty": False,
    }
    if without_docker_network(spec) and ipv6:  # without IPv6 in the kernel there is nothing to turn off
        kwargs["sysctls"] = dict(NO_IPV6)
    if w.cap_add:
        kwargs["cap_add"] = [cap.upper().removeprefix("CAP_") for cap in w.cap_add]
    if name is not None:
        kwargs["name"] = name
    return kwargs


def _labels(spec: SandboxSpec) -> dict[str, str]:
    labels = {**spec.extra_labels, **spec.labels()}
    loosened = weakenings_in_effect(spec)
    if loosened:
        labels[LABEL_WEAKENED] = "; ".join(loosened)
    return labels


def _tmpfs(spec: SandboxSpec) -> dict[str, str]:
    # noexec is Docker's default for tmpfs; written out so nobody reads these as executable. It
    # stops little (/workspace is executable, it has to be), but nothing runs from scratch space.
    lim = spec.limits
    uid, _, gid = spec.user.partition(":")
    return {
        "/tmp": f"rw,noexec,nosuid,nodev,size={lim.tmp_bytes},mode=1777",  # noqa: S108 (a path in the container)
        HOME_DIR: f"rw,noexec,nosuid,nodev,size={lim.home_bytes},uid={uid},gid={gid},mode=0700",
    }


def _mounts(spec: SandboxSpec) -> list[dict[str, Any]]:
    # The only host paths the container sees: the workspace and (read-only) the run's channel
    # directory. No Docker socket, no other binds, no volumes.
    workspace = {
        "Target": WORKSPACE_DIR,
        "Source": str(spec.workspace),
        "Type": "bind",
        "ReadOnly": False,
        "BindOptions": {"Propagation": "rprivate"},
    }
    return [workspace, *_channel_mount(spec), *_hosts_mount(spec)]


def _hosts_mount(spec: SandboxSpec) -> list[dict[str, Any]]:
    if not without_docker_network(spec):
        return []
    source = str(spec.hosts_file)
    return [
        {
            "Target": HOSTS_PATH,
            "Source": source,
            "Type": "bind",
            "ReadOnly": True,
            "BindOptions": {"Propagation": "rprivate"},
        }
    ]


def _channel_mount(spec: SandboxSpec) -> list[dict[str, Any]]:
    if spec.channel_dir is None:
        return []
    return [
        {
            "Target": CHANNEL_DIR,
            "Source": str(spec.channel_dir),
            "Type": "bind",
            "ReadOnly": True,
            "BindOptions": {"Propagation": "rprivate"},
        }
    ]
