"""Running one command in a sandbox: the exec wrapper, the output pump, timeouts, OOM detection.

Output is read by a dedicated thread from Docker's multiplexed exec stream and handed to the event
loop through a bounded channel: when the consumer is slow the thread stops reading, the socket and
then the process's pipe fill up, and the command blocks. Nothing is dropped silently; bytes past the
output cap are read, counted and discarded (so the host's memory stays flat), and reported as
`truncated_bytes`.
"""

import asyncio
import contextlib
import socket
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from .errors import SpecRefused
from .protocols import StartedSandbox
from .pump import Channel, End, OutputChunk, Pump, StdinWriter, raw_socket

# A shell function (builtins only: during a fork bomb there is no pid to spare for `ps` or a
# subshell) that kills a process and everything it started. It stops (so nothing forks any more)
# every process whose parent, process group or session is already in the set, until a full pass over
# /proc finds nothing new, then SIGKILLs the lot. `$2` is a pid to spare (the caller itself).
_REAP_FN = """\
forgehand_reap() {
  found=" $1 "
  changed=1
  while [ "$changed" = 1 ]; do
    changed=0
    for f in /proc/[0-9]*/stat; do
      read -r line < "$f" 2>/dev/null || continue
      pid=${line%% *}
      case "$found" in *" $pid "*) continue ;; esac
      set -f
      set -- "$1" "$2" ${line##*) }
      set +f
      case "$found" in
        *" $4 "*|*" $5 "*|*" $6 "*)
          kill -STOP "$pid" 2>/dev/null
          found="$found$pid "
          changed=1 ;;
      esac
    done
  done
  for pid in $found; do [ "$pid" = "$2" ] || kill -KILL "$pid" 2>/dev/null; done
}
"""

# Runs in the container as `sh -c WRAPPER forgehand-exec LIMIT KEEP_BG ARGV...`; the command itself
# is argv (never a shell string built from input). The wrapper reports its pid on stderr before
# anything else (the host needs it to kill the command; docker exec makes it a session leader),
# runs the command under coreutils `timeout` as a second, in-container line of defence (it fires a
# second after the host's deadline and still works when the host's kill cannot start: a fork bomb
# leaves no pid for a killer exec), and when the command exits it kills whatever the command left
# running in the background, unless asked to keep it.
WRAPPER = (
    _REAP_FN
    + """\
printf '\\036forgehand-pid:%s\\n' "$$" >&2
t=$1; keep=$2; shift 2
if [ "$t" != 0 ] && command -v timeout >/dev/null 2>&1; then
  timeout -k 2 "$t" "$@"
else
  "$@"
fi
rc=$?
[ "$keep" = 1 ] || forgehand_reap "$$" "$$"
exit "$rc"
"""
)

# Kills a running command from outside (host timeout, or the consumer went away): everything in the
# wrapper's session and process tree, the wrapper included.
KILLER = (
    _REAP_FN
    + """\
kill -STOP -- "-$1" 2>/dev/null
forgehand_reap "$1" ""
kill -KILL -- "-$1" 2>/dev/null
exit 0
"""
)

# Reads the memory cgroup's OOM-kill counter (cgroup v2 first, then v1). Builtins and cat only.
OOM_COUNTER = """\
for f in /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control; do
  if [ -r "$f" ]; then
    while read -r k v; do
      if [ "$k" = oom_kill ]; then echo "$v"; exit 0; fi
    done < "$f"
  fi
done
exit 3
"""


class ExecResult(msgspec.Struct, frozen=True, kw_only=True):
    exit_code: int | None  # None when the command could not be reaped (it outlived every kill)
    timed_out: bool
    oom_killed: bool
    truncated_bytes: int  # output past the cap: read, counted, discarded
    duration: float  # seconds, from exec start to the end of its output
    stdout: bytes = b""  # filled by Sandbox.exec; the streaming form leaves these empty
    stderr: bytes = b""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.oom_killed


def validate_argv(argv: Sequence[str]) -> list[str]:
    if isinstance(argv, str | bytes) or not argv:
        raise SpecRefused("argv must be a non-empty list of strings (never a shell string)")
    out = list(argv)
    for arg in out:
        if not isinstance(arg, str) or "\x00" in arg:
            raise SpecRefused("argv items must be strings without NUL")
    return out


def validate_exec_env(env: Mapping[str, str] | None) -> list[str] | None:
    if not env:
        return None
    items = []
    for key, value in env.items():
        if not key or "=" in key or "\x00" in key or "\x00" in value:
            raise SpecRefused(f"bad environment entry {key!r}")
        items.append(f"{key}={value}")
    return items


class ExecStream:
    """One running command. Iterate for `OutputChunk`s; then `result` (or `await wait()`).

    Use it as `async with sandbox.stream(argv) as s: async for chunk in s: ...`; leaving the block
    early kills the command. Up to `queue_chunks` chunks wait for the consumer (each at most one
    Docker frame, in practice 32 KiB) before the command is slowed down.
    """

    def __init__(
        self,
        sandbox: StartedSandbox,
        argv: list[str],
        *,
        env: list[str] | None,
        cwd: str,
        stdin: bytes | None,
        timeout: float,
        output_cap: int,
        queue_chunks: int = 16,
        kill_grace: float = 5.0,
        keep_background: bool = False,
    ) -> None:
        self._keep_background = keep_background
        self._sb = sandbox
        self._argv = argv
        self._env = env
        self._cwd = cwd
        self._stdin = stdin
        self._timeout = timeout
        self._cap = output_cap
        self._queue_chunks = queue_chunks
        self._kill_grace = kill_grace
        self._started = False
        self._done = False
        self._result: ExecResult | None = None
        self._exec_id = ""
        self._pump: Pump | None = None
        self._sock: Any = None
        self._watchdog: asyncio.Task[None] | None = None
        self._timed_out = False
        self._t0 = 0.0
        self._t_end: float | None = None
        self._channel: Channel | None = None

    async def __aenter__(self) -> "ExecStream":
        await self._begin()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __aiter__(self) -> "ExecStream":
        return self

    async def __anext__(self) -> OutputChunk:
        if self._done:
            raise StopAsyncIteration
        await self._begin()
        assert self._channel is not None
        item = await self._channel.get()
        if isinstance(item, End):
            self._t_end = time.monotonic()
            await self._finish(item)
            raise StopAsyncIteration
        return item

    @property
    def result(self) -> ExecResult:
        if self._result is None:
            raise RuntimeError("the command has not finished; iterate to the end or await wait()")
        return self._result

    async def wait(self) -> ExecResult:
        """Discard the rest of the output and return the result."""
        async for _ in self:
            pass
        return self.result

    async def aclose(self) -> None:
        """Kill the command if it is still running and release everything."""
        if self._done or not self._started:
            self._done = True
            return
        self._done = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        exit_code = await self._exit_code(wait=False)
        if exit_code is None:  # still running (or unknown): the consumer went away, so it goes too
            await self._kill()
        if self._pump is not None:
            self._pump.cancel.set()
        if self._channel is not None:
            self._channel.abandoned.set()
        self._close_socket()
        self._result = ExecResult(
            exit_code=exit_code,
            timed_out=self._timed_out,
            oom_killed=False,
            truncated_bytes=self._pump.truncated if self._pump else 0,
            duration=time.monotonic() - self._t0,
        )

    async def _begin(self) -> None:
        if self._started:
            return
        self._started = True
        self._t0 = time.monotonic()
        self._exec_id, self._sock = await open_exec(
            self._sb,
            wrapped(self._argv, self._timeout, keep_background=self._keep_background),
            env=self._env,
            cwd=self._cwd,
            stdin=self._stdin is not None,
        )
        loop = asyncio.get_running_loop()
        self._channel = Channel(loop, self._queue_chunks)
        self._pump = Pump(self._sock, self._channel, self._cap)
        self._pump.take_prebuffered()
        # A stream dropped without aclose() must not leave its threads waiting for a reader.
        weakref.finalize(self, self._channel.abandoned.set)
        weakref.finalize(self, self._pump.cancel.set)
        self._pump.thread.start()
        if self._stdin is not None:
            StdinWriter(self._sock, self._stdin, self._pump.cancel).thread.start()
        self._watchdog = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        await asyncio.sleep(max(0.0, self._t0 + self._timeout - time.monotonic()))
        self._timed_out = True
        await self._kill()
        # Give the output a moment to end after the kill; then stop reading whatever is left
        # (a process that slipped out of the kill and still holds the pipe).
        await asyncio.sleep(self._kill_grace)
        if self._pump is not None:
            self._pump.cancel.set()
        self._close_socket()

    async def _kill(self) -> None:
        await kill_exec(self._sb, self._pump)

    def _close_socket(self) -> None:
        close_exec_socket(self._sock)

    async def _finish(self, end: End) -> None:
        self._done = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
        self._close_socket()
        pump = self._pump
        assert pump is not None
        if end.error is not None and not self._timed_out:
            raise end.error
        exit_code = await self._exit_code()
        oom = False
        if exit_code in (137, None) or end.error is not None:
            oom = await self._sb.oom_happened()
        t_end = self._t_end if self._t_end is not None else time.monotonic()
        # Killed because the whole sandbox reached its wall clock (its idle process ended) is a
        # timeout too, even if the container went down a moment before our own timer fired.
        if exit_code in (137, None) and self._sb.remaining < 1.0 and not oom:
            self._timed_out = True
        self._result = ExecResult(
            exit_code=exit_code,
            timed_out=self._timed_out,
            oom_killed=oom,
            truncated_bytes=pump.truncated,
            duration=t_end - self._t0,
        )

    async def _exit_code(self, *, wait: bool = True) -> int | None:
        return await exec_exit_code(self._sb, self._exec_id, wait=wait, give_up=lambda: self._timed_out)


# The pieces below are shared by ExecStream and the interactive SandboxProcess (process.py).


def wrapped(argv: list[str], timeout: float, *, keep_background: bool = False) -> list[str]:
    """The exec command line: argv under WRAPPER, whose own timeout fires a second after the host's."""
    inner = f"{timeout + 1:.3f}"
    return ["/bin/sh", "-c", WRAPPER, "forgehand-exec", inner, "1" if keep_background else "0", *argv]


async def open_exec(
    sb: StartedSandbox, cmd: list[str], *, env: list[str] | None, cwd: str, stdin: bool
) -> tuple[str, Any]:
    """Create and start an exec as the sandbox user; returns its id and the hijacked socket."""
    exec_id: str = await sb.engine_call(
        lambda c: c.api.exec_create(
            sb.id,
            cmd,
            stdout=True,
            stderr=True,
            stdin=stdin,
            tty=False,
            user=sb.spec.user,
            environment=env,
            workdir=cwd,
        )["Id"],
        container=True,
    )
    sock = await sb.engine_call(lambda c: c.api.exec_start(exec_id, socket=True, tty=False), container=True)
    return exec_id, sock


async def kill_exec(sb: StartedSandbox, pump: Pump | None) -> None:
    """Kill a wrapped command and everything it started (its session and process tree)."""
    # The pid marker is the wrapper's first write; give it a moment if the kill came very early.
    for _ in range(10):
        if pump is None or pump.pid is not None:
            break
        await asyncio.sleep(0.05)
    if pump is None or pump.pid is None:
        return
    with contextlib.suppress(Exception):
        await sb.run_quiet(["/bin/sh", "-c", KILLER, "forgehand-kill", str(pump.pid)], timeout=10)


def close_exec_socket(sock: Any) -> None:
    if sock is not None:
        raw = raw_socket(sock)  # None: the pump thread closed the wrapper already
        if raw is not None:
            with contextlib.suppress(OSError):
                raw.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            sock.close()


async def exec_exit_code(
    sb: StartedSandbox, exec_id: str, *, wait: bool = True, give_up: Callable[[], bool] = lambda: False
) -> int | None:
    """The exec's exit code, None while it runs (or when the engine no longer knows it)."""
    # The output can end a moment before the engine has recorded the exit.
    for _ in range(40 if wait else 1):
        try:
            info = await sb.engine_call(lambda c: c.api.exec_inspect(exec_id))
        except Exception:
            return None
        if not info.get("Running"):
            code = info.get("ExitCode")
            return int(code) if code is not None else None
        if give_up():
            return None
        await asyncio.sleep(0.025)
    return None
