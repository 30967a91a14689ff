"""The git smart HTTP protocol, framework-free.

The services and their content types, the ``Git-Protocol`` header, the server-wide settings of
the git processes (``GitHttpConfig``) and how one is started (``git_argv``, ``service_env``);
``advertise_refs`` answers ``GET info/refs?service=...``. The POSTs (``git-upload-pack``,
``git-receive-pack``) are driven by ``service_process``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Final, Literal

import msgspec

from forge.git.bodies import decode_request_body as decode_request_body
from forge.git.bodies import gunzip_stream as gunzip_stream
from forge.git.bodies import limit_stream as limit_stream
from forge.git.errors import (
    GitCommandFailed,
    RepoNotFound,
    UnsupportedService,
)
from forge.git.gitcmd import git_binary, git_env, terminate_process
from forge.git.pktline import FLUSH_PKT, pkt_line

Service = Literal["git-upload-pack", "git-receive-pack"]
UPLOAD_PACK: Final = "git-upload-pack"
RECEIVE_PACK: Final = "git-receive-pack"
SERVICES: Final = frozenset({UPLOAD_PACK, RECEIVE_PACK})

CHUNK_SIZE = 64 * 1024
SPOOL_MEMORY = 1024 * 1024
STDERR_TAIL = 16 * 1024

#: Headers for every smart HTTP response (as git-http-backend sends them).
NO_CACHE_HEADERS: dict[str, str] = {
    "Expires": "Fri, 01 Jan 1980 00:00:00 GMT",
    "Pragma": "no-cache",
    "Cache-Control": "no-cache, max-age=0, must-revalidate",
}

_PROTOCOL_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}(=[A-Za-z0-9_.-]{1,32})?", re.ASCII)
_ENV_KEY = re.compile(r"FORGEHAND_[A-Z0-9_]{1,64}", re.ASCII)


class GitHttpConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Server-wide settings of the git subprocesses."""

    #: The server-owned directory holding the pre-receive and post-receive hooks
    #: (``hooks.install_hooks``); required to run receive-pack.
    hooks_dir: Path | None = None
    #: Cap on a (decoded) request body, and git's ``receive.maxInputSize``.
    max_request_bytes: int = 1024 * 1024 * 1024
    #: ``HOME`` of the git processes (default: a private empty temporary directory).
    home: Path | None = None
    #: Extra ``-c key=value`` for every git process.
    extra_config: dict[str, str] = {}
    #: Seconds an abandoned receive-pack may keep running: to finish its ref updates when it
    #: got the whole body, to clean up after a truncated one otherwise. upload-pack is stopped
    #: at once.
    finish_grace: float = 60.0
    abort_grace: float = 10.0


DEFAULT_CONFIG: Final = GitHttpConfig()


# --- small helpers --------------------------------------------------------------------------------


def check_service(service: str) -> Service:
    if service == UPLOAD_PACK:
        return UPLOAD_PACK
    if service == RECEIVE_PACK:
        return RECEIVE_PACK
    raise UnsupportedService(f"unsupported git service: {service!r}")


def advertisement_content_type(service: str) -> str:
    return f"application/x-{check_service(service)}-advertisement"


def request_content_type(service: str) -> str:
    return f"application/x-{check_service(service)}-request"


def result_content_type(service: str) -> str:
    return f"application/x-{check_service(service)}-result"


def validate_git_protocol_header(value: str | None) -> str | None:
    """The ``Git-Protocol`` header reduced to what may reach git's ``GIT_PROTOCOL``.

    The header is a ``:``-separated list of ``key`` or ``key=value`` tokens. Anything malformed
    drops the whole header (git then speaks protocol v0); of well-formed tokens only
    ``version=0|1|2`` is kept.
    """
    if value is None:
        return None
    value = value.strip()
    if not value or len(value) > 256:
        return None
    tokens = value.split(":")
    if len(tokens) > 8 or not all(_PROTOCOL_TOKEN.fullmatch(t) for t in tokens):
        return None
    versions = [t for t in tokens if t in ("version=0", "version=1", "version=2")]
    return versions[-1] if versions else None


def _protocol_version(git_protocol: str | None) -> int:
    return int(git_protocol.rsplit("=", 1)[1]) if git_protocol else 0


def git_argv(service: Service, repo_path: Path, config: GitHttpConfig, *, advertise: bool) -> list[str]:
    settings = {
        "receive.fsckObjects": "true",
        "transfer.fsckObjects": "true",
        "core.hooksPath": str(config.hooks_dir) if config.hooks_dir is not None else os.devnull,
    }
    if service == RECEIVE_PACK:
        settings["receive.maxInputSize"] = str(config.max_request_bytes)
    settings.update(config.extra_config)
    # forgehand's own refs (runs' fences, forge.git.fences): never fetched, never pushed to, and
    # not something a configuration may change.
    settings["transfer.hideRefs"] = "refs/forgehand/"
    argv = [git_binary()]
    for key, value in settings.items():
        argv += ["-c", f"{key}={value}"]
    argv += [service.removeprefix("git-"), "--stateless-rpc"]
    if advertise:
        argv.append("--advertise-refs")
    argv.append(str(repo_path))
    return argv


def service_env(
    service: Service,
    git_protocol: str | None,
    env_extra: Mapping[str, str] | None,
    config: GitHttpConfig,
) -> dict[str, str]:
    extra: dict[str, str] = {}
    for key, value in (env_extra or {}).items():
        if not _ENV_KEY.fullmatch(key):
            raise ValueError(f"only FORGEHAND_* variables may be passed to git, not {key!r}")
        extra[key] = value
    protocol = validate_git_protocol_header(git_protocol)
    # receive-pack speaks v0/v1 only; the git client never asks it for v2.
    if protocol and not (service == RECEIVE_PACK and protocol == "version=2"):
        extra["GIT_PROTOCOL"] = protocol
    return git_env(extra, home=config.home)


async def drain_tail(stream: asyncio.StreamReader, tail: bytearray) -> None:
    """Read ``stream`` to its end (git must never block on a full stderr pipe), keeping the
    last ``STDERR_TAIL`` bytes in ``tail``."""
    while chunk := await stream.read(4096):
        tail += chunk
        if len(tail) > STDERR_TAIL:
            del tail[: len(tail) - STDERR_TAIL]


def check_repo(repo_path: Path) -> None:
    if not (repo_path / "HEAD").is_file():
        raise RepoNotFound(f"no repository at {repo_path.name}")


# --- info/refs ------------------------------------------------------------------------------------


async def advertise_refs(
    service: str,
    repo_path: Path,
    git_protocol: str | None = None,
    *,
    config: GitHttpConfig = DEFAULT_CONFIG,
) -> AsyncIterator[bytes]:
    """The body of ``GET info/refs?service=<service>``.

    Protocol v0/v1 answers start with ``# service=<service>`` and a flush-pkt; a v2 answer (the
    capability advertisement) does not, like git-http-backend.
    """
    svc = check_service(service)
    check_repo(repo_path)
    protocol = validate_git_protocol_header(git_protocol)
    env = service_env(svc, protocol, None, config)
    proc = await asyncio.create_subprocess_exec(
        *git_argv(svc, repo_path, config, advertise=True),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    stderr = bytearray()
    stderr_task = asyncio.ensure_future(drain_tail(proc.stderr, stderr))
    try:
        if not (svc == UPLOAD_PACK and _protocol_version(protocol) == 2):
            yield pkt_line(f"# service={svc}\n") + FLUSH_PKT
        while chunk := await proc.stdout.read(CHUNK_SIZE):
            yield chunk
        returncode = await proc.wait()
        if returncode != 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await asyncio.shield(stderr_task)
            message = stderr.decode("utf-8", "replace").strip()
            raise GitCommandFailed(f"git {svc} --advertise-refs failed: {message}", returncode=returncode)
    finally:
        stderr_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await stderr_task
        await terminate_process(proc)
