"""One push over smart HTTP, with the push rules enforced twice.

1. Before git runs: ``PushSession.open`` reads only the command list off the front of the
   request body, parses it and checks every rule that does not need the pushed objects
   (archived, ref names and namespaces, ``agent/*``, deletion of protected branches, and the
   force-push test when the new commit is already in the repository). A refusal is answered in
   the git protocol (``rejection()``), so the client prints, per ref,
   ``! [remote rejected] main -> main (protected branch: deletion refused)``; git never runs.
2. While git runs: receive-pack gets the same ``PushContext`` (``FORGEHAND_PUSH_CONTEXT``) and
   the server-owned pre-receive hook re-checks everything once the pack sits in quarantine;
   that is where a force-push with new commits is caught. A refusal there leaves the repository
   untouched; the client sees our reasons as ``remote:`` lines.

Accepted updates are written by the post-receive hook to a per-push file; ``accepted()`` reads
them back (the refs before and after, for the ``repo.pushed`` event).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pygit2

from forge.git.bare import open_repo
from forge.git.errors import PushTooLarge
from forge.git.hooks import ENV_CONTEXT, ENV_PUSH_LOG
from forge.git.pktline import (
    DEFAULT_MAX_COMMAND_BYTES,
    parse_receive_pack_commands,
    prepend,
    read_command_section,
    rejection_response,
)
from forge.git.refrules import (
    PushContext,
    RefUpdate,
    Refusal,
    check_push,
    encode_context,
    needs_fast_forward_check,
)
from forge.git.service_process import GitServiceProcess, run_service
from forge.git.smart_http import DEFAULT_CONFIG, RECEIVE_PACK, GitHttpConfig


def known_fast_forwards(repo: pygit2.Repository, updates: list[RefUpdate], ctx: PushContext) -> dict[str, bool | None]:
    """For updates that need it, whether they fast-forward, when both commits are already in
    the repository (``None`` otherwise: the hook decides once the objects arrive)."""
    result: dict[str, bool | None] = {}
    for update in updates:
        if not needs_fast_forward_check(update, ctx):
            continue
        if update.old not in repo or update.new not in repo:
            result[update.ref] = None
            continue
        try:
            result[update.ref] = update.old == update.new or repo.descendant_of(update.new, update.old)
        except (pygit2.GitError, ValueError, KeyError):
            result[update.ref] = False
    return result


def _fast_forwards_at(repo_path: Path, updates: list[RefUpdate], ctx: PushContext) -> dict[str, bool | None]:
    repo = open_repo(repo_path)
    try:
        return known_fast_forwards(repo, updates, ctx)
    finally:
        repo.free()


class PushSession:
    """A ``POST git-receive-pack`` in progress. Use ``open``, then either ``rejection()`` (and
    ``discard_rest()``), or ``stream()`` / ``start()``; then ``accepted()``; then ``close()``."""

    def __init__(
        self,
        repo_path: Path,
        ctx: PushContext,
        section: bytes,
        rest: AsyncIterator[bytes],
        updates: list[RefUpdate],
        capabilities: list[str],
        refusals: list[Refusal],
        config: GitHttpConfig,
        git_protocol: str | None,
    ) -> None:
        self.repo_path = repo_path
        self.ctx = ctx
        self.updates = updates
        self.capabilities = capabilities
        self.refusals = refusals
        self._section = section
        self._rest = rest
        self._config = config
        self._git_protocol = git_protocol
        self._tmpdir = Path(tempfile.mkdtemp(prefix="forgehand-push-"))
        self.log_path = self._tmpdir / "accepted.jsonl"
        self.process: GitServiceProcess | None = None

    @classmethod
    async def open(
        cls,
        repo_path: Path,
        body: AsyncIterator[bytes],
        ctx: PushContext,
        *,
        config: GitHttpConfig = DEFAULT_CONFIG,
        git_protocol: str | None = None,
        max_command_bytes: int = DEFAULT_MAX_COMMAND_BYTES,
    ) -> PushSession:
        """Read and check the command list of a push. ``body`` is the decoded request body
        (``smart_http.decode_request_body``). Raises ``GitProtocolError`` on a malformed one."""
        section, rest = await read_command_section(body, max_bytes=max_command_bytes)
        updates, capabilities = parse_receive_pack_commands(section)
        fast_forwards = await asyncio.to_thread(_fast_forwards_at, repo_path, updates, ctx)
        refusals = check_push(updates, ctx, fast_forwards)
        return cls(repo_path, ctx, section, rest, updates, capabilities, refusals, config, git_protocol)

    @property
    def refused(self) -> bool:
        return bool(self.refusals)

    def rejection(self) -> bytes:
        """The complete response body refusing this push (content type
        ``application/x-git-receive-pack-result``)."""
        reasons = {r.ref: r.reason for r in self.refusals}
        message = "\n".join(f"forgehand: refusing {r.ref}: {r.reason}" for r in self.refusals)
        return rejection_response(self.updates, reasons, self.capabilities, message=message)

    async def discard_rest(self) -> int:
        """Read and drop the rest of the request body, so that the client, still sending its
        pack, reads the refusal instead of a broken pipe. ``PushTooLarge`` past the size limit."""
        limit = self._config.max_request_bytes
        total = len(self._section)
        async for chunk in self._rest:
            total += len(chunk)
            if total > limit:
                raise PushTooLarge(limit)
        return total

    def env(self) -> dict[str, str]:
        return {ENV_CONTEXT: encode_context(self.ctx), ENV_PUSH_LOG: str(self.log_path)}

    def _body(self) -> AsyncIterator[bytes]:
        return prepend(self._section, self._rest)

    def stream(self) -> AsyncIterator[bytes]:
        """Run receive-pack, feeding the body concurrently (``service_process.run_service``)."""
        self._check_not_refused()
        return run_service(
            RECEIVE_PACK,
            self.repo_path,
            self._body(),
            self._git_protocol,
            self.env(),
            config=self._config,
        )

    async def start(self) -> GitServiceProcess:
        """Run receive-pack and feed it the whole body now; stream ``.output()`` afterwards."""
        self._check_not_refused()
        self.process = await GitServiceProcess.start(
            RECEIVE_PACK,
            self.repo_path,
            git_protocol=self._git_protocol,
            env_extra=self.env(),
            config=self._config,
        )
        await self.process.feed(self._body())
        return self.process

    def _check_not_refused(self) -> None:
        if self.refusals:
            raise RuntimeError("this push was refused: send rejection() instead of running git")

    def accepted(self) -> list[RefUpdate]:
        """The ref updates git applied (old and new ids), once the response is complete."""
        try:
            data = self.log_path.read_bytes()
        except FileNotFoundError:
            return []
        decoder = msgspec.json.Decoder(RefUpdate)
        updates = []
        for line in data.splitlines():
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                updates.append(decoder.decode(line))
        return updates

    def close(self) -> None:
        shutil.rmtree(self._tmpdir, ignore_errors=True)

    async def __aenter__(self) -> PushSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.process is not None:
            await self.process.aclose()
        self.close()
