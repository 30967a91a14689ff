"""Running an environment's setup in its build container: one exec as the sandbox user, its output
kept (head and tail), stopped at its timeout or when the container's layer passes its disk limit."""

import contextlib
import threading
import time
from collections.abc import Mapping
from typing import Any

import docker
import docker.errors
import msgspec

from sandbox.pump import raw_socket
from sandbox.spec import SANDBOX_USER, WORKSPACE_DIR

LOG_HEAD_BYTES = 16 * 1024


LOG_TAIL_BYTES = 48 * 1024


DEFAULT_DISK_BYTES = 4 * 1024 * 1024 * 1024


DISK_POLL_SECONDS = 1.0


_POLL_SECONDS = 0.5


_SETUP_SHELL = (
    'if command -v bash >/dev/null 2>&1; then exec bash -euo pipefail -c "$1" forgehand-setup; fi; '
    'exec sh -euc "$1" forgehand-setup'
)


class SetupRun(msgspec.Struct, frozen=True, kw_only=True):
    exit_code: int | None
    timed_out: bool
    log: str
    over_disk: bool = False  # the setup wrote more than its disk limit and was stopped


class LogCapture:
    """The first LOG_HEAD_BYTES and the last LOG_TAIL_BYTES of an output, and how much was cut."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        room = LOG_HEAD_BYTES - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        if len(self.tail) > LOG_TAIL_BYTES:
            cut = len(self.tail) - LOG_TAIL_BYTES
            del self.tail[:cut]
            self.dropped += cut

    def text(self) -> str:
        middle = f"\n[... {self.dropped} bytes cut ...]\n".encode() if self.dropped else b""
        return bytes(self.head + middle + self.tail).decode("utf-8", errors="replace")


def run_setup(
    client: docker.DockerClient,
    container_id: str,
    script: str,
    *,
    env: Mapping[str, str],
    timeout: float,
    disk_bytes: int = DEFAULT_DISK_BYTES,
) -> SetupRun:
    """Run `script` as the sandbox user in /workspace; past `timeout`, or once the container's
    layer holds more than `disk_bytes` (a watchdog: the layer has no quota of its own), the
    container is killed."""
    if not script.strip():
        return SetupRun(exit_code=0, timed_out=False, log="")
    argv = ["/bin/sh", "-c", _SETUP_SHELL, "forgehand-setup", script]
    exec_id = client.api.exec_create(
        container_id, argv, user=SANDBOX_USER, environment=dict(env), workdir=WORKSPACE_DIR, stdout=True, stderr=True
    )["Id"]
    log = LogCapture()
    sock = client.api.exec_start(exec_id, socket=True, tty=False)
    watchdog = DiskWatchdog(client, container_id, disk_bytes)
    watchdog.start()
    try:
        timed_out = read_frames(raw_socket(sock), time.monotonic() + timeout, log)
    finally:
        watchdog.stop()
        with contextlib.suppress(OSError):
            sock.close()
    if watchdog.over:
        return SetupRun(exit_code=None, timed_out=False, log=log.text(), over_disk=True)
    if timed_out:
        with contextlib.suppress(docker.errors.APIError):
            client.api.kill(container_id)
        return SetupRun(exit_code=None, timed_out=True, log=log.text())
    return SetupRun(exit_code=exec_exit_code(client, exec_id), timed_out=False, log=log.text())


def layer_bytes(client: docker.DockerClient, container_id: str) -> int:
    """What the container wrote into its own layer (the mounts are not in it)."""
    found = client.api.containers(all=True, size=True, filters={"id": container_id})
    return int(found[0].get("SizeRw") or 0) if found else 0


class DiskWatchdog:
    """Reads the container's layer size (`SizeRw`) every DISK_POLL_SECONDS while the setup runs and
    kills the container past the limit. A fast writer can pass the limit by what it writes in one
    interval; it cannot go on."""

    def __init__(self, client: docker.DockerClient, container_id: str, limit: int) -> None:
        self.client, self.container_id, self.limit = client, container_id, limit
        self.over = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="forgehand-env-disk", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=30)

    def _watch(self) -> None:
        while not self._done.wait(DISK_POLL_SECONDS):
            try:
                size = layer_bytes(self.client, self.container_id)
            except docker.errors.DockerException:
                return
            if size > self.limit:
                self.over = True
                with contextlib.suppress(docker.errors.DockerException):
                    self.client.api.kill(self.container_id)
                return


def read_frames(raw: Any, deadline: float, log: LogCapture) -> bool:
    """Feed the payloads of Docker's multiplexed exec stream (8-byte headers) to `log` until it
    ends; True when `deadline` passed first."""
    raw.settimeout(_POLL_SECONDS)
    buf = b""
    while True:
        if time.monotonic() > deadline:
            return True
        try:
            data = raw.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            return False
        if not data:
            return False
        buf += data
        while len(buf) >= 8:
            size = int.from_bytes(buf[4:8], "big")
            if len(buf) < 8 + size:
                break
            log.feed(buf[8 : 8 + size])
            buf = buf[8 + size :]


def exec_exit_code(client: docker.DockerClient, exec_id: str) -> int | None:
    # The output can end a moment before the engine has recorded the exit.
    for _ in range(80):
        info = client.api.exec_inspect(exec_id)
        if not info.get("Running"):
            code = info.get("ExitCode")
            return int(code) if code is not None else None
        time.sleep(0.025)
    return None
