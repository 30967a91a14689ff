"""Building an environment's image: its setup run once in a hardened container, then committed.

`build_environment` (blocking: callers run it in a thread) creates a container from the base image
with the sandbox's own hardening (`container_create_kwargs`) and one loosening, a writable root, so
that what the setup writes lands in the container layer; the network stays `none` (the setup's
egress is a later step). It runs the setup as the sandbox user (uid 1000) with `bash -euo pipefail`
(`sh -eu` where the image has no bash), kills it at the timeout, and commits the container only
when the setup succeeded and no secret value is found in what would be committed.

Where the setup may write, and what is kept:

- `/opt/env` is the environment's own directory, owned by uid 1000, and `/opt/env/bin` comes
  first in the image's PATH. The sandbox image's root belongs to root and the setup runs without
  capabilities (cap_drop ALL holds for every exec, root's too), so the directory is put into the
  created container, before it starts, as a tar entry owned by 1000:1000 (`put_archive` needs no
  capability in the container). Install there: `python3 -m venv /opt/env`, `npm --prefix /opt/env`,
  `pip install --target`, binaries in `/opt/env/bin`.
- `/workspace` (the checkout, bind-mounted as in a sandbox), `$HOME` and `/tmp` (tmpfs) and
  `/run/secrets` are mounts: written to during the setup, never part of the image.
- Anything else uid 1000 can write in the image (e.g. `/var/tmp`) is kept, and scanned like
  `/opt/env`.

Secrets: `secrets` (name -> value) are files in a host directory bind-mounted read-only at
`/run/secrets/NAME`, readable by uid 1000 only; never environment variables, which `docker commit`
would bake into the image's config. Before the commit, `container.diff()` lists what the setup
changed in the container layer; each added or modified path outside the mounts is read back with
`get_archive` (an added directory once, with all of its new contents; a modified directory only by
its name, as its changed children are listed too) and the tar stream is scanned for each value,
raw and base64-encoded at each of the three alignments (standard and URL-safe alphabets, so base64
lines wrapped mid-value are not found). The config to commit (Env, Labels, Cmd...) is scanned too. A
hit refuses the build (`secret_in_environment`) and nothing is committed. The scan catches a value
left behind by mistake (a token in a config file, a `.netrc`, a URL in a lock file); a setup that
means to hide one (encrypted, compressed) is not stopped by it.
"""

import base64
import contextlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any

import docker
import docker.errors
import msgspec

from sandbox.creation import low_level_create_args, remove_container
from sandbox.environment.spec import EnvironmentSpec
from sandbox.owner import current_owner
from sandbox.pump import raw_socket
from sandbox.relays import check_launched, launcher_argv
from sandbox.spec import (
    CHANNEL_DIR,
    HOME_DIR,
    SANDBOX_GID,
    SANDBOX_UID,
    SANDBOX_USER,
    WORKSPACE_DIR,
    Limits,
    Relay,
    SandboxSpec,
    Weakenings,
    container_create_kwargs,
)

ENV_DIR = "/opt/env"
ENV_BIN = f"{ENV_DIR}/bin"
SECRETS_DIR = "/run/secrets"
LOG_HEAD_BYTES = 16 * 1024
LOG_TAIL_BYTES = 48 * 1024
# Mounts of the build container: written to by the setup, never in the committed layer.
NOT_COMMITTED = ("/tmp", HOME_DIR, WORKSPACE_DIR, SECRETS_DIR, CHANNEL_DIR)  # noqa: S108 (paths in the container)

REASON_SETUP = "environment_setup"
REASON_TIMED_OUT = "timed_out"
REASON_SECRET = "secret_in_environment"
REASON_DISK = "disk_limit"
DEFAULT_DISK_BYTES = 4 * 1024 * 1024 * 1024
DISK_POLL_SECONDS = 1.0

_POLL_SECONDS = 0.5
_STOP_SECONDS = 5
_DIR_MODE_BIT = 1 << 31  # Go's os.ModeDir, in the engine's path stat
_SETUP_SHELL = (
    'if command -v bash >/dev/null 2>&1; then exec bash -euo pipefail -c "$1" forgehand-setup; fi; '
    'exec sh -euc "$1" forgehand-setup'
)


class BuildResult(msgspec.Struct, frozen=True, kw_only=True):
    """How a build ended. `reason` is "" when `ok`; `image_id` is set only then."""

    ok: bool
    reason: str  # "", REASON_SETUP (non-zero exit), REASON_TIMED_OUT, REASON_DISK, REASON_SECRET
    exit_code: int | None
    log_tail: str  # the setup's output (stdout and stderr), its head and tail when long
    image_id: str
    seconds: float
    secret: str = ""  # with REASON_SECRET: the name of the secret found (never its value)


class SetupChannel(msgspec.Struct, frozen=True, kw_only=True):
    """The setup's way out: a host directory of sockets (its egress proxy's), mounted read-only at
    the sandbox's channel path, the loopback relays to them, and the setup's proxy variables."""

    directory: Path
    relays: tuple[Relay, ...]
    env: dict[str, str]


class SetupRun(msgspec.Struct, frozen=True, kw_only=True):
    exit_code: int | None
    timed_out: bool
    log: str
    over_disk: bool = False  # the setup wrote more than its disk limit and was stopped


def build_environment(
    client: docker.DockerClient,
    spec: EnvironmentSpec,
    *,
    base_image: str,
    tag: str,
    workspace: Path,
    secrets: Mapping[str, str],
    labels: Mapping[str, str],
    instance: str,
    limits: Limits | None = None,
    timeout: float | None = None,
    channel: SetupChannel | None = None,
    disk_bytes: int = DEFAULT_DISK_BYTES,
) -> BuildResult:
    """Build `spec` on `base_image` into the image `tag` ("repository:tag"), labelled `labels`.

    `instance` labels the build container like a sandbox's (the reaper finds a leftover one);
    `timeout` bounds the setup (default `spec.timeout_seconds`); `channel`, when the setup has
    network rules, mounts the directory of its egress proxy's socket and starts the relays to it
    (the proxy variables are the setup's only: never in the committed image). The container and
    the host directory of the secrets are removed whatever happens.
    """
    repository, _, version = tag.rpartition(":")
    if not repository or "/" in version:
        raise ValueError(f"tag {tag!r} must be repository:tag")
    started = time.monotonic()
    limit = float(spec.timeout_seconds if timeout is None else timeout)
    base = client.api.inspect_image(base_image)["Config"] or {}
    secrets_home = write_secrets(secrets)
    container_id = ""
    try:
        kwargs = _create_kwargs(spec, base, base_image, workspace, secrets_home, instance, limits, limit, channel)
        container_id = str(client.api.create_container(**low_level_create_args(client.api, kwargs))["Id"])
        client.api.put_archive(container_id, "/", env_dir_tar())
        client.api.start(container_id)
        if channel is not None and channel.relays:
            _start_relays(client, container_id, base_image, channel.relays)
        setup_env = {"PATH": image_path(base), **(channel.env if channel is not None else {})}
        run = run_setup(client, container_id, spec.setup, env=setup_env, timeout=limit, disk_bytes=disk_bytes)
        if not run.over_disk and layer_bytes(client, container_id) > disk_bytes:  # a writer faster than the watchdog
            run = msgspec.structs.replace(run, over_disk=True)
        if run.over_disk or run.timed_out or run.exit_code != 0:
            reason = REASON_DISK if run.over_disk else REASON_TIMED_OUT if run.timed_out else REASON_SETUP
            return _result(started, run, reason=reason)
        client.api.stop(container_id, timeout=_STOP_SECONDS)
        conf = commit_config(base, spec, labels, container_labels=kwargs["labels"])
        image_id, found = commit_checked(client, container_id, conf, SecretScanner(secrets))
        if found:
            return _result(started, run, reason=REASON_SECRET, secret=found)
        client.api.tag(image_id, repository, version)
        return _result(started, run, image_id=image_id)
    finally:
        if container_id:
            with contextlib.suppress(docker.errors.DockerException):
                remove_container(client, container_id)
        shutil.rmtree(secrets_home, ignore_errors=True)


def commit_checked(
    client: docker.DockerClient, container_id: str, conf: dict[str, Any], scanner: "SecretScanner"
) -> tuple[str, str]:
    """Commit the container as an untagged image while its changes are scanned for the secrets
    (the two take about as long: side by side, the build pays once). The image id, and the name
    of a secret found ("" for none): then the image is removed again and nothing is tagged, so
    no cache lookup ever finds it. Without secrets there is nothing to look for."""
    scanner.feed_named("the image config", json.dumps(conf).encode())
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="forgehand-env-commit") as pool:
        committing = pool.submit(client.api.commit, container_id, conf=conf)
        try:
            if scanner.needles and not scanner.found:
                scan_changes(client, container_id, scanner)
        finally:
            image_id = str(committing.result()["Id"])
    if scanner.found:
        with contextlib.suppress(docker.errors.DockerException):
            client.api.remove_image(image_id, force=True)
    return image_id, scanner.found


def _start_relays(client: docker.DockerClient, container_id: str, image: str, relays: tuple[Relay, ...]) -> None:
    """The relays of the setup's channel, started as a sandbox's are (sandbox/relays.py)."""
    argv = launcher_argv(relays)
    exec_id = client.api.exec_create(container_id, argv, user=SANDBOX_USER, stdout=True, stderr=True)["Id"]
    out = client.api.exec_start(exec_id)
    check_launched(image, _exit_code(client, exec_id), out)


def _result(started: float, run: SetupRun, *, reason: str = "", image_id: str = "", secret: str = "") -> BuildResult:
    return BuildResult(
        ok=not reason,
        reason=reason,
        exit_code=run.exit_code,
        log_tail=run.log,
        image_id=image_id,
        seconds=round(time.monotonic() - started, 3),
        secret=secret,
    )


def _create_kwargs(
    spec: EnvironmentSpec,
    base: Mapping[str, Any],
    base_image: str,
    workspace: Path,
    secrets_home: Path,
    instance: str,
    limits: Limits | None,
    timeout: float,
    channel: SetupChannel | None = None,
) -> dict[str, Any]:
    lim = limits or Limits()
    # The idle process outlives the setup's timeout a little: the host's kill comes first.
    lim = msgspec.structs.replace(lim, wall_clock_seconds=int(timeout) + 120)
    sandbox = SandboxSpec(
        image=base_image,
        workspace=workspace,
        instance=instance,
        task="environment",
        run=f"env-{int(time.time())}",
        env={**spec.env, "PATH": image_path(base), **(channel.env if channel is not None else {})},
        limits=lim,
        weaken=Weakenings(writable_root=True),
        channel_dir=channel.directory if channel is not None else None,
        relays=channel.relays if channel is not None else (),
    )
    kwargs = container_create_kwargs(sandbox)
    kwargs["labels"] = {**kwargs["labels"], **current_owner().labels()}
    kwargs["mounts"] = [
        *kwargs["mounts"],
        {
            "Target": SECRETS_DIR,
            "Source": str(secrets_home / "secrets"),
            "Type": "bind",
            "ReadOnly": True,
            "BindOptions": {"Propagation": "rprivate"},
        },
    ]
    return kwargs


def image_path(base: Mapping[str, Any]) -> str:
    """The environment's PATH: /opt/env/bin, then the base image's."""
    for entry in base.get("Env") or []:
        name, _, value = str(entry).partition("=")
        if name == "PATH":
            return f"{ENV_BIN}:{value}" if value else ENV_BIN
    return f"{ENV_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def write_secrets(secrets: Mapping[str, str]) -> Path:
    """A private host directory holding `secrets/NAME` files for uid 1000 only; the caller removes it.

    The outer directory is the forge's own (0700), so nobody else on the host reaches the files.
    Running as root, the files are given to uid 1000 (0400, directory 0500); otherwise they are
    left readable to all (0444, 0555): inside the container only the sandbox user exists, and
    on the host the outer directory still closes them off.
    """
    home = Path(tempfile.mkdtemp(prefix="forgehand-env-secrets-"))
    folder = home / "secrets"
    folder.mkdir(mode=0o700)
    as_root = os.geteuid() == 0
    for name, value in secrets.items():
        path = folder / name
        path.write_bytes(value.encode())
        path.chmod(0o400 if as_root else 0o444)
        if as_root:
            _chown(path)
    if as_root:
        _chown(folder)
    folder.chmod(0o500 if as_root else 0o555)
    return home


def _chown(path: Path) -> None:
    os.chown(path, SANDBOX_UID, SANDBOX_GID)


def env_dir_tar() -> bytes:
    """A tar of the one directory /opt/env, owned by the sandbox user (put before the start)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        entry = tarfile.TarInfo(ENV_DIR.lstrip("/"))
        entry.type = tarfile.DIRTYPE
        entry.mode = 0o755
        entry.uid, entry.gid = SANDBOX_UID, SANDBOX_GID
        entry.mtime = int(time.time())
        tar.addfile(entry)
    return buf.getvalue()


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
    return SetupRun(exit_code=_exit_code(client, exec_id), timed_out=False, log=log.text())


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


def _exit_code(client: docker.DockerClient, exec_id: str) -> int | None:
    # The output can end a moment before the engine has recorded the exit.
    for _ in range(80):
        info = client.api.exec_inspect(exec_id)
        if not info.get("Running"):
            code = info.get("ExitCode")
            return int(code) if code is not None else None
        time.sleep(0.025)
    return None


def commit_config(
    base: Mapping[str, Any], spec: EnvironmentSpec, labels: Mapping[str, str], *, container_labels: Mapping[str, str]
) -> dict[str, Any]:
    """The committed image's config: the base image's Env with PATH through /opt/env/bin and the
    spec's env (never a secret), the given labels, and the base's user, command and directory.

    The engine merges the container's own config into a commit's (a key the given config lacks is
    taken from the container), so each of the build container's labels is set here: to "" unless
    the caller gives it a value. Otherwise every sandbox started from the image would inherit,
    among others, the build container's `forgehand.weakened` (its writable root).
    """
    env = {name: value for name, _, value in (str(e).partition("=") for e in base.get("Env") or [])}
    env.update(spec.env)
    env["PATH"] = image_path(base)
    return {
        "Env": [f"{name}={value}" for name, value in env.items()],
        "Labels": {**dict.fromkeys(container_labels, ""), **(base.get("Labels") or {}), **labels},
        "User": base.get("User") or SANDBOX_USER,
        "Cmd": base.get("Cmd") or ["sleep", "infinity"],
        "Entrypoint": base.get("Entrypoint") or [],
        "WorkingDir": base.get("WorkingDir") or WORKSPACE_DIR,
    }


class SecretScanner:
    """Finds any secret value, raw or base64-encoded, in streams of bytes (module doc)."""

    def __init__(self, secrets: Mapping[str, str]) -> None:
        self._needles = [(name, needle) for name, value in secrets.items() if value for needle in encodings(value)]
        self._overlap = max((len(needle) for _, needle in self._needles), default=1) - 1
        self.found = ""

    @property
    def needles(self) -> int:
        """How many byte strings it looks for (0: no secret, nothing to find)."""
        return len(self._needles)

    def feed_stream(self, chunks: Iterable[bytes]) -> None:
        """Scan a stream whose chunks may cut a value in two."""
        carry = b""
        for chunk in chunks:
            window = carry + chunk
            self._scan(window)
            if self.found:
                return
            carry = window[-self._overlap :] if self._overlap else b""

    def feed_named(self, what: str, data: bytes) -> None:
        """Scan one whole piece (`what` says which, for a reader of the code)."""
        self._scan(data)

    def _scan(self, data: bytes) -> None:
        for name, needle in self._needles:
            if needle in data:
                self.found = name
                return


def encodings(value: str) -> list[bytes]:
    """The byte strings that betray `value`: itself, and the part of its base64 encoding that
    depends on the value alone at each of the three offsets it can start at within a longer
    encoded text, in the standard and URL-safe alphabets. Fragments under 8 characters are left
    out (they would match by chance)."""
    raw = value.encode()
    out = [raw]
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw)
        start = -(-offset * 8 // 6)  # the first character no padding byte feeds
        end = (offset + len(raw)) * 8 // 6  # past the last one no following byte feeds
        fragment = encoded[start:end]
        if len(fragment) >= 8:
            out.append(fragment)
            out.append(fragment.replace(b"+", b"-").replace(b"/", b"_"))
    return list(dict.fromkeys(out))


def scan_changes(client: docker.DockerClient, container_id: str, scanner: SecretScanner) -> None:
    """Scan each path the setup added or changed in the container layer (module doc)."""
    for path, read in changed_paths(client.api.diff(container_id) or []):
        scanner.feed_named("a path", path.encode())
        if read and not scanner.found:
            chunks, stat = client.api.get_archive(container_id, path)
            scanner.feed_named("a link", str(stat.get("linkTarget", "")).encode())
            try:
                scanner.feed_stream(chunks)
            finally:
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()
        if scanner.found:
            return


def changed_paths(diff: Iterable[Mapping[str, Any]]) -> Iterator[tuple[str, bool]]:
    """From `container.diff()`: each added or modified path outside the mounts, and whether to read
    its contents. An added path is read once with everything under it (all of it is new), so the
    paths under it are skipped; a modified path that has changes under it is a directory whose
    changed children are listed themselves: only its name counts. Deletions are skipped."""
    changes = {str(entry["Path"]): int(entry["Kind"]) for entry in diff}
    kept = {path: kind for path, kind in changes.items() if not _under_any(path, NOT_COMMITTED) and kind != 2}
    added = {path for path, kind in kept.items() if kind == 1}
    with_children = {str(parent) for path in changes for parent in PurePosixPath(path).parents}
    for path in sorted(kept):
        if any(str(parent) in added for parent in PurePosixPath(path).parents):
            continue
        yield path, path in added or path not in with_children


def _under_any(path: str, roots: Iterable[str]) -> bool:
    return any(path == root or path.startswith(root + "/") for root in roots)


def prune_images(client: docker.DockerClient, labels: Mapping[str, str], limit_bytes: int, keep: str) -> list[str]:
    """Remove the oldest images carrying every one of `labels` (an instance's environments) while
    what they add to their bases (their own layers: size minus what they share) is over
    `limit_bytes`; never `keep` (the image just built, by tag or id). The ids removed."""
    wanted = dict(labels)
    images = [
        image
        for image in client.df().get("Images") or []
        if all((image.get("Labels") or {}).get(k) == v for k, v in wanted.items())
    ]
    kept = client.api.inspect_image(keep)["Id"]

    def own(image: Mapping[str, Any]) -> int:
        shared = int(image.get("SharedSize") or 0)
        return max(0, int(image.get("Size") or 0) - max(shared, 0))

    total = sum(own(image) for image in images)
    removed: list[str] = []
    # The engine's creation time to the nanosecond (the summary's is in whole seconds: builds a
    # moment apart would tie), RFC 3339 in UTC, so its text sorts as the time does.
    created = {image["Id"]: str(client.api.inspect_image(image["Id"]).get("Created") or "") for image in images}
    for image in sorted(images, key=lambda i: created[i["Id"]]):
        if total <= limit_bytes:
            break
        if image["Id"] == kept:
            continue
        with contextlib.suppress(docker.errors.APIError):
            client.api.remove_image(image["Id"], force=True)
            removed.append(str(image["Id"]))
            total -= own(image)
    return removed
