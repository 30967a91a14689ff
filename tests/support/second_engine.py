"""A second Docker engine on this machine: the stand-in for a second Docker host.

Why: workers run their sandboxes on the engine they are given (`TaskWorker(engine=SandboxEngine(
base_url=...))`), and a deployment may spread its workers over several Docker hosts. A test of that
needs an engine that shares nothing with the first one but the kernel and the file system: its own
socket, data root (images, containers, volumes), exec root (its own managed containerd, runc state,
network namespaces), pidfile, bridge and log. `start_second_engine` starts that dockerd, or reuses
the one it started before when it still answers, makes sure the images a task needs are on it, and
returns where it listens (`Ready.docker_host`); `stop_second_engine` ends it. It is left running at
the end of a test session, so that the next session finds it (and its images) at once.

The command line (`SecondEngine.command`), with the defaults:

    dockerd --host unix:///run/forgehand-dockerd2/docker.sock
            --data-root /var/lib/forgehand-dockerd2 --exec-root /run/forgehand-dockerd2/exec
            --pidfile /run/forgehand-dockerd2/docker.pid
            --config-file /run/forgehand-dockerd2/daemon.json
            --bridge fh-docker2 --iptables=false --ip-forward=false
            --containerd-namespace forgehand-dockerd2
            --containerd-plugins-namespace forgehand-dockerd2-plugins

- `--config-file`: an empty one of its own, so that the first engine's /etc/docker/daemon.json is not
  read (a `hosts`, `bip` or `data-root` there would clash with the flags, or be shared).
- The containerd namespaces: a dockerd uses a system containerd (/run/containerd/containerd.sock)
  when one runs instead of starting its own; both engines would then share it, and must not share
  its namespaces.
- `--bridge fh-docker2`: the default bridge must not be the first engine's docker0 (`--bip` alone
  would take docker0 over). dockerd creates only docker0 itself, so the bridge is made here first
  (`ip link add fh-docker2 type bridge`, address 172.29.0.1/24, up); dockerd takes its subnet from
  the bridge's address (`--bip` and `--bridge` are exclusive).
- `--iptables=false`: a dockerd with iptables on begins by deleting the DOCKER and
  DOCKER-ISOLATION-STAGE-1/2 chains and rebuilding them for its own bridges only (libnetwork's
  `removeIPChains`): the first engine's rules (its published ports, the isolation of its networks)
  would vanish under its running containers. With it off, the second engine leaves the host's
  firewall alone: the first engine's rules stay byte for byte the same. Its containers get no NAT
  and, past the host's FORWARD policy (DROP, the first engine's), no route off the host: none is
  wanted here. The host itself (any of its addresses) stays reachable from them, as from the first
  engine's, and they from the host. Because br_netfilter is loaded (the first engine loads it),
  frames between two containers on one bridge go through FORWARD too, so the one rule dockerd
  would add for its bridge is added here (and removed by `stop_second_engine`):
  `iptables -A FORWARD -i fh-docker2 -o fh-docker2 -j ACCEPT`. Without iptables, an `--internal`
  network of the second engine gets no DROP rules (its containers still have no way off the host).
- `--ip-forward=false`: the sysctl is the first engine's business.

Sandboxes need none of the bridge: they run with network none and reach the host's 127.0.0.1
services (the run's model gateway, its egress proxy) through Unix sockets in the run's channel
directory, a read-only bind mount relayed to 127.0.0.1 ports inside the container (sandbox/spec.py,
tasks/run/egress.py). A bind mount names a path on this host, which both engines share (same mount
namespace: dockerd is started from here), so it works on the second engine unchanged.

Images: `ensure_images` copies each image that is missing there, or there under another id (it was
rebuilt on the first engine since), with `docker save | docker --host <second> load` (10 to 20 s
for the 293 MB sandbox image on the development machine; nothing when all are there). A cold start of
dockerd answers in about half a second, a running one in a hundredth.

pytest-xdist workers each ask for it: a file lock (/tmp/forgehand-dockerd2.lock) makes one start
and load while the others wait, then find it running. dockerd, `ip` and `iptables` need root: run
as root, or with passwordless sudo (each privileged command is then run through `sudo -n`).
"""

import contextlib
import fcntl
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

from sandbox import DEFAULT_IMAGE
from tests.support.waiting import until_sync

LOG_TAIL_LINES = 30


@dataclass(frozen=True)
class SecondEngine:
    """Where the second engine lives; every path is derived from `name`."""

    name: str = "forgehand-dockerd2"
    bridge: str = "fh-docker2"  # at most 15 characters (an interface name)
    bridge_address: str = "172.29.0.1/24"  # the bridge's (and the engine's gateway) address and subnet

    @property
    def run_dir(self) -> Path:
        return Path("/run") / self.name

    @property
    def data_root(self) -> Path:
        return Path("/var/lib") / self.name

    @property
    def exec_root(self) -> Path:
        return self.run_dir / "exec"

    @property
    def socket(self) -> Path:
        return self.run_dir / "docker.sock"

    @property
    def pidfile(self) -> Path:
        return self.run_dir / "docker.pid"

    @property
    def config_file(self) -> Path:
        return self.run_dir / "daemon.json"

    @property
    def log_path(self) -> Path:
        return Path("/tmp") / f"{self.name}.log"

    @property
    def lock_path(self) -> Path:
        return Path("/tmp") / f"{self.name}.lock"

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket}"

    def command(self) -> list[str]:
        return [
            "dockerd",
            "--host",
            self.docker_host,
            "--data-root",
            str(self.data_root),
            "--exec-root",
            str(self.exec_root),
            "--pidfile",
            str(self.pidfile),
            "--config-file",
            str(self.config_file),
            "--bridge",
            self.bridge,
            "--iptables=false",
            "--ip-forward=false",
            "--containerd-namespace",
            self.name,
            "--containerd-plugins-namespace",
            f"{self.name}-plugins",
        ]

    def forward_rule(self) -> list[str]:
        return ["FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT"]


SECOND_ENGINE = SecondEngine()


@dataclass(frozen=True)
class Ready:
    """The second engine, answering, with the images asked for."""

    docker_host: str
    pid: int
    reused: bool  # it was running already
    start_seconds: float  # from the call to its first answer (the health check when reused)
    loaded: tuple[str, ...]  # the images copied to it now
    load_seconds: float

    def describe(self) -> str:
        how = "reused" if self.reused else "started"
        images = f"loaded {', '.join(self.loaded)} in {self.load_seconds:.1f}s" if self.loaded else "images present"
        return f"second engine {self.docker_host} (pid {self.pid}) {how} in {self.start_seconds:.2f}s; {images}"


# The dockerd processes started by this process: polled for an early exit, waited for by `stop`.
_launched: dict[str, subprocess.Popen[bytes]] = {}


def start_second_engine(
    images: Sequence[str] = (DEFAULT_IMAGE,),
    *,
    engine: SecondEngine = SECOND_ENGINE,
    source: str | None = None,
    timeout: float = 60.0,
    load_timeout: float = 900.0,
) -> Ready:
    """Start the second engine, or reuse it when it runs and answers; then copy to it whichever of
    `images` it lacks, from `source` (a DOCKER_HOST; None: the environment's, as `docker` does)."""
    with _locked(engine):
        t0 = time.monotonic()
        _ensure_network(engine)
        pid = _running_pid(engine)
        reused = pid is not None
        if pid is not None:
            until_sync(
                lambda: ping(engine.socket),
                timeout=timeout,
                what=f"the running dockerd (pid {pid}) to answer on {engine.socket}",
                interval=0.1,
                show=lambda: log_tail(engine),
            )
        else:
            pid = _start(engine, timeout)
        started = time.monotonic() - t0
        t1 = time.monotonic()
        loaded = ensure_images(engine.docker_host, images, source=source, timeout=load_timeout)
        return Ready(
            docker_host=engine.docker_host,
            pid=pid,
            reused=reused,
            start_seconds=started,
            loaded=loaded,
            load_seconds=time.monotonic() - t1 if loaded else 0.0,
        )


def ensure_second_engine(
    images: Sequence[str] = (DEFAULT_IMAGE,), *, engine: SecondEngine = SECOND_ENGINE, source: str | None = None
) -> str:
    """`start_second_engine`, for its DOCKER_HOST alone."""
    return start_second_engine(images, engine=engine, source=source).docker_host


def stop_second_engine(engine: SecondEngine = SECOND_ENGINE, *, timeout: float = 60.0, purge: bool = False) -> None:
    """End the second engine (it stops its containers first), remove its bridge and FORWARD rule;
    `purge`: its data root (images, containers) and run directory too."""
    with _locked(engine):
        pid = _running_pid(engine)
        if pid is not None:
            _root(["kill", "-TERM", str(pid)])
            until_sync(
                lambda: not _is_dockerd(pid),
                timeout=timeout,
                what=f"dockerd (pid {pid}) to exit",
                interval=0.1,
                show=lambda: log_tail(engine),
            )
        if (launched := _launched.pop(engine.name, None)) is not None:
            launched.wait(timeout)  # our child: reaped, not left a zombie
        if shutil.which("iptables"):
            while _root(["iptables", "-w", "-C", *engine.forward_rule()], check=False).returncode == 0:
                _root(["iptables", "-w", "-D", *engine.forward_rule()])
        if Path("/sys/class/net", engine.bridge).exists():
            _root(["ip", "link", "delete", engine.bridge, "type", "bridge"])
        if purge:
            _root(["rm", "-rf", str(engine.data_root), str(engine.run_dir)])


def ping(socket_path: Path, timeout: float = 2.0) -> bool:
    """Whether a Docker engine answers `GET /_ping` with OK on the Unix socket `socket_path`."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(socket_path))
            s.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            answer = b""
            while chunk := s.recv(4096):
                answer += chunk
    except OSError:
        return False
    head, _, body = answer.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    return len(status) >= 2 and status[1] == b"200" and body.strip() == b"OK"


def ensure_images(
    docker_host: str, images: Sequence[str], *, source: str | None = None, timeout: float = 900.0
) -> tuple[str, ...]:
    """Copy to the engine at `docker_host` each of `images` it lacks or holds under another id than
    the `source` engine does, in one `docker save | docker load`; returns the ones copied."""
    wanted = list(dict.fromkeys(images))
    if not wanted:
        return ()
    src, dst = _client(source), _client(docker_host)
    try:
        expected = {tag: _image_id(src, tag) for tag in wanted}
        for tag, image_id in expected.items():
            if image_id is None:
                raise RuntimeError(f"image {tag!r} is not on the source engine: build it there first")
        missing = tuple(tag for tag in wanted if _image_id(dst, tag) != expected[tag])
        if not missing:
            return ()
        _save_load(source, docker_host, missing, timeout)
        now = {tag: _image_id(dst, tag) for tag in missing}
        if wrong := {tag: image_id for tag, image_id in now.items() if image_id != expected[tag]}:
            raise RuntimeError(f"after `docker load` the second engine has {wrong}, not {expected}")
        return missing
    finally:
        src.close()
        dst.close()


def log_tail(engine: SecondEngine = SECOND_ENGINE, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(engine.log_path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


# --- the process ----------------------------------------------------------------------------------


def _start(engine: SecondEngine, timeout: float) -> int:
    _root(["mkdir", "-p", "-m", "0755", str(engine.run_dir)])
    _write_root(engine.config_file, "{}\n")
    _root(["rm", "-f", str(engine.pidfile)])  # a dead dockerd's: one whose pid was reused blocks the start
    command = engine.command()
    with engine.log_path.open("ab") as log:
        log.write(f"\n==> {time.strftime('%Y-%m-%dT%H:%M:%S')} forgehand: {' '.join(command)}\n".encode())
        log.flush()
        # Its own session: an interrupt of the test run (a ^C to its process group) does not stop it.
        proc = subprocess.Popen(
            [*_sudo(), *command],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _launched[engine.name] = proc

    def answers() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(
                f"dockerd exited with status {proc.returncode} before answering; {engine.log_path}:\n"
                + log_tail(engine)
            )
        return ping(engine.socket)

    until_sync(
        answers,
        timeout=timeout,
        what=f"the second dockerd to answer on {engine.socket}",
        interval=0.05,
        show=lambda: log_tail(engine),
    )
    pid = _running_pid(engine)
    if pid is None:
        raise RuntimeError(f"dockerd answers on {engine.socket} but {engine.pidfile} names no dockerd")
    return pid


def _running_pid(engine: SecondEngine) -> int | None:
    """The pid of the dockerd that `engine.pidfile` names, when it runs."""
    try:
        pid = int(engine.pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _is_dockerd(pid) else None


def _is_dockerd(pid: int) -> bool:
    """A live (not zombie) process `pid` whose program is dockerd."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return False
    state = stat.rpartition(")")[2].split()[:1]
    return comm == "dockerd" and state not in (["Z"], ["X"])


@contextlib.contextmanager
def _locked(engine: SecondEngine) -> Iterator[None]:
    fd = os.open(engine.lock_path, os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


# --- the network ----------------------------------------------------------------------------------


def _ensure_network(engine: SecondEngine) -> None:
    """The engine's bridge, with its address and up, and the FORWARD rule between its containers."""
    if not Path("/sys/class/net", engine.bridge).exists():
        _check_subnet_free(engine)
        _root(["ip", "link", "add", engine.bridge, "type", "bridge"])
    shown = json.loads(_root(["ip", "-j", "-4", "address", "show", "dev", engine.bridge]).stdout or "[]")
    have = {f"{a['local']}/{a['prefixlen']}" for link in shown for a in link.get("addr_info", [])}
    if engine.bridge_address not in have:
        _root(["ip", "address", "add", engine.bridge_address, "dev", engine.bridge])
    _root(["ip", "link", "set", engine.bridge, "up"])
    if shutil.which("iptables") and _root(["iptables", "-w", "-C", *engine.forward_rule()], check=False).returncode:
        _root(["iptables", "-w", "-A", *engine.forward_rule()])


def _check_subnet_free(engine: SecondEngine) -> None:
    """Refuse a subnet that another interface's route already covers (say, one of the first
    engine's networks): both engines' containers would claim the same addresses."""
    ours = ipaddress.ip_interface(engine.bridge_address).network
    routes = json.loads(_root(["ip", "-j", "-4", "route", "show"]).stdout or "[]")
    for route in routes:
        dst = route.get("dst", "default")
        if dst == "default" or route.get("dev") == engine.bridge:
            continue
        with contextlib.suppress(ValueError):
            if ipaddress.ip_network(dst, strict=False).overlaps(ours):
                raise RuntimeError(
                    f"{ours} (the second engine's bridge) overlaps the route {dst} on {route.get('dev')}: "
                    "give SecondEngine another bridge_address"
                )


# --- images ---------------------------------------------------------------------------------------


def _client(docker_host: str | None) -> docker.DockerClient:
    if docker_host:
        return docker.DockerClient(base_url=docker_host, timeout=60)
    return docker.from_env(timeout=60)


def _image_id(client: docker.DockerClient, tag: str) -> str | None:
    try:
        return str(client.images.get(tag).id)
    except docker.errors.ImageNotFound:
        return None


def _docker_cli(docker_host: str | None) -> list[str]:
    return ["docker", "--host", docker_host] if docker_host else ["docker"]


def _save_load(source: str | None, target: str, tags: Sequence[str], timeout: float) -> None:
    with tempfile.TemporaryFile() as save_errors:
        saver = subprocess.Popen([*_docker_cli(source), "save", *tags], stdout=subprocess.PIPE, stderr=save_errors)
        assert saver.stdout is not None
        try:
            loader = subprocess.run(
                [*_docker_cli(target), "load", "--quiet"],
                stdin=saver.stdout,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        finally:
            saver.stdout.close()  # a loader gone early: the saver ends on the broken pipe
            saved = saver.wait(timeout=60)
        save_errors.seek(0)
        if saved != 0 or loader.returncode != 0:
            raise RuntimeError(
                f"docker save {' '.join(tags)} | docker --host {target} load failed: save {saved} "
                f"({save_errors.read().decode(errors='replace').strip()}), load {loader.returncode} "
                f"({loader.stderr.strip()})"
            )


# --- privileges -----------------------------------------------------------------------------------


def _sudo() -> list[str]:
    return [] if os.geteuid() == 0 else ["sudo", "-n"]


def _root(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*_sudo(), *argv], capture_output=True, text=True, timeout=120, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed with status {done.returncode}: {done.stderr.strip()}")
    return done


def _write_root(path: Path, text: str) -> None:
    done = subprocess.run(
        [*_sudo(), "tee", str(path)], input=text, capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"writing {path} failed: {done.stderr.strip()}")
