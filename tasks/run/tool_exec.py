"""Running one call of a custom tool (a script an admin defined) in a fresh hardened sandbox of its own.

The agent's sandbox is never used: each call gets a brand-new container of the task's image with the
run's workspace at /workspace and the call's own directory (`tool_dir`, the sandbox's channel
directory) read-only at /run/forgehand, holding the script and the inputs as JSON. The command line
is fixed (`<interpreter> /run/forgehand/script`); the inputs reach the script only as the
environment's `FORGEHAND_ARG_<NAME>` values and the input file, never through a shell string. The
environment holds nothing secret: no token, no model key, no gateway socket, no back-channel.

Network is none unless the repository allows egress: then the call gets a proxy of its own on
`tool_dir/egress.sock` with the repository's rules, relayed to 127.0.0.1:3128 with HTTP(S)_PROXY
set, exactly as the run's sandbox (tasks/run/egress.py). The container carries the run's task and
run labels (a task stop or the reaper removes it) and `LABEL_TOOL_RUN`; it is removed when the call
ends, also when the awaiting coroutine is cancelled. The output (stdout and stderr as they came) is
redacted and kept to its last OUTPUT_TAIL_BYTES; `event_tail` cuts it for a transcript event.
"""

import asyncio
import contextlib
import re
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec
import structlog

from egress import Blocked
from sandbox import (
    CHANNEL_DIR,
    HOSTS_FILE_NAME,
    ExecResult,
    ExecStream,
    ImageMissing,
    Limits,
    MiB,
    Relay,
    Sandbox,
    SandboxEngine,
    SandboxError,
    SandboxSpec,
)
from tasks.core.egress_config import EgressPlan
from tasks.core.transcript import Kind, Payload

if TYPE_CHECKING:
    # Imported when a proxy opens (ToolEgress.open): tasks.run.egress imports the run's environment,
    # which imports the back-channel, which imports this module.
    from tasks.run.egress import RunEgress

log = structlog.get_logger("forgehand.tools")

INTERPRETERS: dict[str, list[str]] = {"sh": ["sh"], "bash": ["bash"], "python3": ["python3"], "node": ["node"]}
OUTPUT_TAIL_BYTES = 64 * 1024  # what is stored
EVENT_TAIL_BYTES = 4 * 1024  # what goes in transcript events
# Past this much output the tool is stopped ("output_limit"): the host reads every byte it prints.
OUTPUT_LIMIT_BYTES = 16 * MiB
# Not "forgehand.": the sandbox spec keeps that prefix for its own labels (no extra label may spoof one).
LABEL_TOOL_RUN = "org.forgehand.tool_run"
SCRIPT_PATH = f"{CHANNEL_DIR}/script"
INPUT_PATH = f"{CHANNEL_DIR}/input.json"
ARG_ENV_PREFIX = "FORGEHAND_ARG_"

# The sandbox's wall clock past the tool's timeout: its start, the kill and the removal fit in it.
_WALL_CLOCK_MARGIN_SECONDS = 120
# A guard past the command's own timeout (which kills it in the sandbox) for a stream that never ends.
_BACKSTOP_SECONDS = 30
# Output kept past the tail before redaction: a secret cut in two by the tail's start is still found.
_REDACT_MARGIN_BYTES = 4 * 1024
_ARG_NAME = re.compile(r"^FORGEHAND_ARG_[A-Za-z0-9_]{1,100}$")

# Clean-ups a second cancel left running: held here until they end (the loop keeps no reference).
_CLEANUPS: set["asyncio.Future[None]"] = set()

ToolFailure = Literal["exit_status", "timeout", "interpreter_missing", "output_limit", "sandbox", "oom"]


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """One call of a tool, its inputs validated and their environment computed by the caller."""

    tool_run_id: int
    tool_name: str
    version: int
    script: str
    interpreter: str  # a key of INTERPRETERS
    inputs: dict[str, Any]  # already validated
    arg_env: dict[str, str]  # FORGEHAND_ARG_<NAME> -> value (no NUL: an environment cannot hold one)
    timeout_seconds: int
    image: str  # the task's environment image (or the plain sandbox image)
    workspace: Path  # host directory bind-mounted read-write at /workspace
    instance: str
    task: str  # label values: the task's and the run's ids ("test" for a test run without a task)
    run: str
    labels: dict[str, str] = msgspec.field(default_factory=dict)  # more container labels (the worker's)


class ToolOutcome(msgspec.Struct, frozen=True, kw_only=True):
    exit_code: int | None
    output: str  # stdout and stderr as they came, redacted, the last OUTPUT_TAIL_BYTES ("[... N bytes cut ...]" first)
    timed_out: bool
    failure_reason: ToolFailure | None  # None on exit 0
    duration_ms: int  # from the call to its outcome: the sandbox's start and the script (not the removal)


@dataclass(frozen=True)
class ToolEgress:
    """The repository's egress for a tool call: its plan (`egress_config.plan`), and where the
    proxy's refusals go (the run's transcript `emit` and `blocked_notifier`)."""

    plan: EgressPlan
    emit: Callable[[Kind, Payload], Awaitable[None]]
    notify: Callable[[Blocked], Awaitable[None]]

    async def open(self, tool_dir: Path) -> "_Proxy":
        """A proxy on `tool_dir/egress.sock`, started (the path must stay under 108 bytes), with the
        relay and the variables the run's sandbox gets."""
        # Imported here, not above: tasks.run.egress imports the run's environment, which imports
        # the back-channel, which imports this module.
        from tasks.run.egress import RunEgress, proxy_env

        egress = RunEgress(self.plan, tool_dir, emit=self.emit, notify=self.notify, owns_dir=False)
        await egress.start()
        return _Proxy(egress=egress, relay=egress.relay, env=proxy_env())


@dataclass(frozen=True)
class _Proxy:
    egress: "RunEgress"
    relay: Relay
    env: dict[str, str]


class _Ran(msgspec.Struct, frozen=True, kw_only=True):
    """What the exec gave, before it becomes an outcome."""

    exit_code: int | None
    timed_out: bool
    oom: bool
    over_limit: bool


class OutputTail:
    """The last bytes of an output (with a margin for the redaction) and how many came in all."""

    def __init__(self, keep: int = OUTPUT_TAIL_BYTES + _REDACT_MARGIN_BYTES) -> None:
        self.keep = keep
        self.data = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.data += data
        self.total += len(data)
        if len(self.data) > self.keep:
            del self.data[: len(self.data) - self.keep]

    def text(self, redact: Callable[[str], str]) -> str:
        """Redacted, then cut to OUTPUT_TAIL_BYTES, counting what was cut before."""
        dropped = self.total - len(self.data)
        data = bytes(self.data)
        if dropped:
            skip = _partial_char(data)
            data, dropped = data[skip:], dropped + skip
        return _tail(redact(data.decode("utf-8", errors="replace")), OUTPUT_TAIL_BYTES, dropped)


def event_tail(text: str) -> str:
    """The last EVENT_TAIL_BYTES of an output, for a transcript event."""
    return _tail(text, EVENT_TAIL_BYTES)


def _tail(text: str, limit: int, cut: int = 0) -> str:
    data = text.encode("utf-8", errors="replace")
    if len(data) > limit:
        data = data[len(data) - limit :]
        skip = _partial_char(data)
        cut += len(text.encode("utf-8", errors="replace")) - len(data) + skip
        text = data[skip:].decode("utf-8", errors="replace")
    return f"[... {cut} bytes cut ...]\n{text}" if cut else text


def _partial_char(data: bytes) -> int:
    """How many UTF-8 continuation bytes start `data` (what is left of a character cut in two)."""
    n = 0
    while n < min(len(data), 3) and 0x80 <= data[n] < 0xC0:
        n += 1
    return n


async def execute_tool(
    engine: SandboxEngine,
    call: ToolCall,
    *,
    tool_dir: Path,
    redact: Callable[[str], str] = lambda s: s,
    egress: ToolEgress | None = None,
    limits: Limits | None = None,
) -> ToolOutcome:
    """Run `call` in a sandbox of its own and remove it, whatever happens (a cancel included).

    `tool_dir` is a fresh directory (made if missing) the call fills and removes at the end; the
    sandbox's /etc/hosts is the file `hosts` beside it (sandbox.SandboxSpec.hosts_file: written
    there when it is not, and left for the next call).
    `limits` are the run's (memory, CPU, pids...); the wall clock and the timeout come from the
    call. A call the caller should not have made (an unknown interpreter, an argument name outside
    FORGEHAND_ARG_, a NUL) raises ValueError before anything starts.
    """
    _check_call(call)
    t0 = time.monotonic()
    proxy: _Proxy | None = None
    sandbox: Sandbox | None = None
    try:
        await asyncio.to_thread(_write_files, tool_dir, call)
        if egress is not None:
            proxy = await egress.open(tool_dir)
        sandbox = await engine.start(_spec(call, tool_dir, proxy, limits))
        ran, tail = await _run(sandbox, call)
        if ran.exit_code == 127 and not ran.timed_out and not await _has_interpreter(sandbox, call):
            return _missing(call, tail, ran, redact, t0)
        return _outcome(ran, tail, call, redact, t0)
    except (SandboxError, OSError) as exc:
        return _no_sandbox(call, exc, t0, started=sandbox is not None)
    finally:
        await _clean_up(sandbox, proxy, tool_dir, call)


def _check_call(call: ToolCall) -> None:
    if call.interpreter not in INTERPRETERS:
        raise ValueError(f"unknown interpreter {call.interpreter!r}")
    if call.timeout_seconds <= 0:
        raise ValueError("timeout_seconds must be positive")
    for key, value in call.arg_env.items():
        if not _ARG_NAME.match(key):
            raise ValueError(f"argument variable {key!r} must be {ARG_ENV_PREFIX}<NAME>")
        if "\x00" in value:
            raise ValueError(f"argument variable {key} holds NUL")


def _write_files(tool_dir: Path, call: ToolCall) -> None:
    """The script and the inputs, readable by the sandbox user through the read-only mount."""
    tool_dir.mkdir(mode=0o755, parents=False, exist_ok=True)
    tool_dir.chmod(0o755)
    for name, data in (("script", call.script.encode()), ("input.json", msgspec.json.encode(call.inputs))):
        path = tool_dir / name
        path.write_bytes(data)
        path.chmod(0o644)


def _spec(call: ToolCall, tool_dir: Path, proxy: _Proxy | None, limits: Limits | None) -> SandboxSpec:
    """The hardened defaults, network none; with egress, only the proxy's relay and its variables."""
    timed = msgspec.structs.replace(
        limits or Limits(),
        wall_clock_seconds=call.timeout_seconds + _WALL_CLOCK_MARGIN_SECONDS,
        exec_timeout_seconds=float(call.timeout_seconds),
    )
    return SandboxSpec(
        image=call.image, workspace=call.workspace, instance=call.instance, task=call.task, run=call.run,
        env=proxy.env if proxy is not None else {}, limits=timed, channel_dir=tool_dir,
        relays=(proxy.relay,) if proxy is not None else (),
        extra_labels={**call.labels, LABEL_TOOL_RUN: str(call.tool_run_id)},
        hosts_file=tool_dir.parent / HOSTS_FILE_NAME,  # beside the call's directory, as visible to the engine
    )  # fmt: skip


def _exec_env(call: ToolCall) -> dict[str, str]:
    return {
        **call.arg_env,
        "FORGEHAND_TOOL_INPUT_FILE": INPUT_PATH,
        "FORGEHAND_TOOL_NAME": call.tool_name,
        "FORGEHAND_TOOL_VERSION": str(call.version),
    }


async def _run(sandbox: Sandbox, call: ToolCall) -> tuple[_Ran, OutputTail]:
    """The script to its end, its timeout or OUTPUT_LIMIT_BYTES of output (then it is killed)."""
    tail = OutputTail()
    over_limit = backstop = False
    stream = sandbox.stream(
        [*INTERPRETERS[call.interpreter], SCRIPT_PATH],
        env=_exec_env(call),
        timeout=call.timeout_seconds,
        output_cap=OUTPUT_LIMIT_BYTES,
    )
    try:
        async with asyncio.timeout(call.timeout_seconds + _BACKSTOP_SECONDS), stream:
            async for chunk in stream:
                tail.feed(chunk.data)
                if tail.total >= OUTPUT_LIMIT_BYTES:
                    over_limit = True
                    break  # leaving the stream kills the script
    except TimeoutError:
        backstop = True
    result = _result_of(stream)
    return _Ran(
        exit_code=result.exit_code if result is not None else None,
        timed_out=backstop or (result is not None and result.timed_out),
        oom=result is not None and result.oom_killed,
        over_limit=over_limit,
    ), tail


def _result_of(stream: ExecStream) -> ExecResult | None:
    with contextlib.suppress(RuntimeError):  # the backstop fired before the command had started
        return stream.result
    return None


async def _has_interpreter(sandbox: Sandbox, call: ToolCall) -> bool:
    """Exit 127 is "command not found", from the script or for the interpreter: ask the image."""
    name = INTERPRETERS[call.interpreter][0]
    try:
        code, _ = await sandbox.run_quiet(["/bin/sh", "-c", 'command -v "$1" >/dev/null', "forgehand-probe", name])
    except SandboxError:
        return True  # unknown: the exit status stands
    return code == 0


def _outcome(ran: _Ran, tail: OutputTail, call: ToolCall, redact: Callable[[str], str], t0: float) -> ToolOutcome:
    reason = _failure(ran)
    note = _note(reason, call)
    if note:
        start = "" if tail.data.endswith(b"\n") or not tail.data else "\n"
        tail.feed(f"{start}[forgehand: {note}]\n".encode())
    return ToolOutcome(
        exit_code=ran.exit_code,
        output=tail.text(redact),
        timed_out=ran.timed_out,
        failure_reason=reason,
        duration_ms=_ms_since(t0),
    )


def _failure(ran: _Ran) -> ToolFailure | None:
    if ran.over_limit:
        return "output_limit"
    if ran.timed_out:
        return "timeout"
    if ran.oom:
        return "oom"
    return None if ran.exit_code == 0 else "exit_status"


def _note(reason: ToolFailure | None, call: ToolCall) -> str:
    """A line for the agent when the tool was stopped (its exit status speaks for itself)."""
    if reason == "output_limit":
        return f"the tool was stopped after {OUTPUT_LIMIT_BYTES // MiB} MiB of output"
    if reason == "timeout":
        return f"the tool was stopped at its timeout of {call.timeout_seconds} s"
    if reason == "oom":
        return "the tool was stopped: it ran out of memory"
    return ""


def _missing(call: ToolCall, tail: OutputTail, ran: _Ran, redact: Callable[[str], str], t0: float) -> ToolOutcome:
    name = INTERPRETERS[call.interpreter][0]
    line = f"the image {call.image} has no {name} interpreter: the tool's script did not run\n"
    return ToolOutcome(
        exit_code=ran.exit_code,
        output=line + tail.text(redact),
        timed_out=False,
        failure_reason="interpreter_missing",
        duration_ms=_ms_since(t0),
    )


def _no_sandbox(call: ToolCall, exc: Exception, t0: float, *, started: bool) -> ToolOutcome:
    """The sandbox (or its proxy) could not start, or went away under the script (a task stop
    removed it): a short reason, the details in the log."""
    what = "failed" if started else "could not start"
    log.warning(f"a tool's sandbox {what}", tool=call.tool_name, tool_run=call.tool_run_id, error=str(exc))
    why = f"the image {call.image} is not on the engine" if isinstance(exc, ImageMissing) else type(exc).__name__
    return ToolOutcome(
        exit_code=None,
        output=f"the tool's sandbox {what} ({why})\n",
        timed_out=False,
        failure_reason="sandbox",
        duration_ms=_ms_since(t0),
    )


def _ms_since(t0: float) -> int:
    return int((time.monotonic() - t0) * 1000)


async def _clean_up(sandbox: Sandbox | None, proxy: _Proxy | None, tool_dir: Path, call: ToolCall) -> None:
    """Remove the container, close the proxy, delete `tool_dir`; shielded, so a cancel waits for it
    (a second cancel leaves it running to its end)."""
    cleanup = asyncio.ensure_future(_remove_all(sandbox, proxy, tool_dir, call))
    _CLEANUPS.add(cleanup)
    cleanup.add_done_callback(_CLEANUPS.discard)
    await asyncio.shield(cleanup)


async def _remove_all(sandbox: Sandbox | None, proxy: _Proxy | None, tool_dir: Path, call: ToolCall) -> None:
    if sandbox is not None:
        try:
            await sandbox.remove()
        except Exception:
            # Its wall clock ends it anyway, and the reaper removes it by its run's label.
            log.warning("a tool's sandbox was not removed", tool_run=call.tool_run_id, exc_info=True)
    if proxy is not None:
        try:
            await proxy.egress.close()
        except Exception:
            log.warning("a tool's egress proxy did not close", tool_run=call.tool_run_id, exc_info=True)
    await asyncio.to_thread(shutil.rmtree, tool_dir, True)
