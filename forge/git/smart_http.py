"""The git smart HTTP protocol, framework-free.

``advertise_refs`` answers ``GET info/refs?service=...``; ``run_service`` and
``GitServiceProcess`` answer ``POST git-upload-pack`` / ``POST git-receive-pack`` by running
``git upload-pack|receive-pack --stateless-rpc`` with the request body streamed to its stdin and
its stdout streamed back: nothing is ever held whole in memory. The git process is stopped and
reaped however the exchange ends (client gone, limit passed, error).

Two ways to drive a POST, for two kinds of web frameworks:

* ``run_service(...)``: one async iterator; the request body is fed to git by a background task
  while the response streams. Use it where the handler owns ``receive`` (a raw ASGI route).
* ``GitServiceProcess``: ``start()``, then ``await feed(body)`` consumes the whole request body
  before the response begins (git's output meanwhile goes to a small spooled buffer), then
  ``output()`` streams. Use it with a framework whose streaming response also listens on
  ``receive`` for disconnects (Litestar's ``Stream`` does: it would swallow body chunks).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import tempfile
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from pathlib import Path
from typing import Final, Literal

import msgspec

from forge.git.bodies import decode_request_body as decode_request_body
from forge.git.bodies import gunzip_stream as gunzip_stream
from forge.git.bodies import limit_stream as limit_stream
from forge.git.errors import (
    GitCommandFailed,
    PushTooLarge,
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


def _git_argv(service: Service, repo_path: Path, config: GitHttpConfig, *, advertise: bool) -> list[str]:
    settings = {
        "receive.fsckObjects": "true",
        "transfer.fsckObjects": "true",
        "core.hooksPath": str(config.hooks_dir) if config.hooks_dir is not None else os.devnull,
    }
    if service == RECEIVE_PACK:
        settings["receive.maxInputSize"] = str(config.max_request_bytes)
    settings.update(config.extra_config)
    argv = [git_binary()]
    for key, value in settings.items():
        argv += ["-c", f"{key}={value}"]
    argv += [service.removeprefix("git-"), "--stateless-rpc"]
    if advertise:
        argv.append("--advertise-refs")
    argv.append(str(repo_path))
    return argv


def _service_env(
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


async def _drain_tail(stream: asyncio.StreamReader, tail: bytearray) -> None:
    """Read ``stream`` to its end (git must never block on a full stderr pipe), keeping the
    last ``STDERR_TAIL`` bytes in ``tail``."""
    while chunk := await stream.read(4096):
        tail += chunk
        if len(tail) > STDERR_TAIL:
            del tail[: len(tail) - STDERR_TAIL]


def _check_repo(repo_path: Path) -> None:
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
    _check_repo(repo_path)
    protocol = validate_git_protocol_header(git_protocol)
    env = _service_env(svc, protocol, None, config)
    proc = await asyncio.create_subprocess_exec(
        *_git_argv(svc, repo_path, config, advertise=True),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    stderr = bytearray()
    stderr_task = asyncio.ensure_future(_drain_tail(proc.stderr, stderr))
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


# --- POST: one git service process ----------------------------------------------------------------


class GitServiceProcess:
    """One ``git upload-pack|receive-pack --stateless-rpc`` process for one POST."""

    def __init__(self, proc: asyncio.subprocess.Process, service: Service, config: GitHttpConfig) -> None:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self._proc = proc
        self._stdin = proc.stdin
        self._stdout = proc.stdout
        self.service = service
        self._config = config
        self._stderr = bytearray()
        self._stderr_task = asyncio.ensure_future(_drain_tail(proc.stderr, self._stderr))
        self._spool: tempfile.SpooledTemporaryFile[bytes] | None = None
        self._stdout_eof = False
        #: The whole request body reached git's stdin.
        self.fed = False
        #: Request body bytes read.
        self.bytes_in = 0
        #: Why reading the request body failed (``PushTooLarge``, a client error ...).
        self.failure: BaseException | None = None
        self._closed = False

    @classmethod
    async def start(
        cls,
        service: str,
        repo_path: Path,
        *,
        git_protocol: str | None = None,
        env_extra: Mapping[str, str] | None = None,
        config: GitHttpConfig = DEFAULT_CONFIG,
    ) -> GitServiceProcess:
        svc = check_service(service)
        _check_repo(repo_path)
        if svc == RECEIVE_PACK and config.hooks_dir is None:
            raise ValueError("receive-pack needs GitHttpConfig.hooks_dir (the push rules hooks)")
        proc = await asyncio.create_subprocess_exec(
            *_git_argv(svc, repo_path, config, advertise=False),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=_service_env(svc, git_protocol, env_extra, config),
        )
        return cls(proc, svc, config)

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    @property
    def stderr_tail(self) -> str:
        """The end of git's stderr, for logs (never sent to the client)."""
        return self._stderr.decode("utf-8", "replace")

    async def write_body(self, body: AsyncIterator[bytes], *, max_bytes: int | None = None) -> None:
        """Stream ``body`` into git's stdin, then close it.

        Past ``max_bytes`` (default: the configured limit) it raises ``PushTooLarge``, recorded in
        ``failure`` before git's stdin is closed (so that a caller who has not answered yet can
        still answer 413). If git stops reading (it refused the request and says why on stdout),
        the rest of the body is read and dropped, within the limit, so that the client, still
        sending, gets to read that answer.
        """
        limit = self._config.max_request_bytes if max_bytes is None else max_bytes
        git_reading = True
        try:
            async for chunk in body:
                self.bytes_in += len(chunk)
                if self.bytes_in > limit:
                    raise PushTooLarge(limit)
                if not git_reading:
                    continue
                try:
                    self._stdin.write(chunk)
                    await self._stdin.drain()
                except (BrokenPipeError, ConnectionResetError):
                    git_reading = False
            self.fed = git_reading
        except BaseException as exc:
            self.failure = exc
            raise
        finally:
            self._stdin.close()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                await self._stdin.wait_closed()

    async def feed(self, body: AsyncIterator[bytes], *, max_bytes: int | None = None) -> None:
        """Consume the whole request body into git before any response is sent; git's early
        output is kept in a spooled temporary file (memory up to 1 MiB, then disk)."""
        # Closed by output() or aclose(): it outlives this method.
        spool: tempfile.SpooledTemporaryFile[bytes] = tempfile.SpooledTemporaryFile(  # noqa: SIM115
            max_size=SPOOL_MEMORY
        )
        self._spool = spool

        async def collect() -> None:
            while chunk := await self._stdout.read(CHUNK_SIZE):
                spool.write(chunk)
            self._stdout_eof = True

        reader = asyncio.ensure_future(collect())
        try:
            try:
                await self.write_body(body, max_bytes=max_bytes)
            finally:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
        except BaseException:
            await self.aclose()
            raise

    async def output(self) -> AsyncGenerator[bytes, None]:
        """git's stdout (after ``feed``, starting with what was spooled). The process is
        stopped and reaped when the iteration ends, whichever way it ends."""
        try:
            if self._spool is not None:
                self._spool.seek(0)
                while chunk := self._spool.read(CHUNK_SIZE):
                    yield chunk
                self._spool.close()
                self._spool = None
            if not self._stdout_eof:
                while chunk := await self._stdout.read(CHUNK_SIZE):
                    yield chunk
                self._stdout_eof = True
            await self._proc.wait()
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Stop (if still running) and reap git; idempotent.

        receive-pack is never killed first: its stdin is closed and it gets time to finish on
        its own (``finish_grace`` seconds if it got the whole body, to apply the ref updates;
        ``abort_grace`` otherwise, to notice the truncated pack and drop its quarantine) while
        its output is discarded. Only then, or at once for upload-pack, which writes nothing,
        it is terminated.
        """
        if self._closed:
            return
        self._closed = True
        if not self._stdin.is_closing():
            self._stdin.close()
        try:
            if self._proc.returncode is None and self.service == RECEIVE_PACK:
                grace = self._config.finish_grace if self.fed else self._config.abort_grace
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(grace):
                        await self._discard_stdout_until_exit()
        finally:
            await terminate_process(self._proc)
        with contextlib.suppress(asyncio.CancelledError, Exception):
            async with asyncio.timeout(5):
                await self._stderr_task
        if self._spool is not None:
            self._spool.close()
            self._spool = None

    async def _discard_stdout_until_exit(self) -> None:
        if not self._stdout_eof:
            while await self._stdout.read(CHUNK_SIZE):
                pass
        await self._proc.wait()


async def run_service(
    service: str,
    repo_path: Path,
    request_body: AsyncIterator[bytes],
    git_protocol: str | None = None,
    env_extra: Mapping[str, str] | None = None,
    *,
    config: GitHttpConfig = DEFAULT_CONFIG,
    max_bytes: int | None = None,
) -> AsyncIterator[bytes]:
    """The response body of ``POST <service>``: ``request_body`` (already decoded, see
    ``decode_request_body``) is fed to git by a background task while git's output streams.

    Raises ``PushTooLarge`` (after stopping git) when the body passes the limit. Closing the
    iterator early (client gone) stops and reaps git.
    """
    proc = await GitServiceProcess.start(
        service, repo_path, git_protocol=git_protocol, env_extra=env_extra, config=config
    )
    feeder = asyncio.ensure_future(proc.write_body(request_body, max_bytes=max_bytes))
    try:
        async with contextlib.aclosing(proc.output()) as output:
            async for chunk in output:
                if proc.failure is not None:
                    break
                yield chunk
        await feeder
    finally:
        if not feeder.done():
            feeder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(feeder, return_exceptions=True)
        await proc.aclose()
