"""One POST of git smart HTTP (``git-upload-pack`` / ``git-receive-pack``): ``git
upload-pack|receive-pack --stateless-rpc`` with the request body streamed to its stdin and its
stdout streamed back: nothing is ever held whole in memory. The git process is stopped and reaped
however the exchange ends (client gone, limit passed, error).

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
import tempfile
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from pathlib import Path

from forge.git.errors import PushTooLarge
from forge.git.gitcmd import terminate_process
from forge.git.smart_http import (
    CHUNK_SIZE,
    DEFAULT_CONFIG,
    RECEIVE_PACK,
    SPOOL_MEMORY,
    GitHttpConfig,
    Service,
    check_repo,
    check_service,
    drain_tail,
    git_argv,
    service_env,
)


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
        self._stderr_task = asyncio.ensure_future(drain_tail(proc.stderr, self._stderr))
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
        check_repo(repo_path)
        if svc == RECEIVE_PACK and config.hooks_dir is None:
            raise ValueError("receive-pack needs GitHttpConfig.hooks_dir (the push rules hooks)")
        proc = await asyncio.create_subprocess_exec(
            *git_argv(svc, repo_path, config, advertise=False),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=service_env(svc, git_protocol, env_extra, config),
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
