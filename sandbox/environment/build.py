"""Building an environment's image: its setup run once in a hardened container, then committed.

`build_environment` (blocking: callers run it in a thread) creates a container from the base image
with the sandbox's own hardening (`container_create_kwargs`) and one loosening, a writable root, so
that what the setup writes lands in the container layer; the network stays `none` (the setup's
egress is a later step). It runs the setup as the sandbox user (uid 1000) with `bash -euo pipefail`
(`sh -eu` where the image has no bash), kills it at the timeout, and commits the container only
when the setup succeeded and no secret value is found in what would be committed.

Where the setup may write, and what is kept:

- `/opt/env` is the environment's own directory, owned by uid 1000, and `/opt/env/bin` comes
  last in the image's PATH (after the image's own directories: a setup adds commands, never
  replaces one). The sandbox image's root belongs to root and the setup runs without
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
would bake into the image's config. Before the commit, the container layer's own directory on this
host (overlay2's upper directory; `container.diff()` when the engine keeps it elsewhere) lists what
the setup changed; each added or modified path outside the mounts is read back (from that directory,
or with `get_archive`: an added directory once, with all of its new contents; a modified directory
only by its name, as its changed children are listed too) and scanned for each value,
raw and base64-encoded at each of the three alignments (standard and URL-safe alphabets, so base64
lines wrapped mid-value are not found). The config to commit (Env, Labels, Cmd...) is scanned too. A
hit refuses the build (`secret_in_environment`) and nothing is committed. The scan catches a value
left behind by mistake (a token in a config file, a `.netrc`, a URL in a lock file); a setup that
means to hide one (encrypted, compressed) is not stopped by it.
"""

import contextlib
import io
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker
import docker.errors
import msgspec

from sandbox.commands import close_exec_socket
from sandbox.creation import low_level_create_args, remove_container
from sandbox.environment.secret_scan import SECRETS_DIR, SecretScanner, changes_on_disk, commit_checked, upper_dir
from sandbox.environment.setup_run import DEFAULT_DISK_BYTES, SetupRun, exec_exit_code, layer_bytes, run_setup
from sandbox.environment.spec import EnvironmentSpec
from sandbox.owner import current_owner
from sandbox.pump import read_stdout
from sandbox.relays import check_launched, launcher_argv
from sandbox.spec import (
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

REASON_SETUP = "environment_setup"
REASON_TIMED_OUT = "timed_out"
REASON_SECRET = "secret_in_environment"
REASON_DISK = "disk_limit"
MAX_CHANGED_PATHS = 200_000  # files and directories one setup may add or change

_STOP_SECONDS = 5


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
    run_label: str = "",
) -> BuildResult:
    """Build `spec` on `base_image` into the image `tag` ("repository:tag"), labelled `labels`.

    `instance` and `run_label` (the run that asked for the build) label the build container like a
    sandbox's: the reaper keeps it while that run lives and finds a leftover one after a crash;
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
        kwargs = _create_kwargs(
            spec, base, base_image, workspace, secrets_home, instance, limits, limit, channel, run=run_label
        )
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
        upper = upper_dir(client, container_id)
        if upper is not None:  # the layer is on this host: read its own directory (module doc)
            changes = changes_on_disk(upper, MAX_CHANGED_PATHS + 1)
        else:
            changes = client.api.diff(container_id) or []
        if len(changes) > MAX_CHANGED_PATHS:  # an inode flood: too many files to keep or to scan
            return _result(started, msgspec.structs.replace(run, over_disk=True), reason=REASON_DISK)
        image_id, found = commit_checked(client, container_id, conf, SecretScanner(secrets), changes)
        if found:
            return _result(started, run, reason=REASON_SECRET, secret=found)
        client.api.tag(image_id, repository, version)
        return _result(started, run, image_id=image_id)
    finally:
        if container_id:
            with contextlib.suppress(docker.errors.DockerException):
                remove_container(client, container_id)
        shutil.rmtree(secrets_home, ignore_errors=True)


def _start_relays(client: docker.DockerClient, container_id: str, image: str, relays: tuple[Relay, ...]) -> None:
    """The relays of the setup's channel, started as a sandbox's are (sandbox/relays.py)."""
    argv = launcher_argv(relays)
    exec_id = client.api.exec_create(container_id, argv, user=SANDBOX_USER, stdout=True, stderr=False)["Id"]
    # Not `exec_start(exec_id)`: it can lose a short command's whole output (sandbox.pump.read_stdout).
    sock = client.api.exec_start(exec_id, socket=True)
    try:
        out = read_stdout(sock, 4096)
    finally:
        close_exec_socket(sock)
    check_launched(image, exec_exit_code(client, exec_id), out)


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
    run: str = "",
) -> dict[str, Any]:
    lim = limits or Limits()
    # The idle process outlives the setup's timeout a little: the host's kill comes first.
    lim = msgspec.structs.replace(lim, wall_clock_seconds=int(timeout) + 120)
    sandbox = SandboxSpec(
        image=base_image,
        workspace=workspace,
        instance=instance,
        task="environment",
        run=run or f"env-{int(time.time())}",
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
    """The environment's PATH: the base image's, then /opt/env/bin. Last, so that a setup adds
    commands and never replaces one of the image's (`sleep`, `python3`, the agent's CLI) that
    forgehand runs by name."""
    for entry in base.get("Env") or []:
        name, _, value = str(entry).partition("=")
        if name == "PATH":
            return f"{value}:{ENV_BIN}" if value else ENV_BIN
    return f"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:{ENV_BIN}"


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
