"""The real Claude Code CLI on the host, behind the `Sandbox.spawn`/`exec` shape the runtime uses,
for tests of the claude-code runtime that need no Docker: the CLI binary installed on this machine
(`CLAUDE_CLI`, by default the pinned binary in the agents cache that `forgehand sandbox build --agents`
fills, installed there with npm when missing), a workspace and a HOME in temporary directories,
model traffic to a `ScriptedAnthropic` on 127.0.0.1 (the container's Unix socket base URL is
swapped for the server's TCP one). The docker tests run the same runtime in the agents image."""

import asyncio
import contextlib
import functools
import os
import shutil
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from sandbox import ExecResult
from sandbox.images.agents_image import AGENT_PINS, install_agent
from sandbox.process import DEFAULT_LINE_CAP, LineSplitter
from sandbox.spec import HOME_DIR
from tasks.core.policy import ApprovedCall, GateContext, GateDecision
from tasks.core.states import RunKind
from tasks.run.backchannel import Backchannel
from tasks.run.runtimes.base import RunContext, RuntimeLimits

HOST_CLI = os.environ.get("CLAUDE_CLI", "")

HookHandler = Callable[[str, str, dict[str, Any]], Awaitable[dict[str, Any]]]


@functools.cache
def host_cli() -> str:
    if not HOST_CLI:
        # The same pinned binary the agents image carries (cached by `make test`'s image step).
        return str(install_agent("claude-code", AGENT_PINS["claude-code"]))
    if not Path(HOST_CLI).is_file():
        raise RuntimeError(f"the Claude Code CLI is not at {HOST_CLI} (CLAUDE_CLI)")
    return HOST_CLI


class Provider(msgspec.Struct, kw_only=True):
    anthropic_model: str = "claude-test"
    openai_model: str = ""
    model_key: str = "instance"
    allow_web_search: bool = False


class StubChannel:
    """The run channel's face the runtime sees (token, socket path, provider, hook handler)."""

    container_dir = "/run/forgehand"
    container_socket = "/run/forgehand/gateway.sock"

    def __init__(self, token: str = "fhr_" + "t" * 43) -> None:
        self.token = token
        self.provider = Provider()
        self.hook: HookHandler | None = None

    def set_hook_handler(self, fn: HookHandler) -> None:
        self.hook = fn


class HostProcess:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self._err = bytearray()
        self._err_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        assert self.proc.stderr is not None
        while chunk := await self.proc.stderr.read(65536):
            self._err = (self._err + chunk)[-65536:]

    @property
    def stderr_tail(self) -> str:
        return self._err.decode("utf-8", "replace")

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    async def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()

    async def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    async def stdout_batches(self) -> AsyncGenerator[list[bytes], None]:
        """As `SandboxProcess.stdout_batches`: the lines each read of the pipe completed."""
        assert self.proc.stdout is not None
        splitter = LineSplitter(DEFAULT_LINE_CAP)
        while chunk := await self.proc.stdout.read(1 << 16):
            if lines := splitter.feed(chunk):
                yield lines
        if (last := splitter.flush()) is not None:
            yield [last]

    async def stdout_lines(self) -> AsyncIterator[bytes]:
        async with contextlib.aclosing(self.stdout_batches()) as batches:
            async for batch in batches:
                for line in batch:
                    yield line

    async def wait(self) -> int | None:
        return await self.proc.wait()

    async def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        await self.proc.wait()


class HostSandbox:
    """Maps the container's paths onto temporary directories: /workspace, $HOME, the CLI."""

    def __init__(self, root: Path, base_url: str, *, rewrite: Mapping[str, str] | None = None) -> None:
        self.rewrite = dict(rewrite or {})  # in argv: a container address -> its stand-in on the host
        self.workspace = root / "workspace"
        self.home = root / "home"
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        self.base_url = base_url
        self.remaining = 600.0
        self.spawned: list[HostProcess] = []
        self.env_seen: list[dict[str, str]] = []

    def fresh_home(self) -> None:
        """A new container: HOME is an empty tmpfs again."""
        shutil.rmtree(self.home)
        self.home.mkdir()

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        out = {"PATH": "/usr/bin:/bin", "HOME": str(self.home), "LANG": "C.UTF-8", **(env or {})}
        self.env_seen.append(dict(out))
        out["HOME"] = str(self.home)
        if "ANTHROPIC_UNIX_SOCKET" in out:  # the gateway socket in the container; a TCP server here
            del out["ANTHROPIC_UNIX_SOCKET"]
            out["ANTHROPIC_BASE_URL"] = self.base_url
        return out

    def _argv(self, argv: Sequence[str]) -> list[str]:
        out = [host_cli() if a == "/usr/local/bin/claude" else a for a in argv]
        for old, new in self.rewrite.items():
            out = [a.replace(old, new) for a in out]
        return [str(self.home) if a == HOME_DIR else a for a in out]

    async def spawn(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str = "/workspace",
                    timeout: float | None = None) -> HostProcess:  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            *self._argv(argv),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self._env(env),
            cwd=self.workspace,
            limit=8 << 20,
        )
        p = HostProcess(proc)
        self.spawned.append(p)
        return p

    async def exec(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None,
                   output_cap: int | None = None, env: Mapping[str, str] | None = None) -> ExecResult:  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            *self._argv(argv),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self._env(env),
            cwd=self.workspace,
        )
        out, err = await proc.communicate(stdin)
        cap = len(out) if output_cap is None else output_cap
        return ExecResult(
            exit_code=proc.returncode,
            timed_out=False,
            oom_killed=False,
            truncated_bytes=max(0, len(out) - cap),
            duration=0.0,
            stdout=out[:cap],
            stderr=err,
        )


class ScriptedGate:
    """A policy gate deciding `pre_tool_use` by tool name (`decisions`, default allow) and recording
    every dispatch: (event, tool_use_id or summary, tool_name)."""

    def __init__(self, decisions: dict[str, GateDecision] | None = None, stop: GateDecision | None = None) -> None:
        self.decisions = decisions or {}
        self.stop_decision = stop or GateDecision()
        self.calls: list[tuple[str, str, str]] = []
        self.inputs: list[Any] = []

    async def session_start(self, ctx: Any, **kw: Any) -> GateDecision:
        return GateDecision()

    async def user_prompt_submit(self, ctx: Any, **kw: Any) -> GateDecision:
        return GateDecision()

    async def pre_tool_use(self, ctx: Any, *, tool_use_id: str, tool_name: str, tool_input: Any) -> GateDecision:
        self.calls.append(("pre_tool_use", tool_use_id, tool_name))
        self.inputs.append(tool_input)
        return self.decisions.get(tool_name, GateDecision())

    async def post_tool_use(self, ctx: Any, *, tool_use_id: str, tool_name: str, **kw: Any) -> GateDecision:
        self.calls.append(("post_tool_use", tool_use_id, tool_name))
        return GateDecision()

    async def stop(self, ctx: Any, *, summary: str, **kw: Any) -> GateDecision:
        self.calls.append(("stop", summary, ""))
        return self.stop_decision

    async def pre_merge(self, ctx: Any, **kw: Any) -> GateDecision:
        return GateDecision()

    def events(self, event: str) -> list[tuple[str, str, str]]:
        return [c for c in self.calls if c[0] == event]


class Recorder:
    """The runtime's `emit`: every (kind, payload) in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    async def __call__(self, kind: str, payload: Any) -> None:
        self.events.append((kind, payload))

    def of(self, kind: str) -> list[Any]:
        return [p for k, p in self.events if k == kind]


def host_context(
    sandbox: HostSandbox,
    gate: ScriptedGate,
    emit: Recorder,
    *,
    prompt: str = "do the thing",
    kind: RunKind = RunKind.START,
    channel: StubChannel | None = None,
    state_dir: Path | None = None,
    session: str = "",
    approval: ApprovedCall | None = None,
    turn_limit: int = 20,
    backchannel: Backchannel | None = None,
) -> RunContext:
    return RunContext(
        sandbox=sandbox,  # type: ignore[arg-type]
        kind=kind,
        goal=prompt,
        prompt=prompt,
        command=None,
        conversation=[],
        limits=RuntimeLimits(turn_limit=turn_limit),
        gate=gate,  # type: ignore[arg-type]
        gate_ctx=GateContext(
            repository="ana/demo", repo_uuid="r", task_uuid="t", task_number=1, task_url="u", run_uuid="run-1"
        ),
        emit=emit,
        channel=channel or StubChannel(),
        state_dir=state_dir,
        agent_session_id=session,
        approval=approval,
        backchannel=backchannel,
    )
